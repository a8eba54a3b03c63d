"""No loop is ever stuck in ``reviewing`` or ``merging``: critic and gate failures end the
loop with a reason and a comment, the reconciler revives lost jobs, the gate re-reads the
ready label, and the squash commit closes no issue it does not mean to."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.core.text.defuse import JOINER as J
from bot.io.github import failures
from bot.io.queues import JobKind, fetch_job, kind_of, loop_queue
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs import reconciler
from jobs.review import critic
from jobs.review import gate as merge_gate
from jobs.runtime import Runtime
from tests.conftest import Web
from tests.e2e.review.test_review_merge import (
    FIX,
    KEY,
    YML,
    is_critic,
    main_log,
    record,
    report,
    run,
)
from tests.helpers import REPO, label, open_issue, sample_repo


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same retries, without their pauses."""
    monkeypatch.setattr(failures, "_backoff", lambda attempt: 0.0)
    monkeypatch.setattr(critic, "ERROR_BACKOFF", (0.0,))
    monkeypatch.setattr(merge_gate, "ERROR_BACKOFF", (0.0,))


def status_comment(github: GitHubServer, issue: int = 1) -> str:
    return str(
        next(
            c
            for c in github.repo(REPO).comments.values()
            if c["_issue"] == issue and c["user"]["type"] == "Bot" and "### loopbot" in c["body"]
        )["body"]
    )


def test_a_diff_github_will_not_return_goes_to_a_person(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    github.inject(
        "GET",
        r"/pulls/\d+$",
        406,
        accept="diff",
        times=100,
        body={"message": "Sorry, the diff exceeded the maximum number of files (300)."},
    )
    model.play(FIX, m.text("Fixed."))
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "too large for GitHub to return" in r.detail
    assert "loop:needs-human" in github.repo(REPO).issues[1].labels or any(
        "human" in lb for lb in github.repo(REPO).issues[1].labels
    )
    assert not any(is_critic(b) for b in model.requests)
    assert len(main_log(github)) == 1
    assert "needs_human" in status_comment(github)


def test_merge_failing_past_every_retry_ends_with_gate_error(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    fault = github.inject("PUT", r"/pulls/\d+/merge$", 502, times=1000)
    model.play(FIX, m.text("Fixed."), report())
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "gate_error"), r
    assert fault.hits == failures.MAX_ATTEMPTS * merge_gate.ERROR_ATTEMPTS
    assert len(main_log(github)) == 1  # nothing merged
    assert "gate_error" in status_comment(github) and "/loop-restart" in status_comment(github)
    pr_comments = [
        c["body"] for c in github.repo(REPO).comments.values() if c["_issue"] == r.pr_number
    ]
    assert any("stopped trying to merge" in b for b in pr_comments)
    kinds = [e["kind"] for e in Store(redis).events(KEY)]
    assert kinds.count("gate_error") == merge_gate.ERROR_ATTEMPTS


def test_merge_answer_lost_then_retried_completes(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The merge lands, then every answer is a 502: the next attempt finds it merged.
    github.inject("PUT", r"/pulls/\d+/merge$", 502, times=1, after=True)
    github.inject("PUT", r"/pulls/\d+/merge$", 502, times=failures.MAX_ATTEMPTS - 1)
    model.play(FIX, m.text("Fixed."), report())
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert len(main_log(github)) == 2


# The SDK retries each failing call once, not four times: its own backoff is real sleep
# (0.5 to 8 s), and what this test counts is the critic job's attempts, not the SDK's.
@pytest.mark.parametrize("env_extra", [{"LOOPBOT_MODEL_RETRIES": "1"}])
def test_critic_model_failing_for_good_ends_with_critic_error(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed."))  # then every request fails: 500 from the local model
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "critic_error"), r
    assert len(main_log(github)) == 1
    body = status_comment(github)
    assert "critic_error" in body and "/loop-restart" in body
    kinds = [e["kind"] for e in Store(redis).events(KEY)]
    assert kinds.count("critic_error") == critic.ERROR_ATTEMPTS


def test_reviewing_loop_whose_critic_job_vanished_is_revived(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    rt: Runtime,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs import lifecycle

    real = lifecycle.enqueue_critic
    lost: list[str] = []

    def enqueue_then_lose(redis_: Redis, repo: str, issue: int) -> None:
        real(redis_, repo, issue)
        for job_id in loop_queue(redis_).get_job_ids():
            job = fetch_job(job_id, redis_)
            if kind_of(job.func_name) is JobKind.CRITIC and not lost:
                job.delete()  # gone from Redis, as after a flush or a lost worker
                lost.append(job_id)  # the loop's enqueue only: the reconciler's stays

    monkeypatch.setattr(lifecycle, "enqueue_critic", enqueue_then_lose)
    model.play(FIX, m.text("Fixed."), report())
    run(github, drain)
    assert record(redis).status == Status.REVIEWING  # stranded
    assert reconciler.revive_stranded(rt) == []  # not yet: within the grace period
    monkeypatch.setattr(reconciler, "STRANDED_GRACE_SECONDS", 0)
    assert reconciler.revive_stranded(rt) == [KEY]
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r


def test_stranded_past_the_resume_budget_ends_with_an_error(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    rt: Runtime,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs import lifecycle

    monkeypatch.setattr(lifecycle, "enqueue_critic", lambda *a: None)  # a lost enqueue
    monkeypatch.setattr(reconciler, "STRANDED_GRACE_SECONDS", 0)
    model.play(FIX, m.text("Fixed."))
    run(github, drain)
    Store(redis).set_fields(KEY, auto_resumes=rt.settings.max_auto_resumes)
    assert reconciler.revive_stranded(rt) == [KEY]
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "critic_error"), r
    assert "critic_error" in status_comment(github)


def test_gate_refuses_when_the_ready_label_is_gone_and_the_webhook_lost(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def unlabel_silently(body: dict[str, Any]) -> m.Item:
        github.repo(REPO).issues[1].labels.remove("loop:ready")  # no webhook is sent
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = unlabel_silently
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "issue_inactive"), r
    assert len(main_log(github)) == 1
    assert github.repo(REPO).issues[1].state == "open"


def test_issue_title_closes_nothing_when_squash_merged(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    one = open_issue(github, title="first")
    two = open_issue(github, title="second")
    title = (
        f"Fixes #1, closes acme/other#3 and fixes https://github.com/{REPO}/issues/{two} cc @writer"
    )
    n = open_issue(github, title=title)
    model.play(FIX, m.text("Fixed."), report())
    label(github, "writer", n)
    drain()
    r = Store(redis).get(f"{REPO}#{n}")
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    issues = github.repo(REPO).issues
    assert issues[one].state == "open" and issues[two].state == "open"
    assert issues[n].state == "closed"
    subject = main_log(github)[0]
    assert subject.startswith(f"loop: F{J}ixes #{J}1, c{J}loses acme/other#{J}3"), subject
    assert subject.endswith(f"@{J}writer (#{r.pr_number})"), subject
    message = gitrepo.git(github.repo(REPO).path, "log", "-1", "--format=%B", "main")
    assert f"Closes #{n}." in message


def test_unsafe_titles_would_close_issues_on_the_local_server(github: GitHubServer) -> None:
    # The local server closes what GitHub closes: every keyword form, owner/repo#N, URLs.
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    refs = github._closing_references(
        repo, f"FIXES #1, Resolved: acme/widgets#2 and close https://x/{REPO}/issues/3; #4"
    )
    assert [(t.full_name, n) for t, n in refs] == [(REPO, 1), (REPO, 2), (REPO, 3)]
