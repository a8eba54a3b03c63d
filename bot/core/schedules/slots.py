"""When a schedule runs: its cron expression (five fields, UTC, read by croniter) and the
one slot that is due ``now``. Pure: every function is given the time; none reads a clock.

The catch-up rule. A slot is due once its time has come and no run took it. When loopbot
was down over several slots, only the latest one runs when it is back: the others were
superseded by it, and a run per missed slot would start the same work several times in a
row. The latest slot is never older than the schedule's own interval (a later slot would
be the latest), so a slot missed longer ago than one interval never runs. A slot from
before the schedule was first seen (added to ``loop.yml``, or its cron changed) never runs:
adding a weekly schedule on a Wednesday does not start Monday's run at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from croniter import CroniterError, croniter

FIELDS = 5  # minute hour day-of-month month day-of-week; croniter's sixth (seconds) refused
MISSED_COUNT_CAP = 1000  # a count of missed slots stops here (every minute for a week is 10080)


class CronError(ValueError):
    """Not a five-field cron expression croniter can read."""


def check(expr: str) -> str:
    """``expr`` with its fields single-spaced, or ``CronError`` saying what is wrong."""
    fields = expr.split()
    if len(fields) != FIELDS:
        raise CronError(
            f"a cron expression has 5 fields (minute hour day month weekday, UTC); "
            f"{expr.strip()[:80]!r} has {len(fields)}"
        )
    normal = " ".join(fields)
    try:
        croniter(normal, 0.0)
    except (CroniterError, ValueError, KeyError) as exc:
        raise CronError(f"{normal!r} is not a cron expression croniter reads: {exc}") from None
    return normal


def latest(expr: str, now: float) -> float:
    """The latest slot at or before ``now`` (epoch seconds)."""
    # croniter's get_prev is strictly before its start; slots fall on whole minutes, so
    # starting a second after now's whole second finds a slot at exactly now too.
    return float(croniter(expr, math.floor(now) + 1).get_prev(float))


def following(expr: str, at: float) -> float:
    """The first slot strictly after ``at``."""
    return float(croniter(expr, at).get_next(float))


def interval(expr: str, slot: float) -> float:
    """The schedule's own interval at ``slot``: the time to the slot after it."""
    return following(expr, slot) - slot


def iso(t: float) -> str:
    """A slot as people read it: ``2026-05-04T03:00Z``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")


@dataclass(frozen=True)
class Due:
    """Run ``slot`` now; ``missed``: later-than-last slots before it that will never run."""

    slot: float
    missed: int


@dataclass(frozen=True)
class Wait:
    """Nothing is due; ``next`` is the next slot. ``why``: "ran" (the latest slot has its
    run), "before" (the latest slot is from before the schedule was first seen)."""

    next: float
    why: str


Decision = Due | Wait


def decide(expr: str, now: float, *, since: float, last: float | None) -> Decision:
    """What a schedule does at ``now``, first seen at ``since``, its last run's slot
    ``last`` (None: never ran)."""
    slot = latest(expr, now)
    if slot < since:
        return Wait(following(expr, now), "before")
    if last is not None and slot <= last:
        return Wait(following(expr, now), "ran")
    return Due(slot, missed(expr, max(since, last) if last is not None else since, slot))


def missed(expr: str, after: float, slot: float) -> int:
    """How many slots fall in [``after``, ``slot``) and after ``after``'s own run: the
    slots loopbot slept through, superseded by ``slot``."""
    count, it = 0, croniter(expr, after)
    while count < MISSED_COUNT_CAP:
        t = float(it.get_next(float))
        if t >= slot:
            break
        count += 1
    return count
