"""Thinking and effort on a real loop: the local model signs every thinking block it
sends (tied to the model, as the API's are) and refuses a request whose blocks were
changed or came from another model; the agent sends them back exactly, drops them when it
falls back to another model, and asks for the effort ``loop.yml`` chose. Real RQ workers,
real git, the local GitHub and model."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.loop.test_loop import assert_every_tool_use_answered, events, key, record_of
from tests.helpers import label, open_issue, sample_repo

FIX = m.replace("calc.py", "return a - b", "return a + b")
NO_REVIEW = "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
FALLBACK = "claude-haiku-4-5"  # extended thinking only: no adaptive thinking is sent to it


@pytest.fixture
def env_extra() -> dict[str, str]:
    return {
        "LOOPBOT_FALLBACK_MODEL": FALLBACK,
        "LOOPBOT_MODEL_RETRIES": "0",  # a 529 goes to the fallback at once
    }


def thinking(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        b
        for msg in msgs
        if msg["role"] == "assistant"
        for b in msg["content"]
        if b.get("type") == "thinking"
    ]


def plain(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def start(github: GitHubServer, drain: Any, yml: str) -> int:
    sample_repo(github, loop_yml=yml)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def test_thinking_blocks_go_back_signed_across_turns(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # Turn 1 edits the wrong thing (verify fails), turn 2 fixes it: one conversation.
    model.play(
        m.bash("cat calc.py"),
        m.write_file("notes.txt", "looked\n"),
        m.text("Looked around."),
        FIX,
        m.text("Fixed add to use +."),
    )
    yml = "verify: python3 -m unittest -q\nmax_turns: 3\nagent:\n  effort: low\n" + NO_REVIEW
    n = start(github, drain, yml)
    record = record_of(redis, n)
    assert (record.status, record.turn) == (Status.COMPLETED, 2), record
    for body in model.requests:
        assert body["thinking"] == {"type": "adaptive"}
        assert body["output_config"] == {"effort": "low"}  # loop.yml's choice, within the cap
    # Every reply's thinking block went back in the next request exactly as it came.
    for i, resp in enumerate(model.responses[:-1]):
        sent = [plain(b) for b in thinking(model.requests[i + 1]["messages"])]
        assert next(b for b in resp["content"] if b["type"] == "thinking") in sent
    stored = Store(redis).conversation(key(n))
    assert len(thinking(stored)) == len(model.responses)
    assert_every_tool_use_answered(stored)
    # Thinking is output: the usage the model reported, thinking included, is charged.
    charged = sum(u.output_tokens for k, u in record.usage.items() if k.endswith("/agent"))
    assert charged == sum(r["usage"]["output_tokens"] for r in model.responses)
    (chosen,) = events(redis, n, "model")
    assert (chosen["model"], chosen["thinking"], chosen["effort"]) == (
        "claude-test",
        "adaptive",
        "low",
    )


def test_a_fallback_model_is_never_sent_another_models_thinking(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.bash("cat calc.py"),
        m.Fail(529, "Overloaded", "overloaded_error"),  # the configured model is overloaded
        FIX,  # from the fallback
        m.text("Fixed add to use +."),
    )
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 2\n" + NO_REVIEW)
    record = record_of(redis, n)
    assert record.status == Status.COMPLETED, record
    first, overloaded, fallback, last = model.requests
    assert thinking(overloaded["messages"])  # claude-test's own block, to claude-test
    assert fallback["model"] == last["model"] == FALLBACK
    assert "thinking" not in fallback  # the fallback takes no adaptive thinking
    assert thinking(fallback["messages"]) == []  # nor the other model's blocks
    # claude-test's block went, and the tool loop it began became plain text.
    assert events(redis, n, "thinking_dropped") == [
        {"model": FALLBACK, "was": "claude-test", "blocks": 1, "tool_loop_closed": True}
    ]
    assert not any(b.get("type") == "tool_result" for b in fallback["messages"][-1]["content"])
    assert_every_tool_use_answered(Store(redis).conversation(key(n)))
    del first


def test_a_changed_thinking_block_is_refused_by_the_local_model(model: AnthropicServer) -> None:
    """The strictness the tests above rely on: the local model checks each signature."""
    import anthropic

    client = anthropic.Anthropic(api_key="t", base_url=model.url, max_retries=0)
    model.play(m.text("hello"), m.text("again"))
    ask = {"role": "user", "content": "hi"}
    resp = client.messages.create(
        model="claude-test", max_tokens=100, messages=[ask], thinking={"type": "adaptive"}
    )
    blocks = [b.model_dump(exclude_none=True) for b in resp.content]
    assert blocks[0]["type"] == "thinking" and blocks[0]["signature"]
    blocks[0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError, match="signature"):
        client.messages.create(
            model="claude-test",
            max_tokens=100,
            thinking={"type": "adaptive"},
            messages=[
                ask,
                {"role": "assistant", "content": blocks},
                {"role": "user", "content": "and?"},
            ],
        )
