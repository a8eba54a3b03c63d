"""The input: each item's shape (``check_item``) and the conversation the items make
(``conversation_invalid``: every call answered, every output answering a call)."""

from __future__ import annotations

from typing import Any

from bot.standins.openai.tools import Offered, check_tools
from bot.standins.openai.validate import _missing, _one_of, _typed, _unknown
from bot.standins.openai.wire import Json, Rejected

# Each input item type and the keys it may carry (a message may leave ``type`` out).
ITEM_KEYS: dict[str, frozenset[str]] = {
    "message": frozenset({"type", "id", "role", "content", "status", "phase"}),
    "function_call": frozenset(
        {"type", "id", "call_id", "name", "arguments", "status", "namespace"}
    ),
    "function_call_output": frozenset({"type", "id", "call_id", "output", "status"}),
    "custom_tool_call": frozenset(
        {"type", "id", "call_id", "name", "input", "status", "namespace"}
    ),
    "custom_tool_call_output": frozenset({"type", "id", "call_id", "output", "status"}),
    "reasoning": frozenset({"type", "id", "summary", "content", "encrypted_content", "status"}),
    "additional_tools": frozenset({"type", "id", "role", "tools"}),
    "item_reference": frozenset({"type", "id"}),
    "local_shell_call": frozenset({"type", "id", "call_id", "action", "status"}),
    "local_shell_call_output": frozenset({"type", "id", "call_id", "output", "status"}),
    "compaction": frozenset({"type", "id", "encrypted_content"}),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "message": ("role", "content"),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
    "custom_tool_call": ("call_id", "name", "input"),
    "custom_tool_call_output": ("call_id", "output"),
    "reasoning": ("summary",),
    "additional_tools": ("tools",),
    "item_reference": ("id",),
    "local_shell_call": ("call_id", "action"),
    "local_shell_call_output": ("call_id", "output"),
    "compaction": ("encrypted_content",),
}

# A call and the output that answers it.
CALLS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
}
OUTPUTS = {v: k for k, v in CALLS.items()}
ROLES = ("user", "assistant", "system", "developer")
INPUT_PARTS: dict[str, frozenset[str]] = {
    "input_text": frozenset({"type", "text"}),
    "input_image": frozenset({"type", "image_url", "file_id", "detail"}),
    "input_file": frozenset({"type", "file_id", "file_data", "file_url", "filename"}),
    "input_audio": frozenset({"type", "input_audio"}),
}
OUTPUT_PARTS: dict[str, frozenset[str]] = {
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "refusal": frozenset({"type", "refusal"}),
}


def _check_parts(content: Any, role: str, at: str) -> None:
    _typed(content, f"{at}.content", "string", "array")
    if isinstance(content, str):
        return
    parts = OUTPUT_PARTS if role == "assistant" else INPUT_PARTS
    for k, part in enumerate(content):
        where = f"{at}.content[{k}]"
        _typed(part, where, "object")
        _one_of(part.get("type"), f"{where}.type", parts)
        _unknown(part, parts[part["type"]], where)
        if part["type"] in ("input_text", "output_text"):
            _missing(part, ["text"], where)
            _typed(part["text"], f"{where}.text", "string")
        elif part["type"] == "refusal":
            _missing(part, ["refusal"], where)


def _check_output(output: Any, at: str) -> None:
    """A tool output: a string, or a list of input parts."""
    _typed(output, f"{at}.output", "string", "array")
    if isinstance(output, list):
        for k, part in enumerate(output):
            where = f"{at}.output[{k}]"
            _typed(part, where, "object")
            _one_of(part.get("type"), f"{where}.type", ("input_text", "input_image", "input_file"))
            _unknown(part, INPUT_PARTS[part["type"]], where)


def check_item(item: Any, at: str, offered: Offered) -> str:
    """The shape of one input item (raises ``Rejected``); its type."""
    _typed(item, at, "object")
    kind = item.get("type")
    if kind is None and "role" in item and "content" in item:
        kind = "message"  # an easy input message
    _missing({"type": kind}, ["type"], at)
    _one_of(kind, f"{at}.type", ITEM_KEYS)
    _unknown(item, ITEM_KEYS[kind], at)
    _missing(item, REQUIRED[kind], at)
    if "id" in item:
        _typed(item["id"], f"{at}.id", "string")
    if "call_id" in item:
        _typed(item["call_id"], f"{at}.call_id", "string")
    if kind == "message":
        _one_of(item["role"], f"{at}.role", ROLES)
        _check_parts(item["content"], item["role"], at)
    elif kind == "function_call":
        _typed(item["name"], f"{at}.name", "string")
        _typed(item["arguments"], f"{at}.arguments", "string")
    elif kind == "custom_tool_call":
        _typed(item["name"], f"{at}.name", "string")
        _typed(item["input"], f"{at}.input", "string")
    elif kind in OUTPUTS and kind != "local_shell_call_output":
        _check_output(item["output"], at)
    elif kind == "reasoning":
        _typed(item["summary"], f"{at}.summary", "array")
        for k, part in enumerate(item["summary"]):
            _typed(part, f"{at}.summary[{k}]", "object")
            _one_of(part.get("type"), f"{at}.summary[{k}].type", ("summary_text",))
        if item.get("encrypted_content") is not None:
            _typed(item["encrypted_content"], f"{at}.encrypted_content", "string")
    elif kind == "additional_tools":
        if "role" in item:
            _one_of(item["role"], f"{at}.role", ("developer",))
        check_tools(item["tools"], f"{at}.tools", offered)
    return str(kind)


def conversation_invalid(items: list[Json]) -> None:
    """The conversation must hold together (raises ``Rejected``): call ids unique, every
    tool output answering an earlier call of its kind, every call answered by a later
    output unless it is the very last item."""
    calls: dict[str, str] = {}  # call id -> call type
    answered: set[str] = set()
    for item in items:
        kind = item.get("type", "message")
        call_id = str(item.get("call_id"))
        if kind in CALLS:
            if call_id in calls:
                raise Rejected(
                    f"Duplicate value for 'call_id' of {call_id} in 'input'.",
                    "invalid_value",
                    "input",
                )
            calls[call_id] = kind
        elif kind in OUTPUTS:
            what = kind.removesuffix("_output").replace("_", " ")
            if calls.get(call_id) != OUTPUTS[kind]:
                raise Rejected(
                    f"No tool call found for {what} output with call_id {call_id}.",
                    "invalid_value",
                    "input",
                )
            if call_id in answered:
                raise Rejected(
                    f"Duplicate {what} output for call_id {call_id} in 'input'.",
                    "invalid_value",
                    "input",
                )
            answered.add(call_id)
    last = items[-1] if items else {}
    for item in items:
        kind = item.get("type", "message")
        if kind in CALLS and item.get("call_id") not in answered and item is not last:
            what = kind.replace("_", " ")
            raise Rejected(
                f"No tool output found for {what} {item.get('call_id')}.",
                "invalid_value",
                "input",
            )
