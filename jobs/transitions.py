"""Which loop transition comes next: pure functions over plain values.

The loop job (``jobs.loop``) does the I/O and asks these what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bot.loopstate import Reason, Status


@dataclass(frozen=True)
class RunTurn:
    turn: int


@dataclass(frozen=True)
class Stop:
    status: Status
    reason: Reason
    detail: str = ""


@dataclass(frozen=True)
class Verified:
    """Verify passed with changes on the branch: open the PR."""


@dataclass(frozen=True)
class Continue:
    failure: str  # what the continuation prompt names


def before_turn(
    *,
    turn: int,
    max_turns: int,
    issue_open: bool,
    has_label: bool,
    cancel: str | None,
    elapsed_hours: float = 0.0,
    max_hours: float = math.inf,
    intake_edited: bool = False,
) -> RunTurn | Stop:
    """``intake_edited``: the issue's title or body differs from what a writer approved."""
    if cancel:
        passed = (Reason.ISSUE_INACTIVE, Reason.ISSUE_EDITED)
        reason = Reason(cancel) if cancel in passed else Reason.CANCELLED
        return Stop(Status.CANCELLED, reason)
    if not issue_open:
        return Stop(Status.CANCELLED, Reason.ISSUE_INACTIVE, "the issue was closed")
    if not has_label:
        return Stop(Status.CANCELLED, Reason.ISSUE_INACTIVE, "the ready label was removed")
    if intake_edited:
        return Stop(
            Status.CANCELLED,
            Reason.ISSUE_EDITED,
            "the issue's title or body changed after a writer approved it",
        )
    if turn >= max_turns:
        return Stop(Status.FAILED, Reason.MAX_TURNS, f"{turn} turns without passing verify")
    if elapsed_hours >= max_hours:
        return Stop(
            Status.FAILED,
            Reason.BUDGET,
            f"wall-clock budget: {elapsed_hours:.1f} h of {max_hours:g} h used",
        )
    return RunTurn(turn + 1)


def cut_short(end: str) -> Stop | None:
    """A turn that ended this way stops the loop before verify runs."""
    if end == "cancelled":
        return Stop(Status.CANCELLED, Reason.CANCELLED)
    if end == "stalled":
        return Stop(Status.STALLED, Reason.STALL_TIMEOUT, "the model stopped answering")
    if end == "resource_limit":
        return Stop(Status.FAILED, Reason.RESOURCE_LIMIT)
    return None


def after_turn(
    *,
    end: str,
    verify_passed: bool,
    has_changes: bool,
    cost: float,
    max_cost: float,
    verify_tail: str,
) -> Verified | Continue | Stop:
    """What follows a turn whose changes were committed and verified."""
    if (cut := cut_short(end)) is not None:
        return cut
    if end == "cost_cap" or cost >= max_cost:
        return Stop(Status.FAILED, Reason.BUDGET, f"${cost:.2f} spent of ${max_cost:.2f}")
    if verify_passed and has_changes:
        return Verified()
    if verify_passed:
        return Continue(
            "verify passes, but the branch has no changes yet: the issue is "
            "not addressed. Make the change the issue asks for."
        )
    capped = {
        "step_cap": "You reached the step limit for one turn.",
        "tool_budget": "You used the whole tool-call budget for one turn.",
        "doom_loop": "You repeated the same tool call three times; try something else.",
    }
    lead = capped.get(end, "")
    return Continue((lead + " " if lead else "") + "verify failed:\n" + verify_tail)
