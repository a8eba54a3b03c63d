"""Red team on the merged branch's deletion by ``git push`` (commits 3b23ce4, 5e7974a):
jobs/tree/remote_branch.py, jobs/review/gate.py ``_delete_branch``. Each test names the
rule it attacks. Real RQ worker (in process), git; the local GitHub and model.

Faults are injected at the moment the gate deletes the branch (after the merge) by
wrapping ``remote_branch.delete`` as the gate calls it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Status
from bot.io.github import failures
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.review import merged_branch as merge_gate
from jobs.runtime import Runtime
from jobs.tree import remote_branch
from tests.conftest import Web
from tests.e2e.review.test_merge_rules import status_comment
from tests.e2e.review.test_receipt import no_waiting, receipt_body, start
from tests.e2e.review.test_redteam_receipt_shown import scheduled_now
from tests.e2e.review.test_review_merge import FIX, fixing_agent, record, report
from tests.helpers import REPO

__all__ = ["no_waiting"]

BRANCH = "loop/issue-1"
KEY = LoopId(REPO, 1).key


def rest_deletes(github: GitHubServer) -> list[str]:
    return [p for meth, p, _ in github.requests if meth == "DELETE" and "/git/refs/" in p]


def kept(redis: Redis) -> list[dict[str, Any]]:
    return [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "branch_kept"]


class Spy:
    """Wraps ``remote_branch.delete`` as the gate calls it: ``before`` runs first (after
    the merge, before the deletion), and each call's arguments and answer are kept."""

    def __init__(self, before: Callable[[], object] | None = None) -> None:
        self.before = before
        self.calls: list[tuple[Any, ...]] = []
        self.answers: list[Any] = []
        self.real = remote_branch.delete

    def __call__(self, mirror: Path, url: str, token: str, branch: str, head: str) -> Any:
        self.calls.append((mirror, url, token, branch, head))
        if self.before is not None:
            self.before()
        answer = self.real(mirror, url, token, branch, head)
        self.answers.append(answer)
        return answer


def spy(monkeypatch: pytest.MonkeyPatch, before: Callable[[], object] | None = None) -> Spy:
    s = Spy(before)
    monkeypatch.setattr(merge_gate.remote_branch, "delete", s)
    return s


def a_person_pushes() -> Callable[[GitHubServer], str]:
    def push(github: GitHubServer) -> str:
        return gitrepo.seed(github.repo(REPO).path, BRANCH, {"theirs.py": "y = 1\n"}, "mine")

    return push


def merged_loop(
    github: GitHubServer,
    model: AnthropicServer,
    redis: Redis,
    drain: Any,
    **repo: Any,
) -> LoopRecord:
    """One loop fixed in a turn, approved and merged; ``repo``: the repository's settings
    set after the issue is labelled (a rule, auto-delete), before any job runs."""
    model.play(FIX, m.text("Fixed."), report())
    start(github)
    for name, value in repo.items():
        setattr(github.repo(REPO), name, value)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    return r


# -- Rule 1: a commit pushed after the merge is never deleted ---------------------------


def test_rule1_a_push_after_the_merge_keeps_the_branch(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    theirs: list[str] = []
    spy(monkeypatch, lambda: theirs.append(a_person_pushes()(github)))
    merged_loop(github, model, redis, drain)
    assert github.ref(REPO, BRANCH) == theirs[0]
    assert rest_deletes(github) == []
    (event,) = kept(redis)
    assert event["cause"] == "moved"
    assert "branch loop/issue-1 kept: a push after the merge moved it" in status_comment(github)


def test_rule1_git_out_of_reach_and_a_push_after_the_merge_the_rest_fallback_keeps_it(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A person pushes to the branch after the merge, then git is out of reach: the REST
    fallback's DELETE would take the branch whatever its head (no lease), so a read first
    shows it moved, and it is kept (broke before the fix: deleted by REST)."""
    theirs: list[str] = []

    def push_then_git_down() -> None:
        theirs.append(a_person_pushes()(github))
        github.git_down = True

    spy(monkeypatch, push_then_git_down)
    merged_loop(github, model, redis, drain)
    assert github.ref(REPO, BRANCH) == theirs[0], "the person's commit was deleted by REST"
    assert rest_deletes(github) == []
    assert [e["cause"] for e in kept(redis)] == ["moved"]


def test_rule1_a_failed_ls_remote_after_a_stale_lease_does_not_delete_by_rest(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lease held (the branch moved: "stale info"), then the ``ls-remote`` that asks
    whether the branch is gone fails (git out of reach a moment later). Broke before the
    fix: its GitError left remote_branch.delete, the gate took it for "git cannot reach
    GitHub" and sent the REST DELETE, which took the moved branch. Now GitHub answered
    the push, so nothing falls back: the branch is kept."""
    theirs: list[str] = []
    spy(monkeypatch, lambda: theirs.append(a_person_pushes()(github)))
    real_git = remote_branch.git

    def git(cwd: Path, *args: str, **kw: Any) -> Any:
        if "ls-remote" in args:
            github.git_down = True
        return real_git(cwd, *args, **kw)

    monkeypatch.setattr(remote_branch, "git", git)
    merged_loop(github, model, redis, drain)
    assert github.ref(REPO, BRANCH) == theirs[0], "the person's commit was deleted by REST"


# -- Rule 2: a rule forbidding deletion is kept to, and said --------------------------


def test_rule2_git_out_of_reach_and_a_rule_forbidding_deletion_is_said(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """git out of reach, so the REST DELETE (rule 3); the ruleset refuses it (422,
    "Repository rule violations found ... Cannot delete this branch"). The branch stays,
    and it is said (broke before the fix: the 422 was suppressed as if it were
    "Reference does not exist", and nothing said why the branch was still there)."""

    def git_down() -> None:
        github.git_down = True

    spy(monkeypatch, git_down)
    r = merged_loop(github, model, redis, drain, restrict_deletion=["refs/heads/loop/*"])
    assert github.ref(REPO, BRANCH) == r.merged_head  # the rule held
    assert len(rest_deletes(github)) == 1
    assert kept(redis), "the refused REST DELETE left no branch_kept event"
    assert "branch loop/issue-1 kept" in status_comment(github)


def test_rule2_a_refused_push_is_not_followed_by_rest_and_is_said_once_over_a_retry(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rule forbids the deletion, and the status comment's edit after the merge fails
    for one gate run's attempts: the gate's retry (``tidy_pending``) finishes the
    tidy-up. The rule holds, no REST DELETE; the receipt is shown once; the deletion is
    tried once and said once (broke before the fix: tried and said twice)."""
    s = spy(monkeypatch)
    times = failures.MAX_ATTEMPTS
    model.responder = fixing_agent(
        lambda: github.inject("PATCH", r"/issues/comments/\d+$", 502, times=times)
    )
    start(github)
    github.repo(REPO).restrict_deletion = ["refs/heads/loop/*"]
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None
    assert github.ref(REPO, BRANCH) == r.merged_head
    assert rest_deletes(github) == []
    body = receipt_body(github, r.pr_number)
    assert body is not None and body.count(f"Merged as `{r.merge_sha}`.") == 1
    assert len(s.calls) == 1  # the first run's; the retry knows it was tried
    lines = status_comment(github).count("branch loop/issue-1 kept")
    assert (len(kept(redis)), lines) == (1, 1), (len(kept(redis)), lines)


# -- Rule 3: git out of reach: one REST DELETE, and merged ---------------------------


def test_rule3_git_down_for_the_whole_gate_one_rest_delete(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def git_down() -> None:
        github.git_down = True

    spy(monkeypatch, git_down)
    merged_loop(github, model, redis, drain)
    assert github.ref(REPO, BRANCH) is None
    assert len(rest_deletes(github)) == 1
    assert not kept(redis)


def test_rule3_a_failing_push_that_is_not_the_network_still_ends_merged(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """git answers 401 (the credentials refused): the push says nothing of the ref, so
    it is taken as out of reach; the REST DELETE, once; merged."""
    s = spy(monkeypatch)
    real = s.real

    def bad_token(mirror: Path, url: str, token: str, branch: str, head: str) -> Any:
        return real(mirror, url, "ghs_not-a-token", branch, head)

    s.real = bad_token
    merged_loop(github, model, redis, drain)
    assert github.ref(REPO, BRANCH) is None
    assert len(rest_deletes(github)) == 1


# -- Rule 4: the token is nowhere ----------------------------------------------------


def _redis_text(redis: Redis) -> str:
    out: list[str] = []
    for key in redis.scan_iter("*"):
        kind = redis.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            out.append(repr(redis.get(key)))
        elif kind == "list":
            out.append(repr(redis.lrange(key, 0, -1)))
        elif kind == "hash":
            out.append(repr(redis.hgetall(key)))
        elif kind == "set":
            out.append(repr(redis.smembers(key)))
        elif kind == "zset":
            out.append(repr(redis.zrange(key, 0, -1)))
        elif kind == "stream":
            out.append(repr(redis.xrange(key)))
    return "\n".join(out)


def _files_with(root: Path, needle: bytes) -> list[Path]:
    found = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
                found.append(p)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("fault", ["refused", "git_down", "bad_token", "moved"])
def test_rule4_the_token_is_in_no_log_event_comment_or_file(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    rt: Runtime,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    fault: str,
) -> None:
    def before() -> None:
        if fault == "git_down":
            github.git_down = True
        elif fault == "moved":
            a_person_pushes()(github)

    s = spy(monkeypatch, before)
    if fault == "bad_token":
        real = s.real
        # A token GitHub refuses, but the one we look for: git's error may echo it.
        s.real = lambda mi, u, t, b, h: real(mi, u, t + "x", b, h)
    rule = {"restrict_deletion": ["refs/heads/loop/*"]} if fault == "refused" else {}
    merged_loop(github, model, redis, drain, **rule)
    assert s.calls
    token = s.calls[0][2]
    assert token and len(token) > 8
    out, err = capfd.readouterr()
    assert token not in out and token not in err
    assert token not in _redis_text(redis)
    assert token not in status_comment(github)
    for c in github.repo(REPO).comments.values():
        assert token not in c["body"]
    assert _files_with(Path(rt.settings.data_dir), token.encode()) == []


# -- Rule 5: the retry after a failure in tidying finishes ----------------------------


def test_rule5_the_retry_after_the_branch_went_sends_no_rest_delete(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The branch is deleted by push, then the receipt's edit fails for one gate run: the
    retry knows the deletion was done (``branch_tidied``), sends nothing for the branch,
    and shows the receipt once."""
    s = spy(monkeypatch)
    times = failures.MAX_ATTEMPTS
    model.responder = fixing_agent(
        lambda: github.inject("PATCH", r"/issues/comments/\d+$", 502, times=times)
    )
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None
    assert github.ref(REPO, BRANCH) is None
    assert rest_deletes(github) == []
    body = receipt_body(github, r.pr_number)
    assert body is not None and body.count(f"Merged as `{r.merge_sha}`.") == 1
    assert not kept(redis)
    assert len(s.calls) == 1, "the retry tried the deletion again"
    assert r.branch_tidied
    assert all(a.gone or a.outcome.value == "deleted" for a in s.answers)


def test_rule5_a_retry_after_the_token_could_not_be_had_finishes(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first deletion attempt raises something that is not a GitError (here: the
    token's mint failing, a RuntimeError from somewhere in between): the gate's retry
    finishes the tidying: branch gone, receipt shown once."""
    fails = [1]

    def boom() -> None:
        if fails:
            fails.pop()
            raise RuntimeError("injected: the tidying failed")

    spy(monkeypatch, boom)
    r = merged_loop(github, model, redis, drain)
    scheduled_now(redis)  # the gate's recheck (not a transient error: not retried inline)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None
    assert github.ref(REPO, BRANCH) is None
    body = receipt_body(github, r.pr_number)
    assert body is not None and body.count(f"Merged as `{r.merge_sha}`.") == 1


# -- Rule 6: "Automatically delete head branches": nothing from loopbot ---------------


def test_rule6_auto_delete_gets_no_push_and_no_rest(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = spy(monkeypatch)
    merged_loop(github, model, redis, drain, delete_branch_on_merge=True)
    assert s.calls == []
    assert rest_deletes(github) == []
    assert github.ref(REPO, BRANCH) is None


def test_rule6_auto_delete_with_a_rule_forbidding_it_keeps_the_branch_and_sends_nothing(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = spy(monkeypatch)
    r = merged_loop(
        github,
        model,
        redis,
        drain,
        delete_branch_on_merge=True,
        restrict_deletion=["refs/heads/loop/*"],
    )
    assert s.calls == [] and rest_deletes(github) == []
    assert github.ref(REPO, BRANCH) == r.merged_head


# -- Rule 7: nothing here ends a merged loop as failed --------------------------------


def test_rule7_git_down_and_rest_delete_failing_every_try_still_merged(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def git_down_rest_failing() -> None:
        github.git_down = True
        github.inject("DELETE", r"/git/refs/", 502, times=1000)

    spy(monkeypatch, git_down_rest_failing)
    merged_loop(github, model, redis, drain)


def test_rule7_a_deletion_raising_every_try_still_merged(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom() -> None:
        raise OSError("injected: no temporary directory")

    spy(monkeypatch, boom)
    merged_loop(github, model, redis, drain)


def test_rule1_a_lost_merge_answer_then_a_push_before_the_gate_reads_keeps_their_commit(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GitHub merges, its answer is lost (502 after the merge); a person pushes to the
    branch; the gate's retry finds the pull request merged and takes the lease's head from
    ``GET pull`` (``now.head_sha``). GitHub keeps a merged pull's head where it merged;
    the local GitHub's follows the branch, so here the lease is on the person's commit.
    The gate knew the merged head already: ``sha``, the head the merge was pinned to."""
    from bot.io.github import pulls as gh_pulls

    theirs: list[str] = []
    owner = next(c for c in vars(gh_pulls).values() if isinstance(c, type) and "pull" in vars(c))
    real_pull = owner.pull

    def pull(self: Any, repo: str, number: int) -> Any:
        p = github.repo(REPO).pulls.get(number)
        if p is not None and p.merged and not theirs:
            theirs.append(a_person_pushes()(github))
        return real_pull(self, repo, number)

    monkeypatch.setattr(owner, "pull", pull)
    model.responder = fixing_agent(
        lambda: github.inject("PUT", r"/pulls/\d+/merge$", 502, after=True)
    )
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert theirs, "the person's push did not happen"
    why = ("their commit was deleted", r.merged_head, rest_deletes(github))
    assert github.ref(REPO, BRANCH) == theirs[0], why
