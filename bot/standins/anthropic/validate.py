"""Why the API would refuse a request with a 400, in its words: its fields, ``max_tokens``,
the conversation's tool calls and results, and ``output_config.format``'s schema."""

from __future__ import annotations

from typing import Any

from bot.standins.anthropic.models import MAX_OUTPUT_TOKENS, ModelSpec
from bot.standins.anthropic.wire import Json, _blocks


def _tool_use_ids(msg: Json) -> list[str]:
    if msg.get("role") != "assistant":
        return []
    return [str(b.get("id")) for b in _blocks(msg) if b.get("type") == "tool_use"]


def invalid(body: Json, spec: ModelSpec | None = None) -> str | None:
    """Why the real Messages API would reject ``body`` with a 400, in its words; or None.

    Checks what a harness can get wrong when it stores, cuts or resumes a conversation:
    ``max_tokens`` within the model's output limit (``spec.max_output``, else
    ``MAX_OUTPUT_TOKENS``), no empty message but an optional final assistant one, every
    tool_use answered by a tool_result in the very next message, and every tool_result
    answering a tool_use of the message before.
    """
    limit = body.get("max_tokens")
    if not isinstance(limit, int) or limit < 1:
        return "max_tokens: Field required to be a positive integer"
    most = spec.max_output if spec is not None else MAX_OUTPUT_TOKENS
    if limit > most:
        return (
            f"max_tokens: {limit} > {most}, which is the maximum allowed "
            f"number of output tokens for {body.get('model')}"
        )
    return conversation_invalid(body, spec is not None and spec.system_messages)


# What structured outputs' grammar compiler refuses: bounds it cannot express (the
# caller checks them after the answer, as the SDKs do).
UNSUPPORTED_SCHEMA_KEYWORDS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
)


def format_invalid(fmt: Any) -> str | None:
    """Why the API would refuse ``output_config.format``: only ``json_schema``; every
    object with ``additionalProperties: false``; none of the keywords it cannot compile."""
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return "output_config.format.type: Input should be 'json_schema'"
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        return "output_config.format.schema: Field required"

    def walk(node: Any, where: str) -> str | None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                if (why := walk(item, f"{where}.{i}")) is not None:
                    return why
            return None
        if not isinstance(node, dict):
            return None
        for word in UNSUPPORTED_SCHEMA_KEYWORDS:
            if word in node:
                kind = node.get("type", "schema")
                return (
                    f"output_config.format.schema: For '{kind}' type, property '{word}' "
                    "is not supported"
                )
        if node.get("type") == "object" and node.get("additionalProperties") is not False:
            return (
                "output_config.format.schema: For 'object' type, 'additionalProperties' "
                f"must be explicitly set to false ({where or 'the root'})"
            )
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                for name, sub in value.items():
                    if (why := walk(sub, f"{where}.{name}")) is not None:
                        return why
            elif (
                key in ("items", "anyOf", "allOf")
                and (why := walk(value, f"{where}.{key}")) is not None
            ):
                return why
        return None

    return walk(schema, "")


def conversation_invalid(body: Json, system_messages: bool = False) -> str | None:
    """``invalid`` without ``max_tokens``: what ``count_tokens`` checks too.
    ``system_messages``: the model takes mid-conversation system messages (Opus 4.8
    only, https://platform.claude.com/docs/en/build-with-claude/mid-conversation-system-messages):
    a ``system`` message of text blocks, right after a user message."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "messages: at least one message is required"
    for i, msg in enumerate(msgs):
        if system_messages and isinstance(msg, dict) and msg.get("role") == "system":
            before = msgs[i - 1] if i > 0 else {}
            if not isinstance(before, dict) or before.get("role") != "user":
                return f"messages.{i}: a system message must come right after a user message"
            if not msg.get("content") or any(b.get("type") != "text" for b in _blocks(msg)):
                return f"messages.{i}: a system message holds text blocks only"
            continue
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            return f"messages.{i}: Input should be a message with role 'user' or 'assistant'"
        final_assistant = i == len(msgs) - 1 and msg.get("role") == "assistant"
        if not msg.get("content") and not final_assistant:
            return (
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        asked = _tool_use_ids(msgs[i - 1]) if i > 0 else []
        for k, block in enumerate(_blocks(msg)):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in asked:
                return (
                    f"messages.{i}.content.{k}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                    "block must have a corresponding `tool_use` block in the previous message."
                )
        uses = _tool_use_ids(msg)
        after = msgs[i + 1] if i + 1 < len(msgs) else {}
        answered = {
            b.get("tool_use_id")
            for b in _blocks(after)
            if after.get("role") == "user" and b.get("type") == "tool_result"
        }
        missing = [u for u in uses if u not in answered]
        if missing:
            return (
                f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                "a corresponding `tool_result` block in the next message."
            )
    return None


# The Messages API's request fields (https://docs.claude.com/en/api/messages); any
# other is refused, as the API refuses it.
REQUEST_KEYS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "tools",
        "tool_choice",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "thinking",
        "output_config",
        "context_management",
        "service_tier",
        "container",
        "mcp_servers",
        "cache_control",  # automatic prompt caching: one breakpoint the API places
        "inference_geo",
    }
)

# Request fields the API takes only with their beta named in ``anthropic-beta``.
BETA_FIELDS = {"context_management": "context-management-", "mcp_servers": "mcp-client-"}
