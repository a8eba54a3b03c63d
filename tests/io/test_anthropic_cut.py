"""The local Anthropic server's cut answer (``Reply(cut_after=...)``), against the real
anthropic SDK: the connection drops mid-answer, as a network or a proxy cuts it, and the
SDK sees a broken connection, not a message (bench/chaos.py injects it)."""

from __future__ import annotations

import anthropic
import pytest

from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer

ASK = {"model": "claude-test", "max_tokens": 200, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-local-test", base_url=model.url, max_retries=0)


def test_a_cut_answer_is_a_connection_error(
    model: AnthropicServer, client: anthropic.Anthropic
) -> None:
    model.play(m.text("A long answer that never arrives whole. " * 20, cut_after=60))
    with pytest.raises(anthropic.APIConnectionError):
        client.messages.create(**ASK)  # type: ignore[call-overload]
    # The server goes on answering: the next request gets its answer whole.
    model.play(m.text("Whole."))
    assert client.messages.create(**ASK).content[0].text == "Whole."  # type: ignore[call-overload, union-attr]


def test_a_cut_stream_ends_before_message_stop(
    model: AnthropicServer, client: anthropic.Anthropic
) -> None:
    """The SDK's stream does not wrap the transport's error: what it raises is the
    HTTP client's own (peer closed the connection before the whole body)."""
    model.play(m.text("Streamed, then cut. " * 40, cut_after=400))
    kinds: list[str] = []
    with (
        pytest.raises(Exception, match="peer closed connection") as caught,
        client.messages.stream(**ASK) as stream,  # type: ignore[arg-type]
    ):
        kinds.extend(event.type for event in stream)
    assert type(caught.value).__name__ == "RemoteProtocolError"
    assert "message_stop" not in kinds
