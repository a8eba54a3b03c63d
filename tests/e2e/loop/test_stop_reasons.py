"""Every stop reason of the Messages API, end to end: real workers, the local model.

The local model is at least as strict as the real API about what it is sent (a tool call
left unanswered, a tool result answering no call: a 400), so a broken tool call the agent
stored would fail these tests at the next request, not pass them. Each test checks the
loop's end, the stored conversation, what the model was sent next, and that every call,
a dropped reply's too, is charged.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from redis import Redis

from bot.core.record import Status
from bot.core.rules.loop.agent_stop import CONTINUE, MAX_OUTPUT_TOKENS
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.agents.agent import MAX_TOKENS
from tests.conftest import Web
from tests.e2e.loop.test_loop import (
    FIX,
    assert_every_tool_use_answered,
    events,
    key,
    record_of,
    start,
    status_comment,
)
from tests.helpers import REPO

# A reply cut in the middle of the edit that would fix calc.py: the input is partial.
CUT_FIX = m.cut_tool(
    "str_replace_based_edit_tool",
    {"command": "str_replace", "path": "calc.py"},
    say="I'll fix add.",
    usage={"input_tokens": 100, "output_tokens": MAX_TOKENS},
)


def conversation(redis: Redis, n: int) -> list[dict[str, Any]]:
    return Store(redis).conversation(key(n))


def output_charged(redis: Redis, n: int) -> int:
    """The agent's output tokens the loop record charged, every call summed."""
    usage = record_of(redis, n).usage
    return sum(u.output_tokens for k, u in usage.items() if k.endswith("/agent"))


def billed(model: AnthropicServer) -> int:
    """Output tokens the local model reported over every reply it sent."""
    return sum(int(r["usage"]["output_tokens"]) for r in model.responses)


def tool_uses(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        b
        for msg in msgs
        if msg["role"] == "assistant"
        for b in msg["content"]
        if b.get("type") == "tool_use"
    ]


def texts(msgs: list[dict[str, Any]]) -> str:
    return "\n".join(
        b.get("text", "") for msg in msgs for b in msg["content"] if isinstance(b, dict)
    )


def capped(redis: Redis, n: int) -> list[tuple[str, str]]:
    return [(e["reason"], e["detail"]) for e in events(redis, n, "turn_capped")]


def test_cut_mid_tool_call_is_retried_with_a_larger_limit(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(CUT_FIX, FIX, m.text("Fixed add to use +."))
    n = start(github, drain)
    record = record_of(redis, n)
    assert (record.status, record.reason, record.turn) == (Status.COMPLETED, "pr_opened", 1)
    first, retry, after = model.requests
    # The same request again, nothing of the cut reply in it, with twice the limit.
    assert retry["messages"] == first["messages"]
    assert (first["max_tokens"], retry["max_tokens"]) == (MAX_TOKENS, 2 * MAX_TOKENS)
    assert after["max_tokens"] == MAX_TOKENS  # back to the usual limit once a reply is kept
    stored = conversation(redis, n)
    assert "I'll fix add." not in texts(stored)
    assert [u["input"] for u in tool_uses(stored)] == [FIX.content[-1]["input"]]
    assert_every_tool_use_answered(stored)
    # The dropped reply is paid for: every reply the model sent is charged.
    assert model.responses[0]["usage"]["output_tokens"] == MAX_TOKENS
    assert output_charged(redis, n) == billed(model)
    (done,) = events(redis, n, "turn_completed")
    assert (done["end"], done["steps"], done["tool_calls"]) == ("finished", 3, 1)


def test_cut_mid_tool_call_twice_ends_the_turn_without_the_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    again = m.cut_tool("bash", {}, usage={"input_tokens": 100, "output_tokens": 2 * MAX_TOKENS})
    model.play(CUT_FIX, again, FIX, m.text("Fixed add to use +."))  # turn 2 fixes it
    n = start(github, drain)
    record = record_of(redis, n)
    assert (record.status, record.reason, record.turn) == (Status.COMPLETED, "pr_opened", 2)
    limits = [r["max_tokens"] for r in model.requests]
    assert limits == [MAX_TOKENS, 2 * MAX_TOKENS, MAX_TOKENS, MAX_TOKENS]
    ((reason, detail),) = capped(redis, n)
    assert reason == "output_limit"
    assert "cut off in the middle of a tool call twice" in detail
    assert str(2 * MAX_TOKENS) in detail
    # Turn 2 was sent no trace of either cut call: only its own fix is in the conversation.
    turn2 = model.requests[2]["messages"]
    assert tool_uses(turn2) == [] and "I'll fix add." not in texts(turn2)
    stored = conversation(redis, n)
    assert [u["name"] for u in tool_uses(stored)] == ["str_replace_based_edit_tool"]
    assert_every_tool_use_answered(stored)
    assert [r["usage"]["output_tokens"] for r in model.responses[:2]] == [
        MAX_TOKENS,
        2 * MAX_TOKENS,
    ]
    assert output_charged(redis, n) == billed(model)


def test_cut_text_is_kept_and_the_model_asked_to_continue(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.cut_text("The bug is in add: it subtracts. I will now"), FIX, m.text("Fixed."))
    n = start(github, drain)
    assert record_of(redis, n).status == Status.COMPLETED
    cut, go_on, _ = model.requests
    assert go_on["messages"][: len(cut["messages"])][:-1] == cut["messages"][:-1]
    assert go_on["messages"][-2]["role"] == "assistant"
    assert "I will now" in texts([go_on["messages"][-2]])
    assert go_on["messages"][-1] == {
        "role": "user",
        "content": [{"type": "text", "text": CONTINUE, "cache_control": {"type": "ephemeral"}}],
    }
    assert go_on["max_tokens"] == MAX_TOKENS
    assert_every_tool_use_answered(conversation(redis, n))


def test_pause_turn_sends_the_reply_back_as_it_is(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.paused("Let me look at calc.py first."), FIX, m.text("Fixed."))
    n = start(github, drain)
    assert record_of(redis, n).status == Status.COMPLETED
    paused, resumed, _ = model.requests
    # The paused content, appended as the final assistant message, and nothing else.
    assert len(resumed["messages"]) == len(paused["messages"]) + 1
    last = resumed["messages"][-1]
    assert last["role"] == "assistant"
    # Exactly as the model sent it, its signed thinking block included.
    sent_back = [{k: v for k, v in b.items() if k != "cache_control"} for b in last["content"]]
    assert sent_back == model.responses[0]["content"]
    assert [b["text"] for b in last["content"] if b["type"] == "text"] == [
        "Let me look at calc.py first."
    ]
    (done,) = events(redis, n, "turn_completed")
    assert done["steps"] == 3  # the pause counts as a step: step_cap bounds it


def test_pause_turn_is_bounded_by_the_step_cap(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.responder = lambda body: m.paused("Still thinking.")
    yml = "verify: python3 -m unittest -q\nmax_turns: 1\nmax_steps: 3\n"
    yml += "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
    n = start(github, drain, yml)
    assert len(model.requests) == 3
    assert capped(redis, n) == [("step_cap", "3 steps")]
    assert record_of(redis, n).status == Status.FAILED


def test_refusal_ends_the_loop_and_drops_the_reply(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.bash("cat calc.py"),
        m.refused("Here is how to", usage={"input_tokens": 300, "output_tokens": 7}),
        FIX,  # never asked for: the loop ends on the refusal
    )
    n = start(github, drain)
    record = record_of(redis, n)
    assert (record.status, record.reason, record.turn) == (Status.FAILED, "model_refused", 1)
    assert "declined" in record.detail and "cyber harm" in record.detail
    assert len(model.requests) == 2  # nothing was sent after the refusal
    stored = conversation(redis, n)
    assert "Here is how to" not in texts(stored)
    assert stored[-1]["role"] == "user"  # ends on the tool result the refused reply followed
    assert_every_tool_use_answered(stored)
    assert model.responses[1]["usage"]["output_tokens"] == 7
    assert output_charged(redis, n) == billed(model)  # the refused reply is billed, so charged
    body = status_comment(github)["body"]
    assert "model_refused" in body and "declined" in body and "/loop-restart" in body
    assert "Here is how to" not in body
    assert github.repo(REPO).pulls == {}


def test_context_window_ends_the_turn_without_the_cut_reply(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.bash("cat calc.py"),
        m.context_full("So the fix wou"),
        FIX,  # turn 2
        m.text("Fixed add to use +."),
    )
    n = start(github, drain)
    record = record_of(redis, n)
    assert (record.status, record.turn) == (Status.COMPLETED, 2)
    assert capped(redis, n) == [
        ("context_window", "the conversation reached the model's context window")
    ]
    turn2 = model.requests[2]["messages"]
    assert "So the fix wou" not in texts(turn2)
    stored = conversation(redis, n)
    assert "So the fix wou" not in texts(stored)
    assert_every_tool_use_answered(stored)


# -- the local model is as strict as the real API ---------------------------------------


def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=model.url, max_retries=0)


ASKED = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}],
}


@pytest.mark.parametrize(
    ("messages", "wording"),
    [
        pytest.param(
            [{"role": "user", "content": "hi"}, ASKED],
            "messages.1: `tool_use` ids were found without `tool_result` blocks "
            "immediately after: toolu_1",
            id="tool call left unanswered at the end",
        ),
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                ASKED,
                {"role": "user", "content": [{"type": "text", "text": "go on"}]},
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks",
            id="tool call answered by text",
        ),
        pytest.param(
            [
                {"role": "user", "content": "hi"},
                ASKED,
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": ""},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": ""},
                    ],
                },
            ],
            "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: toolu_2",
            id="tool result answering no call",
        ),
        pytest.param(
            [{"role": "user", "content": []}, {"role": "assistant", "content": "x"}],
            "messages.0: all messages must have non-empty content",
            id="empty message",
        ),
    ],
)
def test_the_local_model_rejects_a_broken_conversation(
    model: AnthropicServer, messages: list[dict[str, Any]], wording: str
) -> None:
    model.play(m.text("never sent"))
    with pytest.raises(anthropic.BadRequestError) as err:
        client(model).messages.create(model="claude-test", max_tokens=10, messages=messages)  # type: ignore[arg-type]
    assert err.value.status_code == 400 and wording in str(err.value)
    assert "invalid_request_error" in str(err.value)
    assert len(model.script) == 1  # a rejected request does not use the script


def test_the_local_model_rejects_max_tokens_over_the_output_limit(
    model: AnthropicServer,
) -> None:
    assert MAX_OUTPUT_TOKENS <= m.MAX_OUTPUT_TOKENS  # the agent's retry is always accepted
    body = {
        "model": "claude-test",
        "max_tokens": m.MAX_OUTPUT_TOKENS + 1,
        "messages": [{"role": "user", "content": "hi"}],
    }
    # Raw HTTP: the SDK itself refuses so large a limit without streaming.
    resp = httpx.post(f"{model.url}/v1/messages", json=body, headers={"x-api-key": "test"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "maximum allowed number of output tokens" in error["message"]


def test_the_sdk_parses_every_stop_reason_the_local_model_gives(model: AnthropicServer) -> None:
    replies = [
        m.cut_tool("bash", {}),
        m.cut_text("a"),
        m.paused("b"),
        m.refused("c"),
        m.context_full("d"),
    ]
    model.play(*replies)
    got = [
        client(model).messages.create(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        for _ in replies
    ]
    assert [r.stop_reason for r in got] == [
        "max_tokens",
        "max_tokens",
        "pause_turn",
        "refusal",
        "model_context_window_exceeded",
    ]
    assert got[0].content[-1].type == "tool_use"
    details = got[3].stop_details
    assert details is not None and details.type == "refusal" and details.category == "cyber"
