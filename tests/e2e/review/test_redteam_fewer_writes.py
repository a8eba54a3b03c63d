"""Red team on fewer writes (issue 43), end to end: the receipt is now posted once, after
the merge, from ``record.receipt_text``; a merged loop must still end with its receipt on
the pull request, with the merge commit, when GitHub fails that one write and the gate
is retried. Real RQ worker, git and sandbox; the local GitHub and model."""

from __future__ import annotations

from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.github import failures
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.review.test_receipt import no_waiting, receipt_body, start
from tests.e2e.review.test_review_merge import FIX, is_critic, record, report

__all__ = ["no_waiting"]  # the fixture, used by name


def test_a_receipt_whose_post_fails_after_the_merge_is_posted_by_the_retried_gate(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
) -> None:
    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            # The pull request's first comment is the gate's receipt: GitHub fails every
            # try of the first gate run at it (the merge itself went through).
            github.inject("POST", r"/issues/2/comments$", 502, times=failures.MAX_ATTEMPTS)
            return report()
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return m.text("Fixed add.")
        return FIX

    model.responder = agent
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number == 2
    body = receipt_body(github, r.pr_number)
    assert body is not None, "merged, and no receipt on the pull request"
    assert f"Merged as `{r.merge_sha}`." in body
