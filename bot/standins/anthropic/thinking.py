"""Thinking blocks: their signatures (``thinking_signature``, redacted data) and what the
API refuses about thinking and effort (``thinking_invalid``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

from bot.standins.anthropic.models import EFFORTS, THINKING_TYPES, ModelSpec
from bot.standins.anthropic.validate import format_invalid
from bot.standins.anthropic.wire import Json, _blocks

# One secret for every server, as the real API's signatures outlive any one server: a
# conversation stored before a restart of the stand-in still verifies.
SECRET = b"loopbot-local-anthropic-thinking-signatures"


def thinking_signature(model: str, thinking: str, secret: bytes = SECRET) -> str:
    """The signature of a thinking block: base64 HMAC-SHA256 of the model and the text."""
    mac = hmac.new(secret, f"{model}\0{thinking}".encode(), hashlib.sha256).digest()
    return base64.b64encode(mac).decode()


def redacted_data(model: str, secret: bytes = SECRET) -> str:
    """Opaque ``redacted_thinking`` data this server can recognise later (for ``model``)."""
    nonce = secrets.token_hex(12)
    mac = hmac.new(secret, f"redacted\0{model}\0{nonce}".encode(), hashlib.sha256).hexdigest()
    return base64.b64encode(f"{nonce}.{mac}".encode()).decode()


def _redacted_valid(model: str, data: Any, secret: bytes = SECRET) -> bool:
    try:
        nonce, mac = base64.b64decode(str(data), validate=True).decode().split(".", 1)
    except ValueError:
        return False
    want = hmac.new(secret, f"redacted\0{model}\0{nonce}".encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, want)


def _thinking_on(body: Json) -> bool:
    cfg = body.get("thinking")
    return isinstance(cfg, dict) and cfg.get("type") in ("enabled", "adaptive")


def thinking_invalid(body: Json, spec: ModelSpec) -> str | None:
    """Why the API would reject ``body``'s thinking or effort for ``spec``, in its words.

    The ``thinking`` type must be one the model accepts (``enabled`` with a budget of at
    least 1024 below ``max_tokens``), ``output_config.effort`` one of its levels (and
    ``output_config.format`` a schema the API compiles: ``format_invalid``); every
    ``thinking`` block sent back must carry the signature this server gave it, for its text
    and the request's model, and come before the message's other blocks.
    """
    cfg = body.get("thinking")
    if cfg is not None:
        kind = cfg.get("type") if isinstance(cfg, dict) else None
        if kind not in THINKING_TYPES:
            return (
                f"thinking: Input tag '{kind}' found using 'type' does not match any of the "
                "expected tags: 'adaptive', 'enabled', 'disabled', 'between_tools'"
            )
        assert isinstance(cfg, dict)
        if kind not in spec.thinking:
            if kind == "adaptive":
                return "adaptive thinking is not supported on this model"
            if "adaptive" in spec.thinking:
                return (
                    f'"thinking.type.{kind}" is not supported for this model. Use '
                    '"thinking.type.adaptive" and "output_config.effort" to control thinking '
                    "behavior."
                )
            return f'"thinking.type.{kind}" is not supported for this model.'
        if kind == "enabled":
            budget = cfg.get("budget_tokens")
            if not isinstance(budget, int) or budget < 1024:
                return (
                    "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
                )
            most = body.get("max_tokens")  # count_tokens is sent none
            if isinstance(most, int) and budget >= most:
                return (
                    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult "
                    "our documentation at https://docs.claude.com/en/docs/build-with-claude/"
                    "extended-thinking#max-tokens-and-context-window-size"
                )
        choice = body.get("tool_choice")
        forced = isinstance(choice, dict) and choice.get("type") in ("any", "tool")
        if kind in ("enabled", "adaptive") and forced:
            return "Thinking may not be enabled when tool_choice forces tool use."
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is not None and (why := format_invalid(fmt)) is not None:
        return why
    effort = config.get("effort") if isinstance(config, dict) else None
    if effort is not None:
        if effort not in EFFORTS:
            return "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
        if not spec.efforts:
            return "This model does not support the effort parameter."
        if effort not in spec.efforts:
            return (
                f"This model does not support effort level '{effort}'. Supported levels: "
                f"{', '.join(sorted(spec.efforts))}."
            )
    return _thinking_blocks_invalid(body, spec)


def _thinking_blocks_invalid(body: Json, spec: ModelSpec) -> str | None:
    msgs = body.get("messages")
    msgs = msgs if isinstance(msgs, list) else []
    for i, msg in enumerate(msgs):
        other = False
        for k, block in enumerate(_blocks(msg)):
            kind = block.get("type")
            if kind not in ("thinking", "redacted_thinking"):
                other = True
                continue
            where = f"messages.{i}.content.{k}"
            if msg.get("role") != "assistant":
                return f"{where}: `{kind}` blocks are only allowed in `assistant` messages"
            if other:
                return (
                    f"{where}: `{kind}` blocks must come before the `text` and `tool_use` "
                    "blocks of their message"
                )
            if "cache_control" in block:
                return f"{where}.cache_control: `{kind}` blocks cannot be cached directly"
            if kind == "thinking":
                sig = thinking_signature(spec.id, str(block.get("thinking", "")))
                if not hmac.compare_digest(str(block.get("signature", "")), sig):
                    return f"{where}: Invalid `signature` in `thinking` block"
            elif not _redacted_valid(spec.id, block.get("data")):
                return f"{where}: Invalid `data` in `redacted_thinking` block"
    # Mid tool loop with thinking on, the last assistant turn must open with its thinking.
    if _thinking_on(body) and len(msgs) >= 2:
        last, before = msgs[-1], msgs[-2]
        looping = last.get("role") == "user" and any(
            b.get("type") == "tool_result" for b in _blocks(last)
        )
        if looping and before.get("role") == "assistant":
            first = (_blocks(before) or [{"type": "none"}])[0].get("type")
            if first not in ("thinking", "redacted_thinking"):
                return (
                    f"messages.{len(msgs) - 2}.content.0.type: Expected `thinking` or "
                    f"`redacted_thinking`, but found `{first}`. When `thinking` is enabled, a "
                    "final `assistant` message must start with a thinking block (preceeding "
                    "the lastmost set of `tool_use` and `tool_result` blocks). We recommend "
                    "you include thinking blocks from previous turns. To avoid this "
                    "requirement, disable `thinking`. Please consult our documentation at "
                    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
                )
    return None
