"""What changes with a loop's status (bot/core/rules/lifecycle.py): one row per case."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.record import ACTIVE, TERMINAL, LoopRecord, Reason, Status
from bot.core.rules import lifecycle as rules
from bot.core.rules.lifecycle import PENDING_JOB, Create, Guard, Refused, Requeue, Restart

# A loop that has been through a lot: every field a transition may reset is non-default.
WORN = LoopRecord(
    repo="acme/widgets",
    issue=7,
    installation_id=1,
    status=Status.FAILED,
    phase="failed",
    handed_over=False,
    turn=7,
    error_count=2,
    idle_turns=3,
    critic_round=2,
    sev1_rounds={"fp": 2},
    reason="critic_rounds_exhausted",
    detail="stopped",
    restarts=1,
    check_fixes=1,
    gate_since=123.0,
    sync_base=False,
    auto_resumes=1,
    resume_note="the old note",
)
QUEUED = {"status": Status.QUEUED, "phase": "queued", "handed_over": False}
RESTARTED = QUEUED | {
    "turn": 0,
    "error_count": 0,
    "idle_turns": 0,
    "critic_round": 0,
    "sev1_rounds": {},
    "reason": "",
    "detail": "",
    "restarts": 2,
}
LOST = (
    "The worker running turn 7 stopped; you are continuing on another worker from the "
    "last pushed commit."
)


@pytest.mark.parametrize(
    ("why", "note", "record", "changes"),
    [
        (Requeue.RESTART, "fix it", WORN, RESTARTED | {"resume_note": "fix it"}),
        (Requeue.RESTART, "", WORN, RESTARTED | {"resume_note": "the old note"}),
        (
            Requeue.RESTART,
            "",
            WORN.model_copy(update={"resume_note": ""}),
            RESTARTED
            | {"resume_note": "@alice restarted this loop; continue from the last commit."},
        ),
        (Requeue.FINDINGS, "2 sev1", WORN, QUEUED | {"turn": 0, "resume_note": "2 sev1"}),
        (
            Requeue.CHECKS,
            "ci fails",
            WORN,
            QUEUED | {"turn": 0, "check_fixes": 2, "gate_since": 0.0, "resume_note": "ci fails"},
        ),
        (
            Requeue.CONFLICTS,
            "conflicts",
            WORN,
            QUEUED
            | {
                "turn": 0,
                "check_fixes": 2,
                "gate_since": 0.0,
                "sync_base": True,
                "resume_note": "conflicts",
            },
        ),
        (Requeue.WORKER_LOST, "", WORN, QUEUED | {"auto_resumes": 2, "resume_note": LOST}),
        (
            Requeue.HANDOFF,
            "mid turn 3",
            WORN,
            QUEUED | {"handed_over": True, "phase": "handoff", "resume_note": "mid turn 3"},
        ),
        (
            Requeue.HANDOFF,
            "",
            WORN,
            QUEUED
            | {
                "handed_over": True,
                "phase": "handoff",
                "resume_note": "Your worker shut down between turns; carry on.",
            },
        ),
        (Requeue.TAKE_OVER, "", WORN.model_copy(update={"handed_over": True}), QUEUED),
    ],
    ids=lambda v: v.value if isinstance(v, Requeue) else None,
)
def test_requeue_resets_exactly(
    why: Requeue, note: str, record: LoopRecord, changes: dict[str, Any]
) -> None:
    assert rules.requeue(record, why, note=note, actor="alice") == changes
    # Every change is a field of the record, of the record's type.
    assert set(changes) <= set(LoopRecord.model_fields)
    LoopRecord.model_validate(record.model_dump() | changes)


@pytest.mark.parametrize(
    ("why", "job", "replace", "clears_cancel"),
    [
        (Requeue.RESTART, True, False, True),
        (Requeue.FINDINGS, True, False, False),
        (Requeue.CHECKS, True, False, False),
        (Requeue.CONFLICTS, True, False, False),
        (Requeue.WORKER_LOST, True, True, False),
        (Requeue.HANDOFF, False, False, False),  # the handing-over job is still running
        (Requeue.TAKE_OVER, True, True, False),
    ],
    ids=lambda v: v.value if isinstance(v, Requeue) else None,
)
def test_requeue_jobs(why: Requeue, job: bool, replace: bool, clears_cancel: bool) -> None:
    assert rules.needs_job(why) is job
    assert rules.replaces_job(why) is replace
    assert rules.clears_cancel(why) is clears_cancel


def test_every_reason_has_a_row() -> None:
    for why in Requeue:
        rules.requeue(WORN, why)  # assert_never would raise for a forgotten one


@pytest.mark.parametrize(
    ("current", "new", "guard", "applies"),
    [
        (Status.RUNNING, Status.FAILED, Guard.CANCEL_WINS, True),
        (Status.REVIEWING, Status.REFUSED, Guard.CANCEL_WINS, True),
        (Status.CANCELLED, Status.FAILED, Guard.CANCEL_WINS, False),
        (Status.CANCELLED, Status.STALLED, Guard.CANCEL_WINS, False),
        (Status.CANCELLED, Status.COMPLETED, Guard.CANCEL_WINS, True),
        (Status.QUEUED, Status.CANCELLED, Guard.WHILE_ACTIVE, True),
        (Status.RUNNING, Status.CANCELLED, Guard.WHILE_ACTIVE, True),
        (Status.REVIEWING, Status.CANCELLED, Guard.WHILE_ACTIVE, True),
        (Status.MERGING, Status.CANCELLED, Guard.WHILE_ACTIVE, True),
        (Status.FAILED, Status.CANCELLED, Guard.WHILE_ACTIVE, False),
        (Status.COMPLETED, Status.CANCELLED, Guard.WHILE_ACTIVE, False),
        (Status.REVIEWING, Status.FAILED, Guard.WHILE_REVIEWING, True),
        (Status.MERGING, Status.FAILED, Guard.WHILE_REVIEWING, False),
        (Status.QUEUED, Status.FAILED, Guard.WHILE_REVIEWING, False),
        (Status.MERGING, Status.FAILED, Guard.WHILE_MERGING, True),
        (Status.REVIEWING, Status.FAILED, Guard.WHILE_MERGING, False),
        (Status.CANCELLED, Status.REFUSED, Guard.ALWAYS, True),
        (Status.MERGING, Status.COMPLETED, Guard.ALWAYS, True),
    ],
    ids=lambda v: v.value if isinstance(v, Status | Guard) else None,
)
def test_finish_guard(current: Status, new: Status, guard: Guard, applies: bool) -> None:
    record = WORN.model_copy(update={"status": current})
    changes = rules.finish(record, new, Reason.ERRORS, "why", guard)
    if not applies:
        assert changes is None
        return
    assert changes == {
        "status": new,
        "reason": "error_max_retries",
        "detail": "why",
        "phase": new.value,  # an ended loop's phase is its status
        "handed_over": False,
    }


@pytest.mark.parametrize("status", [s for s in Status if s not in TERMINAL])
def test_finish_only_ends(status: Status) -> None:
    with pytest.raises(ValueError, match="does not end a loop"):
        rules.finish(WORN, status, Reason.ERRORS, "", Guard.ALWAYS)


@pytest.mark.parametrize("status", list(Status))
def test_cancel(status: Status) -> None:
    changes = rules.cancel(WORN.model_copy(update={"status": status}), Reason.CANCELLED, "bob")
    if status not in ACTIVE:
        assert changes is None
        return
    assert changes == {
        "status": Status.CANCELLED,
        "reason": "cancelled",
        "detail": "by bob",
        "phase": "cancelled",
        "handed_over": False,
    }


@pytest.mark.parametrize(
    ("stage", "changes"),
    [
        (
            Status.REVIEWING,
            {"status": Status.REVIEWING, "phase": "reviewing", "handed_over": False},
        ),
        (Status.MERGING, {"status": Status.MERGING, "phase": "merging", "handed_over": False}),
    ],
)
def test_advance(stage: Status, changes: dict[str, Any]) -> None:
    assert rules.advance(Status.RUNNING, stage, frozenset({Status.RUNNING})) == changes


@pytest.mark.parametrize("stage", [s for s in Status if s not in rules.STAGES])
def test_advance_only_to_a_stage(stage: Status) -> None:
    with pytest.raises(ValueError, match="not a stage"):
        rules.advance(Status.RUNNING, stage, frozenset({Status.RUNNING}))


@pytest.mark.parametrize(
    ("current", "came_from", "applies"),
    [
        (Status.RUNNING, {Status.RUNNING}, True),  # the loop opened its pull request
        (Status.CANCELLED, {Status.RUNNING}, False),  # a cancel landed meanwhile: it stands
        (Status.REVIEWING, {Status.REVIEWING}, True),  # the critic passes it on
        (Status.CANCELLED, {Status.REVIEWING}, False),
        (Status.MERGING, {Status.REVIEWING}, False),  # someone else moved it already
        (Status.REFUSED, {Status.REFUSED, Status.FAILED}, True),  # a dismissal unblocks it
        (Status.COMPLETED, {Status.REFUSED, Status.FAILED}, False),
    ],
)
def test_advance_only_from_where_the_caller_read_it(
    current: Status, came_from: set[Status], applies: bool
) -> None:
    changes = rules.advance(current, Status.MERGING, frozenset(came_from))
    assert (changes is not None) is applies


@pytest.mark.parametrize(
    ("why", "current", "applies"),
    [
        (Requeue.RESTART, Status.CANCELLED, True),  # a person's restart, decided under lock
        (Requeue.FINDINGS, Status.REVIEWING, True),
        (Requeue.FINDINGS, Status.CANCELLED, False),  # cancelled during the review: stands
        (Requeue.FINDINGS, Status.MERGING, False),
        (Requeue.CHECKS, Status.MERGING, True),
        (Requeue.CHECKS, Status.CANCELLED, False),  # cancelled at the gate: stands
        (Requeue.CONFLICTS, Status.MERGING, True),
        (Requeue.CONFLICTS, Status.REFUSED, False),
        (Requeue.HANDOFF, Status.RUNNING, True),
        (Requeue.HANDOFF, Status.CANCELLED, False),  # cancelled while draining: stands
        (Requeue.WORKER_LOST, Status.RUNNING, True),
        (Requeue.WORKER_LOST, Status.QUEUED, True),
        (Requeue.WORKER_LOST, Status.CANCELLED, False),
        (Requeue.TAKE_OVER, Status.QUEUED, True),
        (Requeue.TAKE_OVER, Status.COMPLETED, False),
    ],
)
def test_requeue_applies_only_to_the_status_its_sender_read(
    why: Requeue, current: Status, applies: bool
) -> None:
    assert rules.requeue_applies(current, why) is applies


def test_running_and_revive() -> None:
    assert rules.running() == {"status": Status.RUNNING, "phase": "preparing", "handed_over": False}
    assert rules.revive(WORN) == {"auto_resumes": 2}


OUT = "this issue's money budget is spent"


@pytest.mark.parametrize(
    ("status", "restart", "lease_alive", "out_of_budget", "job_pending", "decision"),
    [
        # No loop yet: created, by the label or a restart, unless its job is pending.
        (None, False, False, "", False, Create()),
        (None, True, False, "", False, Create()),
        (None, False, False, "", True, Refused(PENDING_JOB)),
        # The label on a loop that runs or completed: refused by the record.
        (
            Status.RUNNING,
            False,
            False,
            "",
            False,
            Refused("a loop is already running for this issue"),
        ),
        (Status.COMPLETED, False, False, "", False, Refused("this issue's loop already completed")),
        # The label on a stopped loop resumes it.
        (Status.FAILED, False, False, "", False, Restart()),
        # A restart: of a stopped loop, or of an active one whose worker is dead.
        (Status.FAILED, True, False, "", False, Restart()),
        (Status.CANCELLED, True, True, "", False, Restart()),
        (Status.RUNNING, True, False, "", False, Restart()),
        (
            Status.RUNNING,
            True,
            True,
            "",
            False,
            Refused("this loop is running and its worker is alive"),
        ),
        (
            Status.COMPLETED,
            True,
            False,
            "",
            False,
            Refused("this loop completed; it is history and cannot be restarted"),
        ),
        # Then the budget (a restart never refills it), then the job: in this order.
        (Status.FAILED, True, False, OUT, False, Refused(OUT)),
        (Status.FAILED, True, False, OUT, True, Refused(OUT)),
        (Status.FAILED, True, False, "", True, Refused(PENDING_JOB)),
        (
            Status.RUNNING,
            False,
            False,
            OUT,
            True,
            Refused("a loop is already running for this issue"),
        ),
    ],
)
def test_may_start(
    status: Status | None,
    restart: bool,
    lease_alive: bool,
    out_of_budget: str,
    job_pending: bool,
    decision: rules.Start,
) -> None:
    record = None if status is None else WORN.model_copy(update={"status": status})
    got = rules.may_start(
        record,
        restart=restart,
        lease_alive=lease_alive,
        out_of_budget=out_of_budget,
        job_pending=job_pending,
    )
    assert got == decision
