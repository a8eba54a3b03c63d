"""What the reconciler does with a loop nobody seems to run: pure rules, no I/O.

``jobs/reconciler.py`` reads the facts (the record, whether a worker holds the lease, the
state of the loop's RQ job, the clock and the settings), asks these rules, and does what
they say through ``jobs/lifecycle.py``.

- A queued or running loop whose lease lapsed lost its worker: it is resumed on another
  worker (``Resume``), at most ``max_auto_resumes`` times, then ``Stall``. One handed over
  by a worker that shut down cleanly is resumed at once and not counted (``TakeOver``).
- A reviewing or merging loop whose critic or gate job is gone gets it again
  (``Revive``), at most ``max_auto_resumes`` times, then ``EndStranded``.
- Anything else is left alone, with the reason (``Skip``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bot.core.record import LoopRecord, Reason, Status
from bot.core.text.messages import gave_up

# RQ's job states (rq.job.JobStatus values); None: no such job, or unreadable.
JobState = str | None
WAITING = frozenset({"queued", "scheduled", "deferred"})


@dataclass(frozen=True)
class Skip:
    why: str


@dataclass(frozen=True)
class TakeOver:
    """Handed over by a worker that shut down cleanly: resume it now, not counted."""


@dataclass(frozen=True)
class Resume:
    """Its worker was lost (the lease lapsed): resume it on another, counted."""


@dataclass(frozen=True)
class Stall:
    """Its workers were lost too often: end it as stalled."""

    detail: str


@dataclass(frozen=True)
class Revive:
    """Its critic or gate job is gone: enqueue it again, counted."""


@dataclass(frozen=True)
class EndStranded:
    """Its critic or gate job was lost too often: end it with that stage's error."""

    reason: Reason
    detail: str


Lapsed = Skip | TakeOver | Resume | Stall
Stranded = Skip | Revive | EndStranded


def handed_over(record: LoopRecord) -> bool:
    """Whether a worker that shut down cleanly left the loop for another one. A record
    written before ``handed_over`` existed said so with its phase."""
    return record.handed_over or record.phase == "handoff"


def lapsed(
    record: LoopRecord,
    *,
    leased: bool,
    job: JobState,
    now: float,
    lease_ttl: float,
    queued_grace: float,
    max_auto_resumes: int,
) -> Lapsed:
    """What to do with a queued or running loop: ``leased`` says whether a worker holds
    its lease, ``job`` is the state of its RQ job."""
    if record.status not in (Status.QUEUED, Status.RUNNING):
        return Skip("neither queued nor running")
    if leased:
        return Skip("a worker holds its lease")
    idle = now - record.updated_at
    if record.status is Status.QUEUED:
        if handed_over(record):
            if job in ("queued", "scheduled", "started"):
                return Skip("queued already, or the handing-over job is still wrapping up")
            return TakeOver()
        if job in WAITING or idle < queued_grace:
            return Skip("waiting its turn in the queue")
    else:
        if job in ("scheduled", "queued"):
            return Skip("between RQ retries after an error: the retry will take the lease")
        if idle < lease_ttl:
            return Skip("just started: the lease may not be taken yet")
    if record.auto_resumes >= max_auto_resumes:
        return Stall(f"the worker was lost {record.auto_resumes + 1} times")
    return Resume()


def stranded(
    record: LoopRecord,
    *,
    job_pending: bool,
    now: float,
    grace: float,
    max_auto_resumes: int,
) -> Stranded:
    """What to do with a reviewing or merging loop: ``job_pending`` says whether its
    critic or gate job is queued, running, scheduled or deferred."""
    if record.status not in (Status.REVIEWING, Status.MERGING):
        return Skip("neither reviewing nor merging")
    if now - record.updated_at < grace:
        return Skip("changed lately: its job may be on its way")
    if job_pending:
        return Skip("its job is pending")
    if record.auto_resumes >= max_auto_resumes:
        reviewing = record.status is Status.REVIEWING
        return EndStranded(
            Reason.CRITIC_ERROR if reviewing else Reason.GATE_ERROR,
            gave_up(
                "review" if reviewing else "merge gate",
                "its job was lost each time",
                record.auto_resumes + 1,
            ),
        )
    return Revive()


def tidy_due(summary: Mapping[str, Any], *, job_pending: bool, now: float, grace: float) -> bool:
    """Whether a merged loop's tidy-up (its branch, receipt and last status) was left
    unfinished long enough that its gate died after the merge (a worker killed): the
    gate is sent again, and finishes it. Pure."""
    return (
        bool(summary.get("tidy_pending"))
        and not job_pending
        and now - float(summary.get("updated_at") or 0.0) >= grace
    )
