"""A response as the Responses API streams it (``stream: true``): its server-sent events,
and a stream that fails part-way."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

from bot.standins.openai.replies import Fail
from bot.standins.openai.wire import Json


def sse_events(response: Json, chunk: int = 40) -> Iterator[str]:
    """``response`` as the Responses API streams it (``stream: true``): ``response.created``
    and ``response.in_progress`` (status ``in_progress``, no output), each output item
    added, filled by deltas (a message's text part, a function call's arguments, a custom
    tool call's input, a reasoning summary) and done, then ``response.completed`` (or
    ``response.incomplete``) with the whole response. Every event's data carries its
    ``type`` and a ``sequence_number`` from 0.
    https://platform.openai.com/docs/api-reference/responses-streaming"""
    seq = itertools.count()

    def event(kind: str, data: Json) -> str:
        payload = {"type": kind, "sequence_number": next(seq), **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def pieces(s: str) -> Iterator[str]:
        for n in range(0, len(s), chunk):
            yield s[n : n + chunk]

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    opening["incomplete_details"] = None
    yield event("response.created", {"response": opening})
    yield event("response.in_progress", {"response": opening})
    for i, item in enumerate(response["output"]):
        kind = item.get("type")
        at = {"item_id": item.get("id"), "output_index": i}
        if kind == "message":
            yield event(
                "response.output_item.added",
                {"output_index": i, "item": {**item, "status": "in_progress", "content": []}},
            )
            for k, part in enumerate(item.get("content") or []):
                where = {**at, "content_index": k}
                if part.get("type") != "output_text":  # a refusal arrives whole
                    yield event("response.content_part.added", {**where, "part": part})
                    yield event("response.content_part.done", {**where, "part": part})
                    continue
                empty = {**part, "text": ""}
                yield event("response.content_part.added", {**where, "part": empty})
                text = str(part.get("text", ""))
                for piece in pieces(text):
                    yield event(
                        "response.output_text.delta", {**where, "delta": piece, "logprobs": []}
                    )
                yield event("response.output_text.done", {**where, "text": text, "logprobs": []})
                yield event("response.content_part.done", {**where, "part": part})
        elif kind == "function_call":
            opened = {**item, "status": "in_progress", "arguments": ""}
            yield event("response.output_item.added", {"output_index": i, "item": opened})
            args = str(item.get("arguments", ""))
            for piece in pieces(args):
                yield event("response.function_call_arguments.delta", {**at, "delta": piece})
            yield event(
                "response.function_call_arguments.done",
                {**at, "name": item.get("name"), "arguments": args},
            )
        elif kind == "custom_tool_call":
            opened = {**item, "status": "in_progress", "input": ""}
            yield event("response.output_item.added", {"output_index": i, "item": opened})
            given = str(item.get("input", ""))
            for piece in pieces(given):
                yield event("response.custom_tool_call_input.delta", {**at, "delta": piece})
            yield event("response.custom_tool_call_input.done", {**at, "input": given})
        elif kind == "reasoning":
            opened = {"id": item.get("id"), "type": "reasoning", "summary": []}
            yield event("response.output_item.added", {"output_index": i, "item": opened})
            for k, part in enumerate(item.get("summary") or []):
                where = {**at, "summary_index": k}
                empty = {"type": "summary_text", "text": ""}
                yield event("response.reasoning_summary_part.added", {**where, "part": empty})
                text = str(part.get("text", ""))
                for piece in pieces(text):
                    yield event("response.reasoning_summary_text.delta", {**where, "delta": piece})
                yield event("response.reasoning_summary_text.done", {**where, "text": text})
                yield event("response.reasoning_summary_part.done", {**where, "part": part})
        else:
            yield event("response.output_item.added", {"output_index": i, "item": item})
        yield event("response.output_item.done", {"output_index": i, "item": item})
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield event(final, {"response": response})


def failed_events(response: Json, fail: Fail) -> Iterator[str]:
    """A stream that starts and then fails: ``response.created``, ``response.in_progress``
    and ``response.failed`` with the error."""
    seq = itertools.count()
    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    failed = {**opening, "status": "failed"}
    failed["error"] = {"code": fail.code or fail.type, "message": fail.message}
    for kind, resp in (
        ("response.created", opening),
        ("response.in_progress", opening),
        ("response.failed", failed),
    ):
        payload = {"type": kind, "sequence_number": next(seq), "response": resp}
        yield f"event: {kind}\ndata: {json.dumps(payload)}\n\n"
