"""Red team on the merge receipt in the status comment (issue 43): after a merge the
receipt is shown, the status comment ends "merged", and the loop's branch is gone, even
when GitHub fails the status comment's edit after the merge, once or on every try of
the gate's run. Real RQ worker, git and sandbox; the local GitHub and model."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.github import failures
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs import reconciler
from jobs.review import gate as merge_gate
from jobs.runtime import Runtime
from tests.conftest import Web
from tests.e2e.review.test_receipt import no_waiting, receipt_body, start
from tests.e2e.review.test_review_merge import fixing_agent, record
from tests.helpers import REPO

__all__ = ["no_waiting"]  # the fixture, used by name

BRANCH = "loop/issue-1"


def scheduled_now(redis: Redis) -> None:
    """RQ's scheduled jobs (the gate's recheck), due now: the test worker has no scheduler."""
    from rq import Queue
    from rq.job import Job
    from rq.registry import ScheduledJobRegistry

    from bot.io.queues import LOOP_QUEUE

    queue = Queue(LOOP_QUEUE, connection=redis)
    registry = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
    for job_id in registry.get_job_ids():
        registry.remove(job_id)
        queue.enqueue_job(Job.fetch(job_id, connection=redis))


def failing_after_review(github: GitHubServer, tries: int) -> Any:
    """The agent fixes, the critic approves; as it does, GitHub starts failing every edit
    of a comment (the status comment's next edit is the gate's, with the receipt) for
    ``tries`` gate runs' worth of attempts. The merge itself goes through."""

    times = failures.MAX_ATTEMPTS * tries
    return fixing_agent(lambda: github.inject("PATCH", r"/issues/comments/\d+$", 502, times=times))


def test_a_merged_loop_s_branch_is_deleted_when_its_receipt_s_first_post_failed(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
) -> None:
    model.responder = failing_after_review(github, tries=1)
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None
    body = receipt_body(github, r.pr_number)
    assert body is not None and f"Merged as `{r.merge_sha}`." in body
    assert github.ref(REPO, BRANCH) is None, "merged, and its branch is left"


def test_a_receipt_whose_every_gate_try_failed_is_shown_when_the_gate_comes_back(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
) -> None:
    """GitHub fails the edit for longer than the gate's run retries: the loop is merged
    (recorded completed) and nothing on GitHub says so. The gate's recheck shows it."""
    model.responder = failing_after_review(github, tries=merge_gate.ERROR_ATTEMPTS)
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None and r.status_comment_id is not None
    scheduled_now(redis)  # a timer's wake-up, later; GitHub answers again by then
    drain()
    body = receipt_body(github, r.pr_number)
    assert body is not None, "merged, and the receipt is never shown"
    assert f"Merged as `{r.merge_sha}`." in body
    shown = github.repo(REPO).comments[r.status_comment_id]["body"]
    assert "**completed**" in shown, shown
    assert github.ref(REPO, BRANCH) is None, "merged, and its branch is left"


def test_a_merge_whose_answer_was_lost_still_shows_its_receipt(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
) -> None:
    """GitHub merges, and its answer is lost (a 502 after the merge): the next try finds
    the pull request merged already. The receipt the gate held is still shown."""

    model.responder = fixing_agent(
        lambda: github.inject("PUT", r"/pulls/\d+/merge$", 502, after=True)
    )
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None
    body = receipt_body(github, r.pr_number)
    assert body is not None, "merged, and the receipt is never shown"
    assert f"Merged as `{r.merge_sha}`." in body
    assert github.ref(REPO, BRANCH) is None


def test_a_merged_loop_whose_gate_died_before_its_tidy_up_is_finished_by_the_reconciler(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    no_waiting: None,
    rt: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate's worker dies after the merge (recorded completed) and before its
    tidy-up: nothing of that gate comes back, not even its recheck (here: the gate's
    every try failed, and its recheck is lost with the worker). The reconciler sends the
    gate again once the grace has passed: the receipt is shown and the branch goes."""
    from rq import Queue
    from rq.registry import ScheduledJobRegistry

    from bot.io.queues import LOOP_QUEUE

    model.responder = failing_after_review(github, tries=merge_gate.ERROR_ATTEMPTS)
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.pr_number is not None and r.status_comment_id is not None
    scheduled = ScheduledJobRegistry(queue=Queue(LOOP_QUEUE, connection=redis))  # type: ignore[no-untyped-call]
    for job_id in scheduled.get_job_ids():
        scheduled.remove(job_id, delete_job=True)  # lost with the worker
    assert reconciler.finish_merged(rt) == []  # within the grace: its gate may be at it
    monkeypatch.setattr(reconciler, "TIDY_GRACE_SECONDS", 0)
    assert reconciler.finish_merged(rt) == [f"{REPO}#1"]
    assert reconciler.finish_merged(rt) == []  # its gate is queued: not twice
    drain()
    body = receipt_body(github, r.pr_number)
    assert body is not None and f"Merged as `{r.merge_sha}`." in body
    shown = github.repo(REPO).comments[r.status_comment_id]["body"]
    assert "**completed**" in shown, shown
    assert github.ref(REPO, BRANCH) is None
    assert reconciler.finish_merged(rt) == []  # tidied: nothing left to do
