"""When an agent turn stops: pure decisions over plain values.

The turn (``jobs.agents.agent``) does the I/O: model calls, tool runs, the budget pre-check. At
each point where the turn may end it asks one of these, and gets back either ``Go`` (make
the call, run the tools, run this tool, retry) or the stop that ends the turn. Every stop
carries the ``end`` and ``detail`` the turn's outcome reports, so the wording lives here.

The points, in the order a turn meets them:

- ``before_call``: before each model call (cancelled, shutting down, step cap);
- the issue's budget, checked by ``jobs.precall`` against the request: ``BudgetExhausted``;
- ``after_stall``: a call that timed out or lost its connection (too many in a row);
- ``after_response``: the model answered: why it stopped (``stop_reason``) decides whether
  its reply is kept, retried, continued, run, or ends the turn (and, for a refusal, the loop);
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
    "model_refused",
    "context_window",
    "output_limit",
]
DOOM_REPEATS = 3  # the same tool call this many times in a row is a doom loop
MAX_STALLS = 5  # model calls in a row that time out or lose their connection
# The most output tokens a retry of a reply cut mid-tool-call asks for: within every
# current model's output limit (the smallest, Opus 4/4.1, is 32K), and under the ~21K
# past which the SDK refuses a non-streaming call that has no explicit timeout.
MAX_OUTPUT_TOKENS = 20_000
CONTINUE = (
    "Your reply was cut off at the output token limit. Continue from where it stopped; "
    "keep each tool call small enough to fit (e.g. write a big file in parts)."
)


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


@dataclass(frozen=True)
class Refused:
    """The model declined (``stop_reason: refusal``). The reply is dropped and the loop
    ends: the docs say continuing the same conversation gets refused again."""

    explanation: str = ""  # the API's ``stop_details.explanation``, when it gives one
    end: ClassVar[Literal["model_refused"]] = "model_refused"

    @property
    def detail(self) -> str:
        why = f" ({self.explanation.rstrip('.')})" if self.explanation else ""
        return (
            f"the model declined to go on with this issue{why}. Nothing of its refused "
            "reply was kept. A person can reword the issue (or narrow what it asks for), "
            "then comment `/loop-restart`; or fix it by hand."
        )


@dataclass(frozen=True)
class ContextWindow:
    """The reply filled the model's context window (``model_context_window_exceeded``):
    it is cut, so it is dropped. The agent shrinks the conversation and asks again
    (``bot.core.rules.loop.context``); the turn ends here only when nothing more comes off."""

    end: ClassVar[Literal["context_window"]] = "context_window"
    detail: ClassVar[str] = "the conversation reached the model's context window"


@dataclass(frozen=True)
class OutputLimit:
    """A reply cut mid-tool-call again, after the retry with a larger ``max_tokens``."""

    max_tokens: int  # the retry's limit
    end: ClassVar[Literal["output_limit"]] = "output_limit"

    @property
    def detail(self) -> str:
        return (
            f"the model's reply was cut off in the middle of a tool call twice, the second "
            f"time at {self.max_tokens} output tokens; the cut call was not run or kept"
        )


@dataclass(frozen=True)
class Retry:
    """Drop the reply (its last tool call is cut: its input cannot be trusted) and make
    the same request again with this larger ``max_tokens``."""

    max_tokens: int


@dataclass(frozen=True)
class Resume:
    """Keep the reply and call again as it is (``pause_turn``): the model carries on."""


@dataclass(frozen=True)
class Continue:
    """Keep the reply (cut in its text) and ask the model to go on with ``prompt``."""

    prompt: str = CONTINUE


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
    | Refused
    | ContextWindow
    | OutputLimit
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
    *,
    step_cap: int,
    stop_reason: str | None,
    tool_calls: int,
    cut_in_call: bool = False,
    max_tokens: int = 0,
    retried: bool = False,
    explanation: str = "",
) -> Go | TextOnly | Finished | Retry | Resume | Continue | Refused | ContextWindow | OutputLimit:
    """After the model answered; ``tool_calls``: the tool_use blocks in its answer;
    ``cut_in_call``: its last block is a tool_use (with ``max_tokens``, that call's input
    is cut); ``max_tokens``: the request's limit; ``retried``: this request is already the
    retry of a cut reply; ``explanation``: a refusal's ``stop_details.explanation``.

    What the docs say to do with each stop reason
    (https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons):
    ``refusal``: never use the reply, do not continue the same conversation;
    ``model_context_window_exceeded``: the reply is truncated; ``max_tokens``: raise the
    limit (a cut tool_use: retry with a larger one) or continue; ``pause_turn``: send the
    assistant content back. Go: run the tools. A text-only turn ends on its one answer
    whatever it asked for, unless that answer must not be kept.
    """
    if stop_reason == "refusal":
        return Refused(explanation)
    if stop_reason == "model_context_window_exceeded":
        return ContextWindow()
    if stop_reason == "max_tokens" and cut_in_call:
        if retried or max_tokens >= MAX_OUTPUT_TOKENS:
            return OutputLimit(max_tokens)
        return Retry(min(2 * max_tokens, MAX_OUTPUT_TOKENS))
    if text_only(step_cap):
        return TextOnly()
    if stop_reason == "pause_turn" and tool_calls == 0:
        return Resume()
    if stop_reason == "max_tokens" and tool_calls == 0:
        return Continue()
    if stop_reason not in ("tool_use", "max_tokens", "pause_turn") or tool_calls == 0:
        return Finished()
    return Go()  # tool_use; or complete calls before a cut (or paused) text: run them


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
