"""What changes with a loop's status: pure rules, no I/O.

``jobs/lifecycle.py`` is the one place that writes a loop's status. It asks these
functions which fields go with each change, so "back to coding" means the same thing
whoever sends a loop there (a person, the critic, the gate, the reconciler, a worker
shutting down), and a status is never written without them.

Each function returns the changes as ``{field: value}``, to apply to the record read in
the same atomic update; ``None`` means the change does not apply to the record as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

from bot.core.record import (
    ACTIVE,
    SPEND_PHASE,
    TERMINAL,
    LoopRecord,
    Reason,
    Status,
    can_restart,
    should_start,
)
from bot.core.rules.loop import sections

Changes = dict[str, Any]


@dataclass(frozen=True)
class Create:
    """The issue has no loop yet: create one."""


@dataclass(frozen=True)
class Restart:
    """Resume the issue's loop (``Requeue.RESTART``)."""


@dataclass(frozen=True)
class Refused:
    why: str  # said to the person who asked


Start = Create | Restart | Refused
PENDING_JOB = "a loop job is already queued"


def may_start(
    record: LoopRecord | None,
    *,
    restart: bool,
    lease_alive: bool,
    out_of_budget: str,
    job_pending: bool,
) -> Start:
    """Whether the ready label (``restart=False``) or a person's restart may start the
    issue's loop, checked in this order: what the record allows (``should_start``, or
    ``can_restart``, which restarts a dead worker's loop: ``lease_alive``), then the
    issue's budget (``out_of_budget``: which one is out, or ""; a restart never refills
    it), then the loop's job (``job_pending``: one is queued or running already)."""
    if restart and record is not None:
        ok, why = can_restart(record, lease_alive)
    else:
        ok, why = should_start(record)
    if not ok:
        return Refused(why)
    if record is not None and out_of_budget:
        return Refused(out_of_budget)
    if job_pending:
        return Refused(PENDING_JOB)
    return Create() if record is None else Restart()


class Requeue(StrEnum):
    """Why a loop goes (back) to the queue for coding turns."""

    RESTART = "restart"  # a person asked for another go: ready label, /loop-restart, feedback
    FINDINGS = "findings"  # the critic found blocking (sev1) problems
    CHECKS = "checks"  # the pull request's required checks fail
    CONFLICTS = "conflicts"  # the pull request conflicts with its base, or is behind it
    WORKER_LOST = "worker_lost"  # its worker died (the lease lapsed): another one goes on
    HANDOFF = "handoff"  # its worker is shutting down and hands it over
    TAKE_OVER = "take_over"  # a live worker picks up a loop that was handed over
    # The critic approved and loop.yml has a post_action: one more turn (jobs/loop/job.py).
    POST_ACTION = "post_action"
    # A writer dismissed the section audit's sev1 that stopped the loop: it goes on.
    DISMISSED = "dismissed"


def requeue(record: LoopRecord, why: Requeue, *, note: str = "", actor: str = "") -> Changes:
    """The changes that send ``record`` to the queue for ``why``.

    Whatever the reason it keeps its identity, branch, conversation and findings.
    ``note`` is what the agent's next prompt says first (why it continues); ``actor``
    names the person who restarted it.
    """
    queued: Changes = {
        "status": Status.QUEUED,
        "phase": "queued",
        "handed_over": why is Requeue.HANDOFF,
    }
    match why:
        case Requeue.RESTART:
            return queued | {
                # A fresh turn, error and review budget (never a fresh money or hours
                # budget: bot/core/rules/loop/budget.py). Idle turns too: a stop for
                # no_changes must not recur at the first idle turn; and review rounds:
                # a loop stopped for critic_rounds_exhausted would stop again at once.
                "turn": 0,
                "error_count": 0,
                "idle_turns": 0,
                "critic_round": 0,
                "sev1_rounds": {},
                "reason": "",
                "detail": "",
                "restarts": record.restarts + 1,
                # Milestones: a section's audit rounds start over too.
                **({"sections": sections.restarted(record.sections)} if record.sections else {}),
                "resume_note": note
                or record.resume_note
                or f"@{actor} restarted this loop; continue from the last commit.",
            }
        case Requeue.FINDINGS:
            # The findings get a fresh turn budget; critic.max_rounds bounds the whole.
            return queued | {"turn": 0, "resume_note": note}
        case Requeue.CHECKS:
            # Fix turns are counted (merge.max_fix_turns) and the gate's wait starts over.
            return queued | {
                "turn": 0,
                "check_fixes": record.check_fixes + 1,
                "gate_since": 0.0,
                "resume_note": note,
            }
        case Requeue.CONFLICTS:
            # As for checks, and the loop merges the base in before its next turn.
            return requeue(record, Requeue.CHECKS, note=note) | {"sync_base": True}
        case Requeue.WORKER_LOST:
            return queued | {
                "auto_resumes": record.auto_resumes + 1,
                "resume_note": f"The worker running turn {record.turn} stopped; you are "
                "continuing on another worker from the last pushed commit.",
            }
        case Requeue.HANDOFF:
            # ``handed_over`` is what the reconciler reads; the phase says it to people
            # (and to a reconciler of the version before, which read the phase).
            return queued | {
                "phase": "handoff",
                "resume_note": note or "Your worker shut down between turns; carry on.",
            }
        case Requeue.TAKE_OVER:
            return queued  # the note the handing-over worker left stands
        case Requeue.POST_ACTION:
            # Not a coding round: the turn count and findings stay as the review left them.
            return queued | {"resume_note": note}
        case Requeue.DISMISSED:
            # Not a restart: the rounds used stay used. The section passes, or is audited
            # again, before any turn; either way the next turns start a fresh count.
            return queued | {"turn": 0, "reason": "", "detail": "", "resume_note": note}
        case _:
            assert_never(why)


def requeue_applies(current: Status, why: Requeue) -> bool:
    """Whether sending a loop that is ``current`` to the queue for ``why`` still applies.

    Each sender acts on the status it read before; a cancel (or another end) that landed
    since stands: the critic's findings apply only to a loop still being reviewed, the
    gate's only to one still at the gate, a handover only to a loop still running, a
    worker's replacement only to a loop still waiting for one. A person's restart was
    decided under the loop's lock (``may_start``).
    """
    match why:
        case Requeue.RESTART:
            return True
        case Requeue.FINDINGS | Requeue.POST_ACTION:
            return current is Status.REVIEWING
        case Requeue.CHECKS | Requeue.CONFLICTS:
            return current is Status.MERGING
        case Requeue.HANDOFF:
            return current is Status.RUNNING
        case Requeue.WORKER_LOST | Requeue.TAKE_OVER:
            return current in (Status.QUEUED, Status.RUNNING)
        case Requeue.DISMISSED:  # decided under the loop's lock, on the loop it read
            return current in (Status.REFUSED, Status.FAILED)
        case _:
            assert_never(why)


def needs_job(why: Requeue) -> bool:
    """Whether the loop job is enqueued with the change. A worker handing a loop over is
    still running that very job; a live worker's reconciler picks the loop up."""
    return why is not Requeue.HANDOFF


def replaces_job(why: Requeue) -> bool:
    """Whether the loop's old RQ job is known dead and may be replaced whatever RQ says."""
    return why in (Requeue.WORKER_LOST, Requeue.TAKE_OVER)


def clears_cancel(why: Requeue) -> bool:
    """Whether a cancel asked before is forgotten: only a person's restart overrides one."""
    return why is Requeue.RESTART


def running() -> Changes:
    """A worker took the loop's lease and starts preparing its turns."""
    return {"status": Status.RUNNING, "phase": "preparing", "handed_over": False}


# The phase of a loop held back by a spend cap (bot/core/spend/caps.py): queued, with no
# job and no slot, until a writer's /loop-restart (or, if the operator says so, the next
# period) finds room. The reconciler neither resumes it as lost nor puts it in line.
SPEND_HELD = SPEND_PHASE


def held_for_spend(current: Status, words: str, need_usd: float) -> Changes | None:
    """A loop about to start finds a spend cap full: it waits, queued, saying which cap;
    None when it moved on meanwhile (a cancel that landed stands)."""
    if current not in (Status.QUEUED, Status.RUNNING):
        return None
    return {
        "status": Status.QUEUED,
        "phase": SPEND_HELD,
        "detail": f"⏳ Waiting to start: {words}.",
        "waiting": None,
        "spend_need_usd": need_usd,
    }


STAGES = frozenset({Status.REVIEWING, Status.MERGING})


def advance(current: Status, stage: Status, came_from: frozenset[Status]) -> Changes | None:
    """On to the critic (``reviewing``) or the merge gate (``merging``); None when the
    loop is no longer in a status the caller moves it from (``came_from``): a cancel
    that landed meanwhile stands."""
    if stage not in STAGES:
        raise ValueError(f"{stage} is not a stage after coding")
    if current not in came_from:
        return None
    return {"status": stage, "phase": stage.value, "handed_over": False}


def revive(record: LoopRecord) -> Changes:
    """A reviewing or merging loop whose job was lost gets it again: counted against
    the same budget as a lost worker (``max_auto_resumes``)."""
    return {"auto_resumes": record.auto_resumes + 1}


class Guard(StrEnum):
    """When an end applies to the record as it is by then."""

    # The loop's own end: a cancel a person asked for meanwhile stands, unless the loop
    # completed (what is done is done).
    CANCEL_WINS = "cancel_wins"
    WHILE_ACTIVE = "while_active"  # a cancel ends only a loop that has not ended
    WHILE_REVIEWING = "while_reviewing"  # the critic gives up only on a loop waiting for it
    WHILE_MERGING = "while_merging"  # the gate gives up only on a loop waiting for it
    # The caller decided on the status it read under its own lock, or ends a loop it
    # cancelled itself (an issue closed under an open pull request is refused).
    ALWAYS = "always"


def applies(current: Status, new: Status, guard: Guard) -> bool:
    """Whether ending a loop that is ``current`` with ``new`` applies under ``guard``."""
    match guard:
        case Guard.CANCEL_WINS:
            return current is not Status.CANCELLED or new is Status.COMPLETED
        case Guard.WHILE_ACTIVE:
            return current in ACTIVE
        case Guard.WHILE_REVIEWING:
            return current is Status.REVIEWING
        case Guard.WHILE_MERGING:
            return current is Status.MERGING
        case Guard.ALWAYS:
            return True
        case _:
            assert_never(guard)


def finish(
    record: LoopRecord, status: Status, reason: Reason, detail: str, guard: Guard
) -> Changes | None:
    """The changes that end ``record`` with ``status``, or None when ``guard`` says the
    loop moved on meanwhile. The phase of an ended loop is its status."""
    if status not in TERMINAL:
        raise ValueError(f"{status} does not end a loop")
    if not applies(record.status, status, guard):
        return None
    return {
        "status": status,
        "reason": reason.value,
        "detail": detail,
        "phase": status.value,
        "handed_over": False,
    }


def cancel(record: LoopRecord, reason: Reason, actor: str) -> Changes | None:
    """Stop an active loop at a person's (or the issue's) request; None if it has ended."""
    return finish(record, Status.CANCELLED, reason, f"by {actor}", Guard.WHILE_ACTIVE)
