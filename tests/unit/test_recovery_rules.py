"""What the reconciler does with a loop nobody runs (bot/core/rules/recovery.py): one row
per case."""

from __future__ import annotations

import pytest

from bot.core.record import LoopRecord, Reason, Status
from bot.core.rules import recovery
from bot.core.rules.recovery import EndStranded, Resume, Revive, Skip, Stall, TakeOver

NOW = 10_000.0
TTL = 60.0
GRACE = 120.0
MAX = 3


def loop(status: Status, *, idle: float = 1_000.0, **fields: object) -> LoopRecord:
    """A record of ``status``, last written ``idle`` seconds before ``NOW``."""
    return LoopRecord(
        repo="acme/widgets",
        issue=1,
        installation_id=1,
        status=status,
        updated_at=NOW - idle,
        **fields,
    )


Q, R = Status.QUEUED, Status.RUNNING


@pytest.mark.parametrize(
    ("record", "leased", "job", "decision"),
    [
        # Someone holds the lease: nothing to do, whatever else.
        (loop(R), True, None, Skip),
        (loop(Q, handed_over=True), True, None, Skip),
        # Handed over: taken over at once, unless its job is queued or still wrapping up.
        (loop(Q, handed_over=True, idle=0), False, "finished", TakeOver),
        (loop(Q, handed_over=True), False, None, TakeOver),
        (loop(Q, handed_over=True), False, "queued", Skip),
        (loop(Q, handed_over=True), False, "scheduled", Skip),
        (loop(Q, handed_over=True), False, "started", Skip),
        # ... also past the resume budget: a handover is not a lost worker.
        (loop(Q, handed_over=True, auto_resumes=MAX), False, "finished", TakeOver),
        # Written before handed_over existed: the phase said so.
        (loop(Q, phase="handoff"), False, "finished", TakeOver),
        (loop(Q, phase="handoff"), False, "started", Skip),
        # Queued: waiting its turn, or within the grace of a lost enqueue.
        (loop(Q), False, "queued", Skip),
        (loop(Q), False, "scheduled", Skip),
        (loop(Q), False, "deferred", Skip),
        (loop(Q, idle=GRACE - 1), False, None, Skip),
        (loop(Q), False, None, Resume),
        (loop(Q), False, "failed", Resume),
        # Running: between RQ retries, or just started, is left alone.
        (loop(R), False, "scheduled", Skip),
        (loop(R), False, "queued", Skip),
        (loop(R, idle=TTL - 1), False, "started", Skip),
        (loop(R), False, "started", Resume),  # a killed horse: RQ still says started
        (loop(R), False, None, Resume),
        # Past the resume budget: stalled.
        (loop(R, auto_resumes=MAX - 1), False, None, Resume),
        (loop(R, auto_resumes=MAX), False, None, Stall),
        (loop(Q, auto_resumes=MAX), False, "failed", Stall),
        # Not queued or running: not this rule's business.
        (loop(Status.REVIEWING), False, None, Skip),
        (loop(Status.FAILED), False, None, Skip),
    ],
)
def test_lapsed(record: LoopRecord, leased: bool, job: str | None, decision: type) -> None:
    got = recovery.lapsed(
        record,
        leased=leased,
        job=job,
        now=NOW,
        lease_ttl=TTL,
        queued_grace=GRACE,
        max_auto_resumes=MAX,
    )
    assert type(got) is decision, got


def test_a_stall_says_how_often_the_worker_was_lost() -> None:
    got = recovery.lapsed(
        loop(R, auto_resumes=MAX),
        leased=False,
        job=None,
        now=NOW,
        lease_ttl=TTL,
        queued_grace=GRACE,
        max_auto_resumes=MAX,
    )
    assert got == Stall("the worker was lost 4 times")


STRANDED_GRACE = 300.0


@pytest.mark.parametrize(
    ("record", "pending", "decision"),
    [
        (loop(Status.REVIEWING), False, Revive),
        (loop(Status.MERGING), False, Revive),
        (loop(Status.REVIEWING), True, Skip),
        (loop(Status.MERGING, idle=STRANDED_GRACE - 1), False, Skip),
        (loop(Status.REVIEWING, auto_resumes=MAX - 1), False, Revive),
        (loop(Status.REVIEWING, auto_resumes=MAX), False, EndStranded),
        (loop(Status.MERGING, auto_resumes=MAX), False, EndStranded),
        (loop(Status.MERGING, auto_resumes=MAX), True, Skip),
        (loop(Status.RUNNING), False, Skip),
        (loop(Status.COMPLETED), False, Skip),
    ],
)
def test_stranded(record: LoopRecord, pending: bool, decision: type) -> None:
    got = recovery.stranded(
        record, job_pending=pending, now=NOW, grace=STRANDED_GRACE, max_auto_resumes=MAX
    )
    assert type(got) is decision, got


@pytest.mark.parametrize(
    ("status", "reason", "what"),
    [
        (Status.REVIEWING, Reason.CRITIC_ERROR, "the review failed 4 time(s)"),
        (Status.MERGING, Reason.GATE_ERROR, "the merge gate failed 4 time(s)"),
    ],
)
def test_stranded_ends_with_its_stages_error(status: Status, reason: Reason, what: str) -> None:
    got = recovery.stranded(
        loop(status, auto_resumes=MAX),
        job_pending=False,
        now=NOW,
        grace=STRANDED_GRACE,
        max_auto_resumes=MAX,
    )
    assert isinstance(got, EndStranded) and got.reason is reason, got
    assert got.detail.startswith(what) and "its job was lost each time" in got.detail
