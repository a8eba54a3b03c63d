"""Red team on fewer writes (issue 43), end to end: the receipt is now posted once, after
the merge, from ``record.receipt_text``; a merged loop must still end with its receipt on
the pull request, with the merge commit, when GitHub fails that one write and the gate
is retried. Real RQ worker, git and sandbox; the local GitHub and model."""

from __future__ import annotations

import json
import time
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.github import failures
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.review import critic as critic_job
from tests.conftest import Web
from tests.e2e.review.test_receipt import no_waiting, receipt_body, start
from tests.e2e.review.test_review_merge import fixing_agent, is_critic, record, report
from tests.e2e.review.test_same_change import events, which
from tests.helpers import REPO, label, open_issue, sample_repo

__all__ = ["no_waiting"]  # the fixture, used by name


def test_a_receipt_whose_post_fails_after_the_merge_is_posted_by_the_retried_gate(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
) -> None:
    # The status comment's next edit is the gate's, with the receipt: GitHub fails every
    # try of the first gate run at it (the merge itself went through).
    model.responder = fixing_agent(
        lambda: github.inject("PATCH", r"/issues/comments/\d+$", 502, times=failures.MAX_ATTEMPTS)
    )
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number == 2
    body = receipt_body(github, r.pr_number)
    assert body is not None, "merged, and no receipt in the status comment"
    assert f"Merged as `{r.merge_sha}`." in body


def test_a_critic_retry_never_lets_the_first_try_s_held_in_progress_overwrite_its_verdict(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    monkeypatch: Any,
) -> None:
    """The critic's ``reviewing`` check run is held 5 s for the verdict. A try that fails
    (GitHub refuses its review) leaves that update held; the next try, on the same head,
    writes the verdict within those seconds. The first try's held ``in_progress`` must
    not go out after it (here the in-process worker's thread outlives the job; a forking
    worker's job lives that long while its last status edit waits for GitHub's line)."""
    monkeypatch.setattr(critic_job, "ERROR_BACKOFF", (0.0,))
    tries: list[str] = []

    def review_lands() -> None:
        if not tries:  # the first try's review: GitHub fails it, every retry
            github.inject("POST", r"/pulls/\d+/reviews$", 502, times=failures.MAX_ATTEMPTS)
        tries.append("critic")

    model.responder = fixing_agent(review_lands)
    start(github)
    drain()
    r = record(redis)
    assert len(tries) == 2, tries
    time.sleep(critic_job.HOLD_REVIEWING + 1.5)  # past the first try's hold
    runs = [
        c
        for c in github.repo(REPO).check_runs.values()
        if c["name"] == critic_job.CHECK_NAME and c["head_sha"] == r.reviewed_sha
    ]
    assert len(runs) == 1, runs  # never two on one head
    assert (runs[0]["status"], runs[0]["conclusion"]) == ("completed", "success"), runs[0]


def test_a_writer_s_edit_waiting_for_the_next_turn_is_not_skipped_by_a_clean_catch_up(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A writer edits the issue while its loop is in review: the edit is the new approved
    text, waiting for the agent's next turn (``push_feedback``). The loop then catches up
    with the default branch (another loop merged first), cleanly: that catch-up must not
    skip the turn the edit waits for and merge the change reviewed against the old text.
    Before issue 43 a turn always followed a catch-up, and took the edit."""
    sample_repo(github, loop_yml="verify: test -d notes\n")
    issues = [open_issue(github, "one", "Do one."), open_issue(github, "two", "Do two.")]
    edited: list[int] = []

    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            for n in issues:
                if n not in edited:  # the writer asks for more, while the review runs
                    edited.append(n)
                    with github.as_user("writer") as u:
                        u.patch(
                            f"/repos/{REPO}/issues/{n}",
                            json={"body": f"Do it. Also write MORE-{n} in the note."},
                        ).raise_for_status()
            return report()
        if any(b.get("type") == "tool_result" for b in body["messages"][-1]["content"]):
            return m.text("Done.")
        n = which(body)
        more = f"MORE-{n}" in json.dumps(body["messages"][-1])
        return m.write_file(f"notes/{n}.md", f"noted{' MORE' if more else ''}\n")

    model.responder = agent
    for n in issues:
        label(github, "writer", n)
    drain(rounds=30)
    (late,) = [n for n in issues if events(redis, n, "base_merged")]
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None and r.status == Status.COMPLETED, r
    told = [
        b
        for b in model.requests
        if not is_critic(b) and f"MORE-{late}" in json.dumps(b["messages"][-1])
    ]
    assert told, "the writer's edit never reached the agent"
    assert github.file_at(REPO, "main", f"notes/{late}.md") == "noted MORE\n"
