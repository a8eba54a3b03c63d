"""An answer read as it streams back through the gateway (server-sent events) and the usage
and content the Messages API reports in it: what is charged and logged, apart from the server."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from bot.core.pricing import usage_from
from bot.core.record import Usage


class SseReader:
    """An answer read as it streams by: each server-sent event's JSON ``data`` to
    ``_event``; without a stream, the whole body kept in ``whole``. (Both APIs' usage
    readers: Anthropic's ``MessagesUsage`` here, OpenAI's in ``jobs.gateway.responses``.)"""

    buffer = b""
    whole = b""

    def feed(self, chunk: bytes, *, stream: bool) -> None:
        if not stream:
            self.whole += chunk
            return
        self.buffer += chunk
        while b"\n\n" in self.buffer:
            event, self.buffer = self.buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    with contextlib.suppress(ValueError):
                        self._event(json.loads(line[5:]))

    def _event(self, data: Any) -> None:
        raise NotImplementedError


class MessagesUsage(SseReader):
    """An answer's usage and content, read as it streams by (or whole, without a stream)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.buffer = b""
        self.fields: dict[str, int] = {}
        self.split: dict[str, Any] = {}
        # The request asked for a 1-hour cache write: an answer whose usage does not split
        # its writes by TTL has every write priced as a 1-hour one, never less.
        self.long_cache = False
        self.stop_reason = ""
        self.done = False
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial: dict[int, str] = {}
        self.whole = b""

    def _event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "message_start":
            self._count(data.get("message", {}).get("usage") or {})
        elif kind == "message_delta":
            self._count(data.get("usage") or {})
            self.stop_reason = str((data.get("delta") or {}).get("stop_reason") or "")
        elif kind == "message_stop":
            self.done = True
        elif kind == "content_block_start":
            self.blocks[int(data.get("index", 0))] = dict(data.get("content_block") or {})
        elif kind == "content_block_delta":
            i, delta = int(data.get("index", 0)), data.get("delta") or {}
            block = self.blocks.setdefault(i, {})
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                self.partial[i] = self.partial.get(i, "") + str(delta.get("partial_json", ""))

    def _count(self, usage: dict[str, Any]) -> None:
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ):
            value = usage.get(name)
            if isinstance(value, int):
                self.fields[name] = value  # cumulative: the latest figure is the total
        split = usage.get("cache_creation")
        if isinstance(split, dict):  # the writes by TTL: a 1-hour one costs 2x input
            self.split = split

    def usage(self) -> Usage | None:
        if self.whole:
            try:
                message = json.loads(self.whole)
            except ValueError:
                return None
            self.stop_reason = str(message.get("stop_reason") or "")
            self.blocks = dict(enumerate(message.get("content") or []))
            self._count(message.get("usage") or {})
        if not self.fields:
            return None
        split = self.split
        if not split and self.long_cache:
            split = {"ephemeral_1h_input_tokens": self.fields.get("cache_creation_input_tokens", 0)}
        return usage_from(self.model, _Fields({**self.fields, "cache_creation": split}))

    def content(self) -> list[dict[str, Any]]:
        out = []
        for i in sorted(self.blocks):
            block = dict(self.blocks[i])
            if i in self.partial:
                with contextlib.suppress(ValueError):
                    block["input"] = json.loads(self.partial[i] or "{}")
            if block.get("type") in ("text", "tool_use"):
                out.append(block)
        return out


class _Fields:
    """Usage figures as ``usage_from`` reads them (attributes)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)
