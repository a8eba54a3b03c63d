"""The one deterministic token count, used everywhere (the context window,
``/v1/responses/input_tokens``, usage), and the prompt as cacheable units (``_units``)."""

from __future__ import annotations

import json
from typing import Any

from bot.standins.openai.wire import Json

ITEM_OVERHEAD = 4  # tokens per input item (and for the instructions), on top of its JSON

# Reasoning tokens billed for a reply's hidden reasoning, by effort (unless it sets them).
REASONING_TOKENS = {
    None: 64,
    "none": 0,
    "minimal": 8,
    "low": 16,
    "medium": 64,
    "high": 256,
    "xhigh": 512,
    "max": 1024,
    "ultra": 2048,
}


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _text_tokens(s: str) -> int:
    return -(-len(s) // 4)  # four characters a token, rounded up


def _as_items(given: Any) -> list[Any]:
    """The input as a list of items: a string is one user message."""
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    return list(given) if isinstance(given, list) else []


def _units(body: Json) -> list[tuple[str, int]]:
    """The prompt in prefix order, as (canonical text, tokens) units: the tools, the
    instructions, then each input item (its ``id`` and ``status`` left out)."""
    units: list[tuple[str, int]] = []
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        key = _canon(tools)
        units.append(("t" + key, _text_tokens(key)))
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        units.append(("i" + instructions, _text_tokens(instructions) + ITEM_OVERHEAD))
    for item in _as_items(body.get("input")):
        if isinstance(item, dict):
            item = {k: v for k, v in item.items() if k not in ("id", "status")}
        key = _canon(item)
        units.append(("m" + key, _text_tokens(key) + ITEM_OVERHEAD))
    return units


def count_tokens(body: Any) -> int:
    """The input tokens of a Responses request, as this server counts them everywhere (the
    context window, ``/v1/responses/input_tokens``, usage, ``input_tokens``).

    Deterministic and monotonic: the canonical JSON (sorted keys, no spaces) of the
    ``tools`` list at four characters a token (rounded up); the ``instructions`` at four
    characters a token plus ``ITEM_OVERHEAD``; each input item's canonical JSON, its
    ``id`` and ``status`` left out, at four characters a token plus ``ITEM_OVERHEAD``. A
    string ``input`` is one user message item.
    """
    return sum(t for _, t in _units(body)) if isinstance(body, dict) else 0


def _said(item: Json) -> int:
    """The output tokens of one output item: its text, or a call's name and arguments or
    input, at four characters a token."""
    kind = item.get("type")
    if kind == "message":
        parts = item.get("content") or []
        return sum(
            _text_tokens(str(p.get("text", p.get("refusal", ""))))
            for p in parts
            if isinstance(p, dict)
        )
    if kind == "function_call":
        return _text_tokens(str(item.get("name", "")) + str(item.get("arguments", "")))
    if kind == "custom_tool_call":
        return _text_tokens(str(item.get("name", "")) + str(item.get("input", "")))
    if kind == "reasoning":
        return sum(_text_tokens(str(s.get("text", ""))) for s in item.get("summary") or [])
    return _text_tokens(_canon(item))


def output_tokens(output: list[Json], reasoning_tokens: int = 0) -> int:
    """The output tokens of a reply: its items, and the hidden reasoning's tokens (billed
    in full, as ``output_tokens`` includes ``reasoning_tokens``)."""
    return max(1, sum(_said(i) for i in output) + reasoning_tokens)
