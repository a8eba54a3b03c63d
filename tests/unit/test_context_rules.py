"""bot/core/rules/loop/context.py: shrinking a conversation keeps it valid for the Messages API
and keeps what the agent needs (the issue, its decisions, files, the latest failure)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from bot.core.rules.loop import context
from bot.core.rules.loop.context import BRIEF_MARK, Gauge
from bot.standins.anthropic import invalid

Msg = dict[str, Any]
ISSUE = "Fix add() in calc.py. Acceptance: test_add passes; ADD-CRITERION-42."


def _call(i: int, name: str = "bash", **args: Any) -> Msg:
    return {"type": "tool_use", "id": f"toolu_{i:04d}", "name": name, "input": args}


def _result(i: int, text: str) -> Msg:
    return {"type": "tool_result", "tool_use_id": f"toolu_{i:04d}", "content": text}


def conversation(steps: int, result_chars: int = 5_000, final_prompt: str = "") -> list[Msg]:
    """An issue prompt, then ``steps`` steps: the model says something and calls a tool
    (every 4th an edit), the harness answers with a big result."""
    msgs: list[Msg] = [{"role": "user", "content": [{"type": "text", "text": ISSUE}]}]
    for i in range(steps):
        if i % 4 == 3:
            call = _call(i, "str_replace_based_edit_tool", command="create", path=f"src/f{i}.py")
            call["input"]["file_text"] = "x" * 3_000
        else:
            call = _call(i, command=f"cat big{i}.txt")
        msgs.append(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": f"decision {i}: read file {i}"}, call],
            }
        )
        msgs.append({"role": "user", "content": [_result(i, f"R{i}:" + "y" * result_chars)]})
    if final_prompt:
        msgs[-1]["content"].append({"type": "text", "text": final_prompt})
    return msgs


def valid(msgs: list[Msg]) -> None:
    """The local model server's own strictness: the real API's rules on tool pairs."""
    problem = invalid({"model": "claude-test", "max_tokens": 100, "messages": msgs})
    assert problem is None, problem
    assert msgs[0]["role"] == "user"
    for a, b in itertools.pairwise(msgs):
        assert a["role"] != b["role"], "roles must alternate"


def size(msgs: list[Msg]) -> int:
    return context.chars(msgs)


# -- the gauge ---------------------------------------------------------------------------------


def test_gauge_starts_on_the_safe_side_then_learns_the_ratio() -> None:
    g = Gauge()
    assert g.estimate(3_000) > 1_000  # ~3 characters a token before anything is known
    g = g.measured(tokens=1_000, size=4_000)
    assert 1_000 < g.estimate(4_000) <= 1_060  # the measured ratio, rounded up a little
    assert g.measured(0, 100) == g  # an empty count teaches nothing


@pytest.mark.parametrize(
    ("estimate", "window", "expected"),
    [(69_999, 100_000, False), (70_001, 100_000, True), (41_000, 60_000, False)],
)
def test_over_the_threshold(estimate: int, window: int, expected: bool) -> None:
    assert context.over(estimate, window) is expected


def test_too_long_reads_the_api_message() -> None:
    msg = (
        "Error code: 400 - {'type': 'error', 'error': {'type': 'invalid_request_error', "
        "'message': 'prompt is too long: 212345 tokens > 200000 maximum'}}"
    )
    assert context.too_long(msg) == (212_345, 200_000)
    assert context.too_long("max_tokens: 1 > 0") is None


# -- level 1: clear ----------------------------------------------------------------------------


def test_clear_keeps_the_latest_results_and_notes_the_rest() -> None:
    msgs = conversation(10)
    out, n = context.clear(msgs, keep_results=3)
    valid(out)
    assert msgs == conversation(10), "the input is not changed"
    results = [b for m in out for b in m["content"] if b.get("type") == "tool_result"]
    kept = [r for r in results if r["content"].startswith("R")]
    assert [r["tool_use_id"] for r in kept] == ["toolu_0007", "toolu_0008", "toolu_0009"]
    note = results[0]["content"]
    assert "bash: cat big0.txt" in note and "5003 characters" in note and "again" in note
    assert n >= 7
    # The big input of an old file write is cleared; the path stays.
    old_write = out[2 * 3 + 1]["content"][1]
    assert old_write["input"]["path"] == "src/f3.py"
    assert old_write["input"]["file_text"].startswith("[cleared by loopbot")
    assert size(out) < size(msgs) / 2


def test_clear_twice_changes_nothing_more() -> None:
    once, _ = context.clear(conversation(10))
    twice, n = context.clear(once)
    assert twice == once and n == 0


# -- level 2: the brief ------------------------------------------------------------------------


def test_brief_keeps_issue_decisions_files_and_latest_failure() -> None:
    msgs = conversation(20, final_prompt="Turn 2: verify failed: FAILED test_add VERIFY-TAIL")
    msgs.append({"role": "assistant", "content": [_call(99, command="pytest -q")]})
    msgs.append({"role": "user", "content": [_result(99, "1 failed")]})
    shrunk = context.shrink(msgs, lambda m: size(m) < 5_000)  # only the last step stays
    assert shrunk.level == "brief"
    out = shrunk.messages
    valid(out)
    text = out[0]["content"][0]["text"]
    assert text.startswith(BRIEF_MARK)
    assert "ADD-CRITERION-42" in text  # the issue's acceptance criteria survive
    assert "src/f3.py" in text and "src/f11.py" in text  # files touched
    assert "decision 0: read file 0" in text  # decisions made
    assert "VERIFY-TAIL" in text  # the latest failure
    assert size(out) < 5_000
    # The newest step is kept verbatim, the tool pair whole.
    assert out[-2]["content"][0]["id"] == "toolu_0099"
    assert out[-1]["content"][0]["content"] == "1 failed"
    assert shrunk.summarised > 0


def test_brief_folds_as_little_as_needed() -> None:
    msgs = context.clear(conversation(30, result_chars=200))[0]  # nothing more to clear
    loose = context.shrink(msgs, lambda m: size(m) < size(msgs) * 0.5)
    tight = context.shrink(msgs, lambda m: size(m) < size(msgs) * 0.25)
    assert loose.level == tight.level == "brief"
    assert loose.summarised < tight.summarised
    assert len(loose.messages) > len(tight.messages)


def test_a_second_brief_nests_the_first() -> None:
    msgs = conversation(20, result_chars=200)
    first = context.shrink(msgs, lambda m: size(m) < size(msgs) * 0.5).messages
    more = first + conversation(20, result_chars=200)[1:]  # the loop went on
    # New ids for the new steps, so the pairs stay unique.
    for m in more[len(first) :]:
        for b in m["content"]:
            for k in ("id", "tool_use_id"):
                if k in b:
                    b[k] = b[k] + "b"
    valid(more)
    second = context.shrink(more, lambda m: size(m) < size(more) * 0.4)
    valid(second.messages)
    text = second.messages[0]["content"][0]["text"]
    assert text.count(BRIEF_MARK) == 1
    assert "ADD-CRITERION-42" in text  # still the issue, through two briefs
    record = json.loads(text[len(BRIEF_MARK) :].split("\n\n", 1)[0])
    assert record["summarised"] > first[0]["content"][0]["text"].count("decision")


def test_thinking_blocks_in_kept_messages_are_untouched() -> None:
    msgs = conversation(8, result_chars=300)
    signed = {"type": "thinking", "thinking": "hmm", "signature": "c2ln"}
    msgs[-2]["content"].insert(0, dict(signed))
    out = context.shrink(msgs, lambda m: size(m) < size(msgs) * 0.4).messages
    assert out[-2]["content"][0] == signed


# -- level 3: clip -----------------------------------------------------------------------------


def test_one_huge_latest_result_is_clipped() -> None:
    msgs = conversation(3, result_chars=100)
    msgs.append({"role": "assistant", "content": [_call(50, command="cat huge")]})
    msgs.append({"role": "user", "content": [_result(50, "z" * 200_000)]})
    shrunk = context.shrink(msgs, lambda m: size(m) < 20_000)
    assert shrunk.level == "clip" and shrunk.clipped == 1
    valid(shrunk.messages)
    last = shrunk.messages[-1]["content"][0]["content"]
    assert len(last) < 9_000 and "more characters" in last


def test_nothing_to_shrink_says_none() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    shrunk = context.shrink(msgs, lambda m: False)
    assert shrunk.level == "none" and shrunk.messages == msgs
