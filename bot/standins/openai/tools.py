"""The tools a request offers (``check_tools``, collecting them in ``Offered``) and its
``tool_choice``, checked as the API checks them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bot.standins.openai.validate import _missing, _one_of, _strict_schema, _typed, _unknown
from bot.standins.openai.wire import Rejected

# Tools the client runs, and the hosted ones the API runs itself.
CLIENT_TOOLS = frozenset({"function", "custom", "namespace", "local_shell"})
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "code_interpreter",
        "image_generation",
        "mcp",
        "computer_use_preview",
        "tool_search",
    }
)
TOOL_TYPES = CLIENT_TOOLS | HOSTED_TOOLS

# A client tool may be deferred (loaded when the hosted ``tool_search`` finds it).
DEFERRED = ("defer_loading",)
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class Offered:
    """What the request offers the model: tool names by kind, hosted tool types."""

    functions: set[str] = field(default_factory=set)
    customs: set[str] = field(default_factory=set)
    hosted: set[str] = field(default_factory=set)
    local_shell: bool = False

    @property
    def some(self) -> bool:
        return bool(self.functions or self.customs or self.hosted or self.local_shell)


def check_tools(tools: Any, where: str, offered: Offered, nested: bool = False) -> None:
    """Why the API would refuse a ``tools`` list (raises ``Rejected``); what it offers goes
    into ``offered``."""
    _typed(tools, where, "array")
    names: set[str] = set()
    for n, tool in enumerate(tools):
        at = f"{where}[{n}]"
        _typed(tool, at, "object")
        kind = tool.get("type")
        allowed = ("function", "custom") if nested else sorted(TOOL_TYPES)
        _missing(tool, ["type"], at)
        _one_of(kind, f"{at}.type", allowed)
        if kind in HOSTED_TOOLS:
            offered.hosted.add(kind)
            if kind == "mcp":
                _missing(tool, ["server_label"], at)
            continue
        if kind == "local_shell":
            offered.local_shell = True
            continue
        _missing(tool, ["name"], at)
        name = tool["name"]
        _typed(name, f"{at}.name", "string")
        if not TOOL_NAME.match(name):
            raise Rejected(
                f"Invalid '{at}.name': string does not match pattern. Expected a string that "
                "matches the pattern '^[a-zA-Z0-9_-]+$'.",
                "invalid_value",
                f"{at}.name",
            )
        if name in names:
            raise Rejected(
                f"Duplicate tool name '{name}' in '{where}'. Tool names must be unique.",
                "invalid_value",
                f"{at}.name",
            )
        names.add(name)
        if "description" in tool:
            _typed(tool["description"], f"{at}.description", "string", "null")
        if kind == "function":
            _unknown(tool, ("type", "name", "description", "parameters", "strict", *DEFERRED), at)
            _missing(tool, ["parameters"], at)
            params = tool["parameters"]
            _typed(params, f"{at}.parameters", "object")
            if params.get("type") != "object":
                raise Rejected(
                    f"Invalid schema for function '{name}': schema must be a JSON Schema of "
                    f"'type: \"object\"', got 'type: \"{params.get('type')}\"'.",
                    "invalid_function_parameters",
                    f"{at}.parameters",
                )
            strict = tool.get("strict", True)
            _typed(strict, f"{at}.strict", "boolean", "null")
            if strict is not False:
                _strict_schema(params, name)
            offered.functions.add(name)
        elif kind == "custom":
            _unknown(tool, ("type", "name", "description", "format", *DEFERRED), at)
            fmt = tool.get("format")
            if fmt is not None:
                _typed(fmt, f"{at}.format", "object")
                _one_of(fmt.get("type"), f"{at}.format.type", ("text", "grammar"))
                if fmt["type"] == "grammar":
                    _one_of(fmt.get("syntax"), f"{at}.format.syntax", ("lark", "regex"))
                    _missing(fmt, ["definition"], f"{at}.format")
                    _typed(fmt["definition"], f"{at}.format.definition", "string")
            offered.customs.add(name)
        else:  # a namespace
            _unknown(tool, ("type", "name", "description", "tools", *DEFERRED), at)
            _missing(tool, ["tools"], at)
            check_tools(tool["tools"], f"{at}.tools", offered, nested=True)


def check_tool_choice(choice: Any, offered: Offered) -> None:
    """``tool_choice`` must be a mode, or name a tool the request offers."""
    _typed(choice, "tool_choice", "string", "object")
    if isinstance(choice, str):
        _one_of(choice, "tool_choice", ("auto", "none", "required"))
        if choice == "required" and not offered.some:
            raise Rejected(
                "Tool choice 'required' must be specified with 'tools' parameter.",
                "invalid_value",
                "tool_choice",
            )
        return
    kind = choice.get("type")
    kinds = ("function", "custom", "allowed_tools", "mcp", "local_shell", *sorted(HOSTED_TOOLS))
    _one_of(kind, "tool_choice.type", kinds)
    if kind in ("function", "custom"):
        _missing(choice, ["name"], "tool_choice")
        names = offered.functions if kind == "function" else offered.customs
        if choice["name"] not in names:
            raise Rejected(
                f"Tool choice '{kind}' not found in 'tools' parameter.",
                "invalid_value",
                "tool_choice",
            )
    elif kind == "allowed_tools":
        _one_of(choice.get("mode"), "tool_choice.mode", ("auto", "required"))
        _typed(choice.get("tools"), "tool_choice.tools", "array")
    elif kind in HOSTED_TOOLS and kind not in offered.hosted:
        raise Rejected(
            f"Tool choice '{kind}' not found in 'tools' parameter.", "invalid_value", "tool_choice"
        )
