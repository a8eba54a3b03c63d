"""Red team on the quiet catch-up (issue 43): a clean catch-up's steps (merged in,
verified, on to the critic) are dropped from the status comment at the loop job's end,
on the theory that the next job shows how it ended. When the critic does not carry the
approval (the change's context moved), it reviews again, for as long as the model takes:
the status comment must say the loop is being reviewed meanwhile, not the gate's last
state before the catch-up. Real RQ worker, git and sandbox; the local GitHub and model."""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.queues import enqueue_gate
from bot.io.store import Store
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs import status_comment
from tests.conftest import Web
from tests.e2e.review.test_review_merge import ci_status
from tests.e2e.review.test_same_change import (
    LINES,
    LINES_YML,
    context_agent,
    events,
    start_two,
    two_loops,
)
from tests.helpers import REPO


def test_a_catch_up_reviewed_again_shows_reviewing_while_the_critic_reviews(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    shown: list[str] = []  # the late loop's status comment, while its second review runs

    def review_lands() -> None:
        store = Store(redis)
        for n in (1, 2):
            r = store.get(f"{REPO}#{n}")
            if r and r.status == Status.REVIEWING and r.catch_up.get("to"):
                # The model is what takes long: the held edit (HOLD) has gone out by the
                # time a real review ends. Wait as long here.
                time.sleep(status_comment.HOLD + 1.5)
                assert r.status_comment_id is not None
                shown.append(github.repo(REPO).comments[r.status_comment_id]["body"])

    first, second = two_loops(
        github, model, redis, drain, context_agent(review_lands), LINES_YML, LINES
    )
    (late,) = [n for n in (first, second) if events(redis, n, "base_merged")]
    assert events(redis, late, "review_carried") == []  # reviewed again
    assert len(shown) == 1, shown
    headline = next(line for line in shown[0].splitlines() if line.count(" · ") >= 2)
    assert "**reviewing**" in headline, shown[0]


def test_a_catch_up_after_a_wait_for_checks_does_not_show_that_wait_while_reviewed_again(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Both loops wait at the gate for a required check (the status comment says so).
    The check passes on loop one's head: it merges. Then on loop two's: its gate finds
    the base moved and sends it to catch up, cleanly, and the critic reviews it again
    (the change's context moved). The status comment must not say "waiting for
    checks" all that while."""
    shown: list[str] = []

    def review_lands() -> None:
        r = Store(redis).get(f"{REPO}#2")
        if r and r.status == Status.REVIEWING and r.catch_up.get("to"):
            time.sleep(status_comment.HOLD + 1.5)  # a real review takes that long
            assert r.status_comment_id is not None
            shown.append(github.repo(REPO).comments[r.status_comment_id]["body"])

    first, second = start_two(github, model, context_agent(review_lands), LINES_YML, LINES)
    github.require_checks(REPO, "main", ["ci/test"])
    drain(rounds=30)
    store = Store(redis)
    for n in (first, second):
        r = store.get(f"{REPO}#{n}")
        assert r is not None and r.phase == "waiting_for_checks", r
    for n in (first, second):
        ci_status(github, github.ref(REPO, f"loop/issue-{n}"), "success", "ci/test")
        enqueue_gate(redis, REPO, n)  # as the status's webhook wakes it
        drain(rounds=30)
    r = store.get(f"{REPO}#{first}")
    assert r is not None and r.status == Status.COMPLETED, r
    r2 = store.get(f"{REPO}#{second}")
    assert events(redis, second, "base_merged"), (
        r2 and (r2.phase, r2.detail),
        [e["kind"] for e in store.events(f"{REPO}#{second}")][-8:],
    )
    assert events(redis, second, "review_carried") == []  # reviewed again
    assert len(shown) == 1, shown
    headline = next(line for line in shown[0].splitlines() if line.count(" · ") >= 2)
    assert "waiting_for_checks" not in headline, shown[0]
