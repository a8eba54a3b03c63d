"""Merges that wait for a person, end to end: a real loop against the local GitHub with the
base branch's review rules on (ruleset or classic protection), a real RQ worker, webhooks
delivered to the real web app. No merge call is refused: the gate reads the rules first."""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.github.state import ReviewRule
from tests.conftest import Web
from tests.e2e.review.test_review_merge import FIX, YML, finding, is_critic, report
from tests.helpers import REPO, label, open_issue, sample_repo

KEY = f"{REPO}#1"


def start(github: GitHubServer, drain: Any, rule: ReviewRule | None, **files: str) -> None:
    sample_repo(github, loop_yml=YML, extra=files or None)
    if rule is not None:
        github.repo(REPO).review_rules["main"] = rule
    n = open_issue(github)
    label(github, "writer", n)
    drain()


def record(redis: Redis) -> Any:
    return Store(redis).get(KEY)


def review(github: GitHubServer, user: str, pr: int, event: str = "APPROVE") -> None:
    with github.as_user(user) as u:
        r = u.post(f"/repos/{REPO}/pulls/{pr}/reviews", json={"event": event, "body": "ok"})
        r.raise_for_status()


def status_comment(github: GitHubServer) -> str:
    repo = github.repo(REPO)
    bodies = [c["body"] for c in repo.comments.values() if c["_issue"] == 1]
    return "\n".join(bodies)


def merged_within(github: GitHubServer, redis: Redis, drain: Any, seconds: float) -> float:
    started = time.monotonic()
    drain()
    took = time.monotonic() - started
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert took < seconds, took
    return took


def agent_that_merges_main_in(body: dict[str, Any]) -> m.Item:
    """The fix on turn one, then, sent back to catch up with main, a note: the loop
    pushes again after its first head was approved."""
    if is_critic(body):
        return report()
    last = body["messages"][-1]["content"]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
        return m.text("Done.")
    if len(body["messages"]) == 1:
        return FIX
    return m.write_file("NOTES.md", "merged main in\n")


def test_a_required_approval_waits_for_a_writer_and_merges_within_seconds(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    start(github, drain, ReviewRule(required_approving_review_count=1))
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for 1 approving review by a writer"
    shown = status_comment(github)
    assert "awaiting_approval" in shown and "waiting for 1 approving review by a writer" in shown
    repo = github.repo(REPO)
    # The writer who approved the issue is asked to review.
    assert repo.requested_reviewers[r.pr_number] == ["writer"]
    assert repo.issues[r.pr_number].state == "open" and not repo.pulls[r.pr_number].merged
    # A reader's approval does not count: still waiting, and no merge was tried.
    review(github, "reader", r.pr_number)
    drain()
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert not repo.pulls[r.pr_number].merged
    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []  # the gate read the rule; it never asked GitHub to refuse
    assert "return a + b" in (github.file_at(REPO, "main", "calc.py") or "")


def test_a_code_owner_must_approve_and_the_status_names_them(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    sample_owner = ".github/CODEOWNERS"
    github.add_user("owner")
    start(
        github,
        drain,
        ReviewRule(required_approving_review_count=1, require_code_owner_review=True),
        **{sample_owner: "*.py @owner\n"},
    )
    repo = github.repo(REPO)
    repo.permissions["owner"] = "write"
    r = record(redis)
    assert r.phase == "awaiting_approval", r
    assert r.detail == "waiting for 1 approving review by a writer; code owners: @owner"
    review(github, "writer", r.pr_number)  # a writer, but not the code owner
    drain()
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert "code owners: @owner" in r.detail and not repo.pulls[r.pr_number].merged
    review(github, "owner", r.pr_number)
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []


def test_an_approval_of_an_older_head_is_stale_and_asked_again(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The writer approves; main moved meanwhile, so the gate merges it in first (a push),
    # and the rule dismisses the approval of the head it no longer is: asked again.
    model.responder = agent_that_merges_main_in
    rule = ReviewRule(required_approving_review_count=1, dismiss_stale_reviews_on_push=True)
    start(github, drain, rule)
    r = record(redis)
    assert r.phase == "awaiting_approval", r
    repo = github.repo(REPO)
    first_head = repo.head_sha(repo.pulls[r.pr_number])
    gitrepo.seed(repo.path, "main", {"OTHER.md": "a person's change\n"}, "Other change")
    review(github, "writer", r.pr_number)
    drain()
    r = record(redis)
    head = repo.head_sha(repo.pulls[r.pr_number])
    assert head != first_head and r.check_fixes == 1, r
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for 1 approving review by a writer"
    assert not repo.pulls[r.pr_number].merged
    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []
    assert github.file_at(REPO, "main", "OTHER.md") == "a person's change\n"


def test_own_threads_are_resolved_and_a_persons_thread_is_waited_for(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(required_review_thread_resolution=True)
    n = open_issue(github)

    def person_comments() -> None:
        number = max(repo.pulls)
        with github.as_user("writer") as u:
            u.post(
                f"/repos/{REPO}/pulls/{number}/reviews",
                json={
                    "event": "COMMENT",
                    "body": "",
                    "comments": [{"path": "calc.py", "line": 2, "body": "why?"}],
                },
            ).raise_for_status()

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):  # the pull request is open: a person comments on a line too
            person_comments()
            return report(findings=[finding("sev3", "calc.py", 2, "nit: docstring", "docs")])
        last = body["messages"][-1]["content"]
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
            return m.text("Fixed add.")
        return FIX

    model.responder = play
    label(github, "writer", n)
    drain()
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for @writer to resolve their review thread(s)"
    threads = repo.review_comments[r.pr_number]
    own = [c["id"] for c in threads if c["user"]["login"].endswith("[bot]")]
    theirs = [c["id"] for c in threads if c["user"]["login"] == "writer"]
    assert own and set(own) <= repo.resolved_threads  # loopbot resolved its own
    assert not set(theirs) & repo.resolved_threads  # and never a person's
    repo.resolved_threads.update(theirs)  # the person resolves it; their comment wakes it
    review(github, "writer", r.pr_number, "COMMENT")
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []


def test_squash_disabled_is_refused_clearly_without_a_merge_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.allow_squash_merge = False
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "not_mergeable"), r
    assert "squash merges are not allowed" in r.detail
    assert repo.merge_refusals == [] and not repo.pulls[r.pr_number].merged
    assert gitrepo.resolve(repo.path, "refs/heads/loop/issue-1")  # kept for a person
