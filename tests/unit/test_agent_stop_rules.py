"""When an agent turn stops (bot.core.rules.loop.agent_stop): one table row per case."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.rules.loop.agent_stop import (
    DOOM_REPEATS,
    MAX_OUTPUT_TOKENS,
    MAX_STALLS,
    BudgetExhausted,
    Cancelled,
    ContextWindow,
    Continue,
    DoomLoop,
    Finished,
    Go,
    OutputLimit,
    Refused,
    ResourceLimit,
    Resume,
    Retry,
    Shutdown,
    Stalled,
    StepCap,
    Stop,
    TextOnly,
    ToolBudget,
    after_response,
    after_stall,
    before_call,
    before_tool,
    fingerprint,
    is_doom_loop,
    remember,
)

# -- before each model call ------------------------------------------------------------

# (cancelled, draining, steps, step_cap) -> decision
BEFORE_CALL: list[tuple[str, bool, bool, int, int, object]] = [
    ("first step", False, False, 0, 30, Go()),
    ("one below the cap", False, False, 29, 30, Go()),
    ("exactly at the cap", False, False, 30, 30, StepCap(30)),
    ("past the cap", False, False, 31, 30, StepCap(30)),
    ("cap of one, after one step", False, False, 1, 1, StepCap(1)),
    ("text only: cap 0 still makes its call", False, False, 0, 0, Go()),
    ("cancelled", True, False, 0, 30, Cancelled()),
    ("draining", False, True, 0, 30, Shutdown()),
    ("cancelled wins over draining", True, True, 0, 30, Cancelled()),
    ("cancelled wins over the cap", True, False, 30, 30, Cancelled()),
    ("draining wins over the cap", False, True, 30, 30, Shutdown()),
]


@pytest.mark.parametrize(
    ("cancelled", "draining", "steps", "step_cap", "want"),
    [row[1:] for row in BEFORE_CALL],
    ids=[row[0] for row in BEFORE_CALL],
)
def test_before_call(
    cancelled: bool, draining: bool, steps: int, step_cap: int, want: object
) -> None:
    got = before_call(cancelled=cancelled, draining=draining, steps=steps, step_cap=step_cap)
    assert got == want


# -- after a call that stalled ---------------------------------------------------------

AFTER_STALL: list[tuple[str, int, object]] = [
    ("first stall", 1, Go()),
    ("one below the limit", MAX_STALLS - 1, Go()),
    ("exactly at the limit", MAX_STALLS, Stalled(MAX_STALLS)),
    ("past the limit", MAX_STALLS + 1, Stalled(MAX_STALLS + 1)),
]


@pytest.mark.parametrize(
    ("stalls", "want"), [row[1:] for row in AFTER_STALL], ids=[row[0] for row in AFTER_STALL]
)
def test_after_stall(stalls: int, want: object) -> None:
    assert after_stall(stalls) == want


# -- after the model answered ----------------------------------------------------------

# (step_cap, stop_reason, tool_use blocks, the rest of after_response's keywords) -> decision
# "cut": the last block is a tool_use (with max_tokens: its input is cut).
CUT = {"cut_in_call": True, "max_tokens": 8192}
AFTER_RESPONSE: list[tuple[str, int, str | None, int, dict[str, Any], object]] = [
    ("tools asked for", 30, "tool_use", 2, {}, Go()),
    ("one tool asked for", 30, "tool_use", 1, {}, Go()),
    ("end_turn", 30, "end_turn", 0, {}, Finished()),
    ("stop_sequence", 30, "stop_sequence", 0, {}, Finished()),
    ("no stop reason", 30, None, 0, {}, Finished()),
    ("tool_use without a tool_use block", 30, "tool_use", 0, {}, Finished()),
    ("text only, plain answer", 0, "end_turn", 0, {}, TextOnly()),
    ("text only ignores tools asked for", 0, "tool_use", 1, {}, TextOnly()),
    ("cap of one still runs tools", 1, "tool_use", 1, {}, Go()),
    # max_tokens: a cut tool call is never run or kept, the request is retried once
    ("cut mid-tool-call: retry at twice the limit", 30, "max_tokens", 1, CUT, Retry(16384)),
    (
        "cut mid-tool-call: the retry is capped",
        30,
        "max_tokens",
        1,
        {"cut_in_call": True, "max_tokens": 16384},
        Retry(MAX_OUTPUT_TOKENS),
    ),
    ("cut mid-tool-call after complete calls", 30, "max_tokens", 3, CUT, Retry(16384)),
    (
        "cut mid-tool-call again after the retry",
        30,
        "max_tokens",
        1,
        {**CUT, "max_tokens": 16384, "retried": True},
        OutputLimit(16384),
    ),
    (
        "cut mid-tool-call at the cap already",
        30,
        "max_tokens",
        1,
        {"cut_in_call": True, "max_tokens": MAX_OUTPUT_TOKENS},
        OutputLimit(MAX_OUTPUT_TOKENS),
    ),
    ("cut in its text: ask it to continue", 30, "max_tokens", 0, {}, Continue()),
    ("cut in text after complete calls: run them", 30, "max_tokens", 2, {}, Go()),
    ("text only, cut in its text: its one answer", 0, "max_tokens", 0, {}, TextOnly()),
    # pause_turn: sent back as it is
    ("pause_turn", 30, "pause_turn", 0, {}, Resume()),
    ("pause_turn with client tool calls: answer them", 30, "pause_turn", 1, {}, Go()),
    ("text only, paused: its one answer", 0, "pause_turn", 0, {}, TextOnly()),
    # refusal: ends the turn and the loop, whatever else the reply holds
    ("refusal", 30, "refusal", 0, {}, Refused()),
    (
        "refusal with its explanation",
        30,
        "refusal",
        0,
        {"explanation": "could enable cyber harm"},
        Refused("could enable cyber harm"),
    ),
    ("refusal after a tool call", 30, "refusal", 1, {}, Refused()),
    ("text only, refused: not kept either", 0, "refusal", 0, {}, Refused()),
    # model_context_window_exceeded: the cut reply is dropped
    ("context window", 30, "model_context_window_exceeded", 0, {}, ContextWindow()),
    ("context window mid-tool-call", 30, "model_context_window_exceeded", 1, CUT, ContextWindow()),
    ("text only, context window", 0, "model_context_window_exceeded", 0, {}, ContextWindow()),
]


@pytest.mark.parametrize(
    ("step_cap", "stop_reason", "tool_calls", "more", "want"),
    [row[1:] for row in AFTER_RESPONSE],
    ids=[row[0] for row in AFTER_RESPONSE],
)
def test_after_response(
    step_cap: int, stop_reason: str | None, tool_calls: int, more: dict[str, Any], want: object
) -> None:
    got = after_response(step_cap=step_cap, stop_reason=stop_reason, tool_calls=tool_calls, **more)
    assert got == want


# -- the doom-loop window --------------------------------------------------------------

LS = fingerprint("bash", {"command": "ls"})
PWD = fingerprint("bash", {"command": "pwd"})
VIEW = fingerprint("str_replace_based_edit_tool", {"command": "view", "path": "a.py"})


def window(*calls: str) -> tuple[str, ...]:
    """The window as the turn builds it, one call at a time."""
    recent: tuple[str, ...] = ()
    for call in calls:
        recent = remember(recent, call)
    return recent


FINGERPRINTS: list[tuple[str, tuple[str, dict[str, Any]], tuple[str, dict[str, Any]], bool]] = [
    ("same name and input", ("bash", {"command": "ls"}), ("bash", {"command": "ls"}), True),
    ("key order does not matter", ("t", {"a": 1, "b": 2}), ("t", {"b": 2, "a": 1}), True),
    ("different input", ("bash", {"command": "ls"}), ("bash", {"command": "pwd"}), False),
    ("different tool, same input", ("a", {"x": 1}), ("b", {"x": 1}), False),
    ("nested values count", ("t", {"a": [1, 2]}), ("t", {"a": [2, 1]}), False),
    ("no input", ("t", {}), ("t", {}), True),
]


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [row[1:] for row in FINGERPRINTS],
    ids=[row[0] for row in FINGERPRINTS],
)
def test_fingerprint(
    one: tuple[str, dict[str, Any]], other: tuple[str, dict[str, Any]], same: bool
) -> None:
    assert (fingerprint(*one) == fingerprint(*other)) is same


DOOM: list[tuple[str, tuple[str, ...], bool]] = [
    ("no calls yet", (), False),
    ("one call", (LS,), False),
    ("threshold minus one", (LS,) * (DOOM_REPEATS - 1), False),
    ("exactly the threshold", (LS,) * DOOM_REPEATS, True),
    ("past the threshold", (LS,) * (DOOM_REPEATS + 2), True),
    ("different arguments are not repeats", (LS, PWD, LS), False),
    ("a different call last", (LS, LS, PWD), False),
    ("a different call first, then the threshold", (PWD, LS, LS, LS), True),
    ("broken by a different call", (LS, LS, PWD, LS, LS), False),
    ("different tools", (LS, VIEW, LS), False),
]


@pytest.mark.parametrize(("calls", "doom"), [row[1:] for row in DOOM], ids=[row[0] for row in DOOM])
def test_is_doom_loop(calls: tuple[str, ...], doom: bool) -> None:
    assert is_doom_loop(window(*calls)) is doom


REMEMBER: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
    ("first call", (), LS, (LS,)),
    ("grows below the threshold", (LS,), PWD, (LS, PWD)),
    ("keeps only the last DOOM_REPEATS", (LS, PWD, VIEW), LS, (PWD, VIEW, LS)),
]


@pytest.mark.parametrize(
    ("recent", "call", "want"), [row[1:] for row in REMEMBER], ids=[row[0] for row in REMEMBER]
)
def test_remember(recent: tuple[str, ...], call: str, want: tuple[str, ...]) -> None:
    assert remember(recent, call) == want


# -- before each tool call -------------------------------------------------------------

# (cancelled, draining, tool calls run, tool budget, window) -> decision
BEFORE_TOOL: list[tuple[str, bool, bool, int, int, tuple[str, ...], object]] = [
    ("first call", False, False, 0, 10, (LS,), Go()),
    ("one below the budget", False, False, 9, 10, (LS,), Go()),
    ("exactly at the budget", False, False, 10, 10, (LS,), ToolBudget(10)),
    ("past the budget", False, False, 11, 10, (LS,), ToolBudget(10)),
    ("a budget of 0 runs nothing", False, False, 0, 0, (LS,), ToolBudget(0)),
    ("doom threshold minus one", False, False, 2, 10, (LS,) * (DOOM_REPEATS - 1), Go()),
    ("doom loop at the threshold", False, False, 2, 10, (LS,) * DOOM_REPEATS, DoomLoop("bash")),
    ("repeats with different arguments", False, False, 2, 10, (LS, PWD, LS), Go()),
    ("cancelled", True, False, 0, 10, (LS,), Cancelled()),
    ("draining", False, True, 0, 10, (LS,), Shutdown()),
    ("cancelled wins over draining", True, True, 0, 10, (LS,), Cancelled()),
    ("draining wins over the budget", False, True, 10, 10, (LS,), Shutdown()),
    ("budget wins over a doom loop", False, False, 10, 10, (LS,) * DOOM_REPEATS, ToolBudget(10)),
    ("cancelled wins over a doom loop", True, False, 2, 10, (LS,) * DOOM_REPEATS, Cancelled()),
]


@pytest.mark.parametrize(
    ("cancelled", "draining", "tool_calls", "tool_budget", "recent", "want"),
    [row[1:] for row in BEFORE_TOOL],
    ids=[row[0] for row in BEFORE_TOOL],
)
def test_before_tool(
    cancelled: bool,
    draining: bool,
    tool_calls: int,
    tool_budget: int,
    recent: tuple[str, ...],
    want: object,
) -> None:
    got = before_tool(
        cancelled=cancelled,
        draining=draining,
        tool_calls=tool_calls,
        tool_budget=tool_budget,
        recent=recent,
        tool="bash",
    )
    assert got == want


# -- what each stop reports ------------------------------------------------------------

# The turn's Outcome carries these end and detail strings: the loop, the dashboard and
# the issue comments read them.
REPORTS: list[tuple[Stop, str, str]] = [
    (Cancelled(), "cancelled", ""),
    (Shutdown(), "shutdown", ""),
    (StepCap(30), "step_cap", "30 steps"),
    (ToolBudget(200), "tool_budget", "200 tool calls"),
    (DoomLoop("bash"), "doom_loop", f"bash called {DOOM_REPEATS} times with the same input"),
    (Stalled(MAX_STALLS), "stalled", f"{MAX_STALLS} stalls in a row"),
    (BudgetExhausted("dollars: $5.00 of $5.00"), "budget_exhausted", "dollars: $5.00 of $5.00"),
    (Finished(), "finished", ""),
    (TextOnly(), "text_only", ""),
    (ResourceLimit("disk over 2 GiB"), "resource_limit", "disk over 2 GiB"),
    (
        ContextWindow(),
        "context_window",
        "the conversation reached the model's context window",
    ),
    (
        OutputLimit(16384),
        "output_limit",
        "the model's reply was cut off in the middle of a tool call twice, the second time "
        "at 16384 output tokens; the cut call was not run or kept",
    ),
]


def test_a_refusal_says_what_a_person_can_do() -> None:
    stop = Refused("This request was declined because it could enable cyber harm.")
    assert stop.end == "model_refused"
    assert stop.detail.startswith(
        "the model declined to go on with this issue (This request was declined because "
        "it could enable cyber harm). "
    )
    assert "reword the issue" in stop.detail and "`/loop-restart`" in stop.detail
    # No explanation given: no empty brackets.
    assert Refused().detail.startswith("the model declined to go on with this issue. ")


@pytest.mark.parametrize(
    ("stop", "end", "detail"), REPORTS, ids=[type(row[0]).__name__ for row in REPORTS]
)
def test_each_stop_reports_its_end_and_detail(stop: Stop, end: str, detail: str) -> None:
    assert (stop.end, stop.detail) == (end, detail)
