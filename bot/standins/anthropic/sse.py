"""A message as the Messages API streams it (``stream: true``): its server-sent events."""

from __future__ import annotations

import json
from collections.abc import Iterator

from bot.standins.anthropic.wire import Json


def sse_events(message: Json, chunk: int = 40) -> Iterator[str]:
    """``message`` as the Messages API streams it (``stream: true``): ``message_start``
    with the input usage, each block opened, filled by deltas (text, thinking and its
    signature, a tool call's input as JSON fragments) and closed, then ``message_delta``
    with the stop reason and the output usage, and ``message_stop``; a ``ping`` after
    the start, as the API sends. https://docs.claude.com/en/api/messages-streaming"""

    def event(kind: str, data: Json) -> str:
        return f"event: {kind}\ndata: {json.dumps(data | {'type': kind})}\n\n"

    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}
    start.pop("stop_details", None)
    yield event("message_start", {"message": start})
    yield event("ping", {})
    for i, block in enumerate(message["content"]):
        kind = block.get("type")
        if kind == "text":
            yield event("content_block_start", {"index": i, "content_block": {**block, "text": ""}})
            text = str(block.get("text", ""))
            for n in range(0, len(text), chunk):
                delta = {"type": "text_delta", "text": text[n : n + chunk]}
                yield event("content_block_delta", {"index": i, "delta": delta})
        elif kind == "thinking":
            opened = {"type": "thinking", "thinking": "", "signature": ""}
            yield event("content_block_start", {"index": i, "content_block": opened})
            thought = str(block.get("thinking", ""))
            for n in range(0, len(thought), chunk):
                delta = {"type": "thinking_delta", "thinking": thought[n : n + chunk]}
                yield event("content_block_delta", {"index": i, "delta": delta})
            signed = {"type": "signature_delta", "signature": block.get("signature", "")}
            yield event("content_block_delta", {"index": i, "delta": signed})
        elif kind == "tool_use":
            yield event(
                "content_block_start", {"index": i, "content_block": {**block, "input": {}}}
            )
            raw = json.dumps(block.get("input", {}))
            for n in range(0, len(raw), chunk):
                delta = {"type": "input_json_delta", "partial_json": raw[n : n + chunk]}
                yield event("content_block_delta", {"index": i, "delta": delta})
        else:  # redacted thinking and the like arrive whole
            yield event("content_block_start", {"index": i, "content_block": block})
        yield event("content_block_stop", {"index": i})
    end: Json = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    if message.get("stop_details") is not None:
        end["stop_details"] = message["stop_details"]
    yield event("message_delta", {"delta": end, "usage": usage})
    yield event("message_stop", {})
