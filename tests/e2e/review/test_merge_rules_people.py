"""Merges that wait for a person, attacked: whose threads loopbot waits for and resolves,
and what a base branch with no conversation rule asks (nothing). Real loops against the
local GitHub, as in test_merge_rules.py."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.github.state import Fault, ReviewRule
from tests.conftest import Web
from tests.e2e.review.test_merge_rules import (
    KEY,
    agent_that_merges_main_in,
    merged_within,
    record,
    review,
)
from tests.e2e.review.test_review_merge import FIX, YML, finding, is_critic, report
from tests.helpers import REPO, label, open_issue, sample_repo


def _critic_with_a_persons_line_comment(github: GitHubServer) -> Any:
    """The agent fixes add; while the critic reads, a writer comments on a line (a
    COMMENTED review: it asks for nothing on GitHub); the critic leaves one sev3 note."""
    repo = github.repo(REPO)

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            with github.as_user("writer") as u:
                u.post(
                    f"/repos/{REPO}/pulls/{max(repo.pulls)}/reviews",
                    json={
                        "event": "COMMENT",
                        "body": "",
                        "comments": [{"path": "calc.py", "line": 2, "body": "why?"}],
                    },
                ).raise_for_status()
            return report(findings=[finding("sev3", "calc.py", 2, "nit: docstring", "docs")])
        last = body["messages"][-1]["content"]
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
            return m.text("Fixed add.")
        return FIX

    return play


def test_a_persons_comment_thread_does_not_hold_a_merge_no_rule_asks_about(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # No conversation rule (no ruleset, no classic protection): GitHub merges with the
    # thread open, and so did loopbot before it learned to wait for people. A person's
    # question is not a request for changes; waiting a week for it is not "promptly".
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    n = open_issue(github)
    model.responder = _critic_with_a_persons_line_comment(github)
    label(github, "writer", n)
    merged_within(github, redis, drain, 120)
    r = record(redis)
    theirs = [c["id"] for c in repo.review_comments[r.pr_number] if c["user"]["login"] == "writer"]
    assert theirs and not set(theirs) & repo.resolved_threads  # never resolved for them
    assert repo.merge_refusals == []


def test_loopbot_never_resolves_its_own_thread_once_a_person_has_replied_in_it(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # Classic protection (unreadable to the App) requires one approval and resolved
    # conversations. The critic leaves a thread; a writer replies in it ("not fixed").
    # When GitHub blocks the merge for the threads, loopbot resolves its own; the thread
    # a person has spoken in is theirs to resolve, and the loop waits for them.
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(
        required_approving_review_count=1,
        required_review_thread_resolution=True,
        source="classic",
    )
    n = open_issue(github)
    calls = {"critic": 0}

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            calls["critic"] += 1
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
    own = [c for c in repo.review_comments[r.pr_number] if c["user"]["login"].endswith("[bot]")]
    assert len(own) == 1 and own[0]["id"] not in repo.resolved_threads
    # A person's reply in the critic's thread (GitHub: POST .../comments/{id}/replies).
    with github.lock:
        repo.review_comments[r.pr_number].append(
            own[0]
            | {
                "id": github.next_id(),
                "in_reply_to_id": own[0]["id"],
                "body": "this is not fixed: the docstring is still wrong",
                "user": github.users["writer"].json(),
            }
        )
    review(github, "writer", r.pr_number)  # the approval wakes the gate
    drain()
    r = record(redis)
    assert own[0]["id"] not in repo.resolved_threads, "loopbot resolved a thread a person spoke in"
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for @writer to resolve their review thread(s)", r.detail
    assert not repo.pulls[r.pr_number].merged
    repo.resolved_threads.add(own[0]["id"])  # the person resolves it; their comment wakes it
    review(github, "writer", r.pr_number, "COMMENT")
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []


def test_an_approval_before_loopbots_last_push_does_not_count_when_the_rule_asks_for_one_after(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # require_last_push_approval without dismiss_stale_reviews_on_push: the approval stays
    # on the pull request, but GitHub asks that the most recent push be approved by someone
    # other than its pusher (community discussion 77578: "working as designed"). Loopbot
    # pushes last when it merges the base in, so the earlier approval no longer lets it
    # merge: the loop waits for a new one, and never has its merge call refused.
    model.responder = agent_that_merges_main_in
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(
        required_approving_review_count=1, require_last_push_approval=True
    )
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = record(redis)
    assert r.phase == "awaiting_approval", r
    first_head = repo.head_sha(repo.pulls[r.pr_number])
    gitrepo.seed(repo.path, "main", {"OTHER.md": "a person's change\n"}, "Other change")
    review(github, "writer", r.pr_number)
    drain()
    r = record(redis)
    assert repo.head_sha(repo.pulls[r.pr_number]) != first_head and r.check_fixes == 1, r
    assert repo.merge_refusals == [], repo.merge_refusals
    assert not repo.pulls[r.pr_number].merged
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert "latest push" in r.detail, r.detail
    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []


def _pass_time(redis: Redis, seconds: float) -> None:
    """The waiting clock, as if ``seconds`` went by (the record's start is moved back)."""

    def back(rec: Any) -> None:
        rec.review_since -= seconds

    Store(redis).update(KEY, back)


def test_the_waiting_limit_counts_the_wait_for_the_head_people_are_asked_about(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # merge.approval_timeout_hours: 1. The loop waits 50 minutes; the writer approves; main
    # moved, so loopbot merges it in (a push) and the rule dismisses the approval: people
    # are asked again, about a new head. Fifteen minutes into that new wait the limit has
    # not passed: the clock is the wait for this head, not since the first ask.
    model.responder = agent_that_merges_main_in
    sample_repo(github, loop_yml=YML + "merge:\n  approval_timeout_hours: 1\n")
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(
        required_approving_review_count=1, dismiss_stale_reviews_on_push=True
    )
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = record(redis)
    assert r.phase == "awaiting_approval", r
    _pass_time(redis, 50 * 60)
    gitrepo.seed(repo.path, "main", {"OTHER.md": "a person's change\n"}, "Other change")
    review(github, "writer", r.pr_number)
    drain()
    r = record(redis)
    assert (r.status, r.phase, r.check_fixes) == (Status.MERGING, "awaiting_approval", 1), r
    _pass_time(redis, 15 * 60)
    review(github, "reader", r.pr_number, "COMMENT")  # wakes the gate: nothing changed
    drain()
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    _pass_time(redis, 50 * 60)  # 65 minutes on this head: the limit has passed
    review(github, "reader", r.pr_number, "COMMENT")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert not repo.pulls[r.pr_number].merged


def test_an_approval_landing_while_the_gate_runs_merges_without_waiting_for_the_sweep(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The gate has read "review required" and is still saying so (its review request is
    # slow) when the writer approves: the approval's webhook must not be lost to the run
    # in progress; the loop merges within the same drain, not at the five-minute sweep.
    model.play(FIX, m.text("Fixed add."), report())
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(required_approving_review_count=1)
    slow = Fault("POST", re.compile(r"/pulls/\d+/requested_reviewers$"), status=0, delay=3.0)
    github.faults.append(slow)

    def approve_meanwhile() -> None:
        deadline = time.monotonic() + 60
        while slow.hits == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        review(github, "writer", max(repo.pulls))

    approver = threading.Thread(target=approve_meanwhile)
    approver.start()
    n = open_issue(github)
    label(github, "writer", n)
    started = time.monotonic()
    drain()
    approver.join()
    drain()
    r = record(redis)
    assert slow.hits == 1
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert time.monotonic() - started < 60
    assert repo.merge_refusals == []


def test_a_persons_thread_opened_while_the_merge_call_is_in_flight_is_waited_for(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The ruleset asks for resolved conversations. The gate read none open and asks GitHub
    # to merge; a writer opens a thread just before GitHub handles the call, which it
    # refuses (405). Nothing is wrong with the loop: it waits for the person, by name,
    # and merges once they resolve it (it does not end refused on a person's question).
    model.play(FIX, m.text("Fixed add."), report())
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(required_review_thread_resolution=True)
    slow = Fault("PUT", re.compile(r"/pulls/\d+/merge$"), status=0, delay=2.0)
    github.faults.append(slow)

    def comment_meanwhile() -> None:
        deadline = time.monotonic() + 60
        while slow.hits == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        with github.as_user("writer") as u:
            u.post(
                f"/repos/{REPO}/pulls/{max(repo.pulls)}/reviews",
                json={
                    "event": "COMMENT",
                    "body": "",
                    "comments": [{"path": "calc.py", "line": 2, "body": "wait, why?"}],
                },
            ).raise_for_status()

    person = threading.Thread(target=comment_meanwhile)
    person.start()
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    person.join()
    drain()
    r = record(redis)
    assert slow.hits == 1 and len(repo.merge_refusals) == 1, repo.merge_refusals
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for @writer to resolve their review thread(s)", r.detail
    theirs = [c["id"] for c in repo.review_comments[r.pr_number] if c["user"]["login"] == "writer"]
    repo.resolved_threads.update(theirs)
    review(github, "writer", r.pr_number, "COMMENT")
    merged_within(github, redis, drain, 10)


def test_an_approval_dismissed_while_the_merge_call_is_in_flight_is_asked_again(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The gate read the approval and asks GitHub to merge; an admin dismisses the approval
    # just before GitHub handles the call (405). The loop waits for an approval again
    # (woken by the dismissed webhook too), and merges on the next one.
    model.play(FIX, m.text("Fixed add."), report())
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.permissions["boss"] = "admin"
    repo.review_rules["main"] = ReviewRule(required_approving_review_count=1)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = record(redis)
    assert r.phase == "awaiting_approval", r
    slow = Fault("PUT", re.compile(r"/pulls/\d+/merge$"), status=0, delay=2.0)
    github.faults.append(slow)

    def dismiss_meanwhile() -> None:
        deadline = time.monotonic() + 60
        while slow.hits == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        approval = repo.reviews[r.pr_number][-1]
        with github.as_user("boss") as u:
            u.put(
                f"/repos/{REPO}/pulls/{r.pr_number}/reviews/{approval['id']}/dismissals",
                json={"message": "not yet", "event": "DISMISS"},
            ).raise_for_status()

    boss = threading.Thread(target=dismiss_meanwhile)
    boss.start()
    review(github, "writer", r.pr_number)
    drain()
    boss.join()
    drain()
    r = record(redis)
    assert slow.hits == 1 and len(repo.merge_refusals) == 1, repo.merge_refusals
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for 1 approving review by a writer", r.detail
    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
