"""The one deterministic token count, used everywhere (the context window,
``/v1/messages/count_tokens``, usage), and the prompt as cacheable positions (``_units``)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from bot.core import attachments
from bot.standins.anthropic.wire import Json

BLOCK_OVERHEAD = 3  # tokens per content block, on top of its text
MESSAGE_OVERHEAD = 3  # tokens per message (its role and turn markers)


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _text_tokens(s: str) -> int:
    return -(-len(s) // 4)  # about four characters a token, rounded up


def _uncached(block: Json) -> Json:
    return {k: v for k, v in block.items() if k != "cache_control"}


def block_tokens(block: Any) -> int:
    """The tokens of one content block: what it says (text, a call's name and input, a
    result's content, thinking) at four characters a token, plus a small overhead."""
    if not isinstance(block, dict):
        return BLOCK_OVERHEAD + _text_tokens(block if isinstance(block, str) else _canon(block))
    kind = block.get("type")
    if kind == "text":
        said = str(block.get("text", ""))
    elif kind in ("tool_use", "server_tool_use"):
        said = str(block.get("name", "")) + _canon(block.get("input", {}))
    elif kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            return BLOCK_OVERHEAD + sum(block_tokens(b) for b in content)
        said = content if isinstance(content, str) else ""
    elif kind == "thinking":
        said = str(block.get("thinking", ""))
    elif kind == "redacted_thinking":
        said = str(block.get("data", ""))
    elif kind == "image" and (pixels := _image_tokens(block)) is not None:
        # As the API bills an image: by its pixels (width * height / 750), not its bytes.
        return BLOCK_OVERHEAD + pixels
    else:  # documents, anything else: its JSON, which is never less
        said = _canon({k: v for k, v in _uncached(block).items() if k != "type"})
    return BLOCK_OVERHEAD + _text_tokens(said)


def _image_tokens(block: Json) -> int | None:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        return None
    try:
        data = base64.b64decode(str(source.get("data", "")), validate=True)
    except ValueError:
        return None
    size = attachments.image_size(data)
    return None if size is None else attachments.image_tokens(*size)


@dataclass
class _Unit:
    """One cacheable position of the prompt, in prefix order (tools, system, messages)."""

    key: str  # canonical text of the position, ``cache_control`` left out
    tokens: int
    path: str  # where it is in the request, for error messages
    cache: Json | None = None  # its ``cache_control``, if it is a breakpoint
    empty: bool = False  # an empty text block, which cannot be a breakpoint


def _empty_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and not block.get("text")


def _units(body: Json) -> list[_Unit]:
    units: list[_Unit] = []
    tools = body.get("tools")
    for t, tool_def in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool_def, dict):
            key = _canon(_uncached(tool_def))
            units.append(
                _Unit("t" + key, _text_tokens(key), f"tools.{t}", tool_def.get("cache_control"))
            )
    # A string is one text block, as the API reads it: the same prefix either way.
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}] if system else []
    if isinstance(system, list):
        for k, block in enumerate(system):
            if isinstance(block, dict):
                units.append(
                    _Unit(
                        "s" + _canon(_uncached(block)),
                        block_tokens(block),
                        f"system.{k}",
                        block.get("cache_control"),
                        _empty_text(block),
                    )
                )
    # What changes the cached messages without changing them (the API's invalidation table).
    settings = _canon({"thinking": body.get("thinking"), "tool_choice": body.get("tool_choice")})
    msgs = body.get("messages")
    for i, msg in enumerate(msgs if isinstance(msgs, list) else []):
        if not isinstance(msg, dict):
            continue
        head = f"m{settings if i == 0 else ''}|{msg.get('role')}|"
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        blocks = content if isinstance(content, list) else []
        if not blocks:
            units.append(_Unit(head, MESSAGE_OVERHEAD, f"messages.{i}"))
        for k, block in enumerate(blocks):
            cache = block.get("cache_control") if isinstance(block, dict) else None
            key = _canon(_uncached(block) if isinstance(block, dict) else block)
            units.append(
                _Unit(
                    (head if k == 0 else "b|") + key,
                    block_tokens(block) + (MESSAGE_OVERHEAD if k == 0 else 0),
                    f"messages.{i}.content.{k}",
                    cache,
                    _empty_text(block),
                )
            )
    return units


def count_tokens(body: Json) -> int:
    """The input tokens of a Messages request, as this server counts them everywhere (the
    context window, ``/v1/messages/count_tokens``, computed usage).

    Deterministic, monotonic (more content is never fewer tokens) and, for text, never
    more than a quarter of the request's JSON (``len(json.dumps(body)) // 4``): the text
    is counted at four characters a token, the JSON around it only as a few tokens a
    block. An image counts as the API bills it, by its pixels (width * height / 750 of
    the image as the API scales it), whatever its bytes.
    """
    return sum(u.tokens for u in _units(body)) if isinstance(body, dict) else 0


def reply_tokens(content: list[Json], thinking: str = "") -> int:
    """The output tokens of a reply: its blocks, and ``thinking``, the text of its thinking
    (billed in full even when the reply shows none of it)."""
    said = sum(block_tokens(b) for b in content if b.get("type") != "thinking")
    return max(1, said + (_text_tokens(thinking) if thinking else 0))
