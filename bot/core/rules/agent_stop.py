"""When an agent turn stops: pure decisions over plain values.

The turn (``jobs.agent``) does the I/O: model calls, tool runs, the budget pre-check. At
each point where the turn may end it asks one of these, and gets back either ``Go`` (make
the call, run the tools, run this tool, retry) or the stop that ends the turn. Every stop
carries the ``end`` and ``detail`` the turn's outcome reports, so the wording lives here.

The points, in the order a turn meets them:

- ``before_call``: before each model call (cancelled, shutting down, step cap);
- the issue's budget, checked by ``jobs.precall`` against the request: ``BudgetExhausted``;
- ``after_stall``: a call that timed out or lost its connection (too many in a row);
- ``after_response``: the model answered (text-only turn, model finished, or tools to run);
- ``before_tool``: before each tool call asked for (cancelled, shutting down, tool budget,
  doom loop);
- after a tool ran, a resource over its limit: ``ResourceLimit``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

End = Literal[
    "finished",
    "step_cap",
    "tool_budget",
    "doom_loop",
    "budget_exhausted",
    "stalled",
    "cancelled",
    "shutdown",
    "text_only",
    "resource_limit",
]
DOOM_REPEATS = 3  # the same tool call this many times in a row is a doom loop
MAX_STALLS = 5  # model calls in a row that time out or lose their connection


@dataclass(frozen=True)
class Go:
    """Nothing stops the turn here: go on."""


@dataclass(frozen=True)
class Cancelled:
    end: ClassVar[Literal["cancelled"]] = "cancelled"
    detail: ClassVar[str] = ""


@dataclass(frozen=True)
class Shutdown:
    """The worker is draining: hand the conversation over at this step."""

    end: ClassVar[Literal["shutdown"]] = "shutdown"
    detail: ClassVar[str] = ""


@dataclass(frozen=True)
class StepCap:
    step_cap: int
    end: ClassVar[Literal["step_cap"]] = "step_cap"

    @property
    def detail(self) -> str:
        return f"{self.step_cap} steps"


@dataclass(frozen=True)
class ToolBudget:
    tool_budget: int
    end: ClassVar[Literal["tool_budget"]] = "tool_budget"

    @property
    def detail(self) -> str:
        return f"{self.tool_budget} tool calls"


@dataclass(frozen=True)
class DoomLoop:
    tool: str  # the tool called with the same input DOOM_REPEATS times in a row
    end: ClassVar[Literal["doom_loop"]] = "doom_loop"

    @property
    def detail(self) -> str:
        return f"{self.tool} called {DOOM_REPEATS} times with the same input"


@dataclass(frozen=True)
class Stalled:
    stalls: int
    end: ClassVar[Literal["stalled"]] = "stalled"

    @property
    def detail(self) -> str:
        return f"{self.stalls} stalls in a row"


@dataclass(frozen=True)
class BudgetExhausted:
    """The next call could cross the issue's budget, so it is never made."""

    detail: str  # which budget, in words that say how to raise it (``jobs.precall``)
    end: ClassVar[Literal["budget_exhausted"]] = "budget_exhausted"


@dataclass(frozen=True)
class Finished:
    """The model stopped calling tools: the turn's normal end."""

    end: ClassVar[Literal["finished"]] = "finished"
    detail: ClassVar[str] = ""


@dataclass(frozen=True)
class TextOnly:
    """A turn with no step budget (``max_steps: 0``) gets one answer and no tools."""

    end: ClassVar[Literal["text_only"]] = "text_only"
    detail: ClassVar[str] = ""


@dataclass(frozen=True)
class ResourceLimit:
    detail: str  # what went over its limit
    end: ClassVar[Literal["resource_limit"]] = "resource_limit"


Stop = (
    Cancelled
    | Shutdown
    | StepCap
    | ToolBudget
    | DoomLoop
    | Stalled
    | BudgetExhausted
    | Finished
    | TextOnly
    | ResourceLimit
)


def text_only(step_cap: int) -> bool:
    """A step cap of 0 means one model call without tools, not "no call at all"."""
    return step_cap == 0


def before_call(
    *, cancelled: bool, draining: bool, steps: int, step_cap: int
) -> Go | Cancelled | Shutdown | StepCap:
    """Before each model call; ``steps``: calls the turn has made so far."""
    if cancelled:
        return Cancelled()
    if draining:
        return Shutdown()
    if not text_only(step_cap) and steps >= step_cap:
        return StepCap(step_cap)
    return Go()


def after_stall(stalls: int) -> Go | Stalled:
    """After a call that stalled; ``stalls``: in a row, this one included. Go: retry."""
    if stalls >= MAX_STALLS:
        return Stalled(stalls)
    return Go()


def after_response(
    *, step_cap: int, stop_reason: str | None, tool_calls: int
) -> Go | TextOnly | Finished:
    """After the model answered; ``tool_calls``: the tool_use blocks in its answer.

    Go: run them. A text-only turn ends on its one answer whatever it asked for.
    """
    if text_only(step_cap):
        return TextOnly()
    if stop_reason != "tool_use" or tool_calls == 0:
        return Finished()
    return Go()


def fingerprint(name: str, args: Mapping[str, Any]) -> str:
    """A tool call's identity for the doom loop: its name and its input, key order aside."""
    return name + ":" + json.dumps(args, sort_keys=True)


def remember(recent: Sequence[str], call: str) -> tuple[str, ...]:
    """The last ``DOOM_REPEATS`` fingerprints once ``call`` is added: all the loop needs."""
    return (*recent, call)[-DOOM_REPEATS:]


def is_doom_loop(recent: Sequence[str]) -> bool:
    """The last ``DOOM_REPEATS`` calls were one and the same call."""
    last = recent[-DOOM_REPEATS:]
    return len(last) == DOOM_REPEATS and len(set(last)) == 1


def before_tool(
    *,
    cancelled: bool,
    draining: bool,
    tool_calls: int,
    tool_budget: int,
    recent: Sequence[str],
    tool: str,
) -> Go | Cancelled | Shutdown | ToolBudget | DoomLoop:
    """Before running the tool call ``tool``; ``tool_calls``: calls run so far this turn;
    ``recent``: fingerprints of the latest calls asked for, this one last (``remember``).
    Go: run it."""
    if cancelled:
        return Cancelled()
    if draining:
        return Shutdown()
    if tool_calls >= tool_budget:
        return ToolBudget(tool_budget)
    if is_doom_loop(recent):
        return DoomLoop(tool)
    return Go()
