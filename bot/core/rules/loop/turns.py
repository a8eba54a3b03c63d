"""Which loop transition comes next: pure functions over plain values.

The loop job (``jobs.loop.job``) does the I/O and asks these what to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bot.core.record import LoopRecord, Reason, Status


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


@dataclass(frozen=True)
class AskForTest(Continue):
    """Verify passes on the head, but it passed on the base too and no test changed: one
    more turn, asking for a test that captures the issue."""


MAX_IDLE_TURNS = 2  # turns in a row that change nothing before the loop stops
ASK_FOR_TEST = (
    "verify passes with your change, but it also passed on the base commit, before any "
    "change, and your change adds or changes no test. So nothing shows the issue is "
    "fixed: the existing tests do not capture it. Add a test that captures the issue, "
    "one that fails without your fix and passes with it (a test file under tests/ or "
    "named like test_*.py, *_test.go, *.test.ts, *.spec.js, as this repository does)."
)


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
    # The agent's detail names the budget (bot/core/rules/loop/budget.py).
    if end == "budget_exhausted":
        return Stop(Status.FAILED, Reason.BUDGET)
    return None


def after_turn(
    *,
    end: str,
    verify_passed: bool,
    has_changes: bool,
    cost: float,
    max_cost: float,
    verify_tail: str,
    idle_turns: int = 0,
    base_passed: bool | None = None,
    tests_changed: Sequence[str] = (),
    test_asked: bool = True,
) -> Verified | Continue | Stop:
    """What follows a turn whose changes were committed and verified.

    ``has_changes``: the branch's tree differs from the base's. ``idle_turns``: turns in
    a row, this one included, that left it identical (0 when this one changed it).
    ``base_passed``: what verify said on the base before any change (None: not known).
    ``tests_changed``: the test files the branch adds or changes; ``test_asked``: the
    loop already gave the agent its one turn to add a test.
    """
    if (cut := cut_short(end)) is not None:
        return cut
    if end == "cost_cap" or cost >= max_cost:
        return Stop(Status.FAILED, Reason.BUDGET, f"${cost:.2f} spent of ${max_cost:.2f}")
    if not has_changes:
        return _idle(idle_turns, verify_passed, verify_tail, base_passed)
    if verify_passed:
        if base_passed and not tests_changed and not test_asked:
            return AskForTest(ASK_FOR_TEST)
        return Verified()
    capped = {
        "step_cap": "You reached the step limit for one turn.",
        "tool_budget": "You used the whole tool-call budget for one turn.",
        "doom_loop": "You repeated the same tool call three times; try something else.",
    }
    lead = capped.get(end, "")
    return Continue((lead + " " if lead else "") + "verify failed:\n" + verify_tail)


def _idle(
    idle_turns: int, verify_passed: bool, verify_tail: str, base_passed: bool | None
) -> Continue | Stop:
    """A turn that left the tree identical to the base: not a success, whatever the agent
    said and whatever verify says; twice in a row stops the loop."""
    if idle_turns >= MAX_IDLE_TURNS:
        already = " although verify already passed before any change" if base_passed else ""
        return Stop(
            Status.FAILED,
            Reason.NO_CHANGES,
            f"{idle_turns} turns in a row left the branch identical to the base branch: "
            f"the agent changed nothing{already}, so nothing was fixed and no pull request "
            "was opened. If the issue is already fixed, close it. Otherwise say on the "
            "issue what is still wrong (a failing case, the expected behaviour), then "
            "comment `/loop-restart`.",
        )
    note = (
        "Your last turn left the branch identical to the base commit: nothing is "
        "changed, so nothing is fixed, whatever you concluded. A claim without a change "
        "is not a fix. Make the change the issue asks for in this turn"
    )
    if verify_passed:
        note += " (verify passing on an unchanged tree proves nothing about the issue)"
    note += f"; {MAX_IDLE_TURNS} turns in a row without a change stop the loop."
    if not verify_passed:
        note += "\n\nverify failed:\n" + verify_tail
    return Continue(note)


def started(turn: int, phase: str = "coding") -> Callable[[LoopRecord], None]:
    """The record's update as turn ``turn`` starts (a metric loop's phase: iterating)."""

    def apply(r: LoopRecord) -> None:
        r.turn, r.phase, r.resume_note = turn, phase, ""
        r.total_turns += 1  # the issue's lifetime count: no restart or review round resets it

    return apply
