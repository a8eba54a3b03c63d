"""A local server for OpenAI's Responses API that plays scripted responses.

Tests point the Codex CLI (``@openai/codex`` 0.169.0) and loopbot's model gateway at it
(``OPENAI_BASE_URL=<url>/v1``) in place of api.openai.com. ``POST /v1/responses`` answers
with the next item of the script: a response (``Reply``: messages, function and custom
tool calls, a status, usage), an HTTP error such as a 429 with its headers (``Fail``, or
a ``response.failed`` event mid-stream), after an optional delay. Or a ``responder``
callable decides from the request. Every request is recorded, body and headers, and every
response answered, for assertions. Answers stream (``stream: true``) as the API's
server-sent events, in the API's order, or come whole.

The server is at least as strict as the real API about what it is sent, and where unsure
harsher, never kinder: every check below is a 400 in the API's error shape
(``{"error": {"message", "type", "param", "code"}}``) BEFORE any script item is used, so
a request the real API would refuse fails a test instead of passing it.

* Fields: an unknown one is ``unknown_parameter``; each known one has its type and values
  checked (``max_output_tokens`` an integer from 16 to the model's output limit,
  ``reasoning.effort`` one of the model's levels, ``stream`` a boolean, ``temperature`` and
  ``top_p`` refused by reasoning models, ``include: ["reasoning.encrypted_content"]``
  only with ``store: false``; ``store`` defaults to true, as the API's does).
* The model: a catalogue (``ModelSpec``, ``GET /v1/models``); an unknown id is
  ``model_not_found``. Its ``window`` is the most input tokens a request may hold, by one
  deterministic count (``count_tokens``) used everywhere: over it is
  ``context_length_exceeded`` (unless ``truncation: "auto"``, which drops the oldest
  items instead). ``POST /v1/responses/input_tokens`` checks the same (its own, shorter
  list of fields) but answers the count over the window too: that is how a client learns.
* The input: a string or a list of known items, each with its required fields and no
  unknown ones; message roles and content part types as the API takes them; a consistent
  conversation (every tool output answers an earlier call of its kind, every call is
  answered unless it is the very last item, call ids unique); ``reasoning`` items given
  back must carry the ``encrypted_content`` this server issued to the same model (an HMAC
  of the item id and the model), or name a stored one; a call or message this server
  issued with a reasoning item must come back after that reasoning item.
* Tools: every tool type known (``tools`` and ``additional_tools`` input items, whose
  ``namespace`` entries nest function and custom tools), function tools with a name and an
  object schema, strict schemas (the default) closed and fully required; ``tool_choice``
  naming an offered tool. The hosted (server-side) tool types seen are recorded in
  ``hosted_tools``.
* State: ``previous_response_id`` must name a response this server stored (``store`` not
  false) and its conversation is prepended to the input; ``item_reference`` must name a
  stored item; there are no conversations, stored prompts or background responses.

And the answer is checked against the request as a model would honour it: a scripted call
of a tool the request does not offer (or any call under ``tool_choice: "none"``, or more
than one under ``parallel_tool_calls: false``) is a 500 naming the script's mistake.

Usage is computed unless a ``Reply`` sets it, with a prompt cache (``PromptCache``), and a
reply longer than the request's ``max_output_tokens`` is cut there and answered
``incomplete``. For Codex in "code mode" (gpt-6.1-sol: one custom tool, ``exec``, that
runs JavaScript calling Codex's tools) ``cx_exec``, ``cx_shell`` and ``cx_patch`` script
its calls.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import hmac
import itertools
import json
import logging
import re
import secrets
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer, make_server

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise

Json = dict[str, Any]


@dataclass
class Reply:
    """One scripted response. ``output`` holds Responses output items (``message`` with
    ``output_text`` parts, ``function_call``, ``custom_tool_call``; a ``reasoning`` item to
    script its summary); the server fills ids, call ids, statuses and roles left out."""

    output: list[Json]
    # None: computed from the request and the reply (``count_tokens``, the prompt cache).
    usage: Json | None = None
    status: Literal["completed", "incomplete"] = "completed"
    incomplete_reason: str | None = None  # "max_output_tokens" when incomplete and unset
    delay: float = 0.0
    # Whether a reasoning item opens the output when the request sends ``reasoning``.
    reasoning: bool = True
    reasoning_tokens: int | None = None  # None: ``REASONING_TOKENS`` for the effort
    summary: str | None = None  # the reasoning summary, when the request asks for one


@dataclass
class Fail:
    """An error answer: ``status`` with the API's error body and ``headers`` (such as
    ``retry-after``). ``in_stream``: to a streaming request, a 200 stream that ends in a
    ``response.failed`` event instead."""

    status: int
    message: str = "injected"
    type: str = "server_error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    in_stream: bool = False


Item = Reply | Fail
Responder = Callable[[Json], Item]
_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A fresh id in the API's style (``resp_``, ``msg_``, ``fc_``, ``ctc_``, ``rs_``,
    ``call_``): a counter, for order when debugging, and random hex, for uniqueness."""
    return f"{prefix}_{next(_ids):06d}{secrets.token_hex(8)}"


# -- the models --------------------------------------------------------------------------

ALL_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")


@dataclass(frozen=True)
class ModelSpec:
    """One model of the catalogue. ``window``: the most input tokens a request may hold;
    ``max_output``: the highest ``max_output_tokens``; ``efforts``: the ``reasoning.effort``
    levels it takes; ``sampling``: whether it takes ``temperature`` and ``top_p`` (the
    reasoning models do not)."""

    id: str
    window: int = 272_000
    max_output: int = 128_000
    efforts: tuple[str, ...] = ("low", "medium", "high")
    created: int = 1_767_225_600  # 2026-01-01
    sampling: bool = False


def default_models() -> dict[str, ModelSpec]:
    """The catalogue a new server starts with."""
    sol = ("low", "medium", "high", "xhigh", "max", "ultra")
    specs = [
        ModelSpec("gpt-6.1-sol", 872_000, 128_000, sol, created=1_790_000_000),
        ModelSpec("gpt-6-sol", 872_000, 128_000, sol, created=1_785_000_000),
        ModelSpec("gpt-6-luna", 872_000, 128_000, sol[:-1], created=1_785_000_000),
        ModelSpec("gpt-5.5", 272_000, 128_000, sol[:-2], created=1_776_902_400),
    ]
    return {s.id: s for s in specs}


def model_info(spec: ModelSpec) -> Json:
    """``spec`` as ``GET /v1/models/{id}`` describes it (OpenAI's says no more)."""
    return {"id": spec.id, "object": "model", "created": spec.created, "owned_by": "openai"}


# -- errors ------------------------------------------------------------------------------


class Rejected(Exception):
    """An answer in the API's error shape: raised by the checks, answered by the server."""

    def __init__(
        self,
        message: str,
        code: str | None = "invalid_value",
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.status = status
        self.kind = kind


def error_body(message: str, kind: str, code: str | None, param: str | None = None) -> Json:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _err(e: Rejected) -> tuple[Response, int]:
    return jsonify(error_body(e.message, e.kind, e.code, e.param)), e.status


# -- the token count ---------------------------------------------------------------------

ITEM_OVERHEAD = 4  # tokens per input item (and for the instructions), on top of its JSON
MIN_CACHE_TOKENS = 1024  # the shortest prefix the prompt cache stores
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


# -- the prompt cache --------------------------------------------------------------------


class PromptCache:
    """The prompt cache of one server, one entry per model and ``prompt_cache_key`` (no
    key is a key of its own): the units (``_units``) of the last request answered.

    A request reads the longest prefix of units equal to the entry's, when it is at least
    ``MIN_CACHE_TOKENS`` long (``cached_tokens``); the rest of a prompt of at least
    ``MIN_CACHE_TOKENS`` is written (``cache_write_tokens``); a shorter prompt is neither
    read nor written. The request's units then replace the entry.
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str | None], list[tuple[str, int]]] = {}
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def use(self, model: str, key: str | None, units: list[tuple[str, int]]) -> tuple[int, int]:
        """(cached tokens, cache-write tokens) of a prompt of ``units``."""
        total = sum(t for _, t in units)
        with self.lock:
            before = self.entries.get((model, key), [])
            same = 0
            for (mine, tokens), (theirs, _) in zip(units, before, strict=False):
                if mine != theirs:
                    break
                same += tokens
            self.entries[(model, key)] = units
        if total < MIN_CACHE_TOKENS:
            return 0, 0
        cached = same if same >= MIN_CACHE_TOKENS else 0
        return cached, total - cached


# -- reasoning items' encrypted content --------------------------------------------------

# One secret for every server, as the real API's encrypted content outlives any one
# server: a conversation stored before a restart of the stand-in still verifies.
SECRET = b"loopbot-local-openai-encrypted-reasoning"
_SEALED = "gAAAAAB"  # how the API's encrypted content opens (a Fernet token)


def encrypted_reasoning(item_id: str, model: str, secret: bytes = SECRET) -> str:
    """The ``encrypted_content`` of reasoning item ``item_id``: the id and an HMAC-SHA256
    of the id and the model, so it verifies for that model only, with or without the
    item's ``id`` sent alongside."""
    mac = hmac.new(secret, f"reasoning\0{model}\0{item_id}".encode(), hashlib.sha256).hexdigest()
    return _SEALED + base64.urlsafe_b64encode(f"{item_id}.{mac}".encode()).decode()


def reasoning_item_id(content: Any, model: str, secret: bytes = SECRET) -> str | None:
    """The id of the reasoning item whose ``encrypted_content`` is ``content``, if this
    server issued it for ``model``; None for a forged or other model's one."""
    if not isinstance(content, str) or not content.startswith(_SEALED):
        return None
    try:
        raw = base64.urlsafe_b64decode(content[len(_SEALED) :].encode()).decode()
        item_id, mac = raw.rsplit(".", 1)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    want = hmac.new(secret, f"reasoning\0{model}\0{item_id}".encode(), hashlib.sha256).hexdigest()
    return item_id if hmac.compare_digest(mac, want) else None


# -- what a request may hold -------------------------------------------------------------

# The Responses API's request fields (https://platform.openai.com/docs/api-reference/
# responses/create); any other is refused, as the API refuses it.
REQUEST_KEYS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "store",
        "stream",
        "stream_options",
        "include",
        "prompt_cache_key",
        "prompt_cache_retention",
        "text",
        "client_metadata",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "temperature",
        "top_p",
        "truncation",
        "safety_identifier",
        "user",
        "service_tier",
        "background",
        "previous_response_id",
        "conversation",
        "prompt",
        "top_logprobs",
    }
)
# ``POST /v1/responses/input_tokens`` takes fewer: what shapes the prompt, nothing about
# the answer (https://platform.openai.com/docs/api-reference/responses/input-tokens).
COUNT_KEYS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "truncation",
        "previous_response_id",
        "conversation",
    }
)
INCLUDES = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "message.output_text.logprobs",
    }
)
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
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")


def _kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a decimal"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _typed(v: Any, param: str, *kinds: str) -> None:
    """``v`` must be one of ``kinds``: "string", "boolean", "integer", "number", "array",
    "object", "null"."""
    ok = {
        "string": isinstance(v, str),
        "boolean": isinstance(v, bool),
        "integer": isinstance(v, int) and not isinstance(v, bool),
        "number": isinstance(v, int | float) and not isinstance(v, bool),
        "array": isinstance(v, list),
        "object": isinstance(v, dict),
        "null": v is None,
    }
    if not any(ok[k] for k in kinds):
        named = {"string": "a string", "boolean": "a boolean", "integer": "an integer"}
        named |= {"number": "a number", "array": "an array", "object": "an object"}
        want = " or ".join(named.get(k, k) for k in kinds if k != "null")
        raise Rejected(
            f"Invalid type for '{param}': expected {want}, but got {_kind_of(v)} instead.",
            "invalid_type",
            param,
        )


def _one_of(v: Any, param: str, allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    if v not in allowed:
        listed = ", ".join(f"'{a}'" for a in allowed[:-1])
        listed = f"{listed}, and '{allowed[-1]}'" if listed else f"'{allowed[-1]}'"
        raise Rejected(
            f"Invalid value: '{v}'. Supported values are: {listed}.", "invalid_value", param
        )


def _unknown(keys: Iterable[str], allowed: Iterable[str], where: str) -> None:
    extra = sorted(set(keys) - set(allowed))
    if extra:
        name = f"{where}.{extra[0]}" if where else extra[0]
        raise Rejected(f"Unknown parameter: '{name}'.", "unknown_parameter", name)


def _missing(obj: Json, keys: Iterable[str], where: str) -> None:
    for key in keys:
        if key not in obj or obj[key] is None:
            name = f"{where}.{key}" if where else key
            raise Rejected(
                f"Missing required parameter: '{name}'.", "missing_required_parameter", name
            )


def _strict_schema(schema: Any, tool: str, path: tuple[str, ...] = ()) -> None:
    """A strict function schema (the default) must close every object
    (``additionalProperties: false``) and require every property, as the API demands."""
    if isinstance(schema, list):
        for sub in schema:
            _strict_schema(sub, tool, path)
        return
    if not isinstance(schema, dict):
        return
    where = f"Invalid schema for function '{tool}': In context={path!r}, "
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            raise Rejected(
                where + "'additionalProperties' is required to be supplied and to be false.",
                "invalid_function_parameters",
                "tools",
            )
        props = schema.get("properties") or {}
        required = schema.get("required") or []
        missing = [p for p in props if p not in required]
        if missing:
            raise Rejected(
                where + "'required' is required to be supplied and to be an array including "
                f"every key in properties. Missing '{missing[0]}'.",
                "invalid_function_parameters",
                "tools",
            )
        for name, sub in props.items() if isinstance(props, dict) else []:
            _strict_schema(sub, tool, (*path, "properties", name))
    for key in ("items", "anyOf", "allOf", "$defs", "definitions"):
        sub = schema.get(key)
        if isinstance(sub, dict) and key in ("$defs", "definitions"):
            for name, node in sub.items():
                _strict_schema(node, tool, (*path, key, name))
        elif sub is not None:
            _strict_schema(sub, tool, (*path, key))


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


def check_fields(body: Json, spec: ModelSpec, keys: frozenset[str]) -> None:
    """The request's fields, their types and values, for ``spec`` (raises ``Rejected``)."""
    _unknown(body, keys, "")
    if "stream" in body:
        _typed(body["stream"], "stream", "boolean")
    for key in ("store", "parallel_tool_calls", "background"):
        if key in body:
            _typed(body[key], key, "boolean", "null")
    for key in ("instructions", "prompt_cache_key", "safety_identifier", "user"):
        if key in body:
            _typed(body[key], key, "string", "null")
    if body.get("stream_options") is not None:
        _typed(body["stream_options"], "stream_options", "object")
        _unknown(body["stream_options"], ("include_obfuscation",), "stream_options")
        if body.get("stream") is not True:
            raise Rejected(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "invalid_value",
                "stream_options",
            )
    limit = body.get("max_output_tokens")
    if limit is not None:
        _typed(limit, "max_output_tokens", "integer")
        if limit < 16:
            raise Rejected(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value "
                f">= 16, but got {limit} instead.",
                "integer_below_min_value",
                "max_output_tokens",
            )
        if limit > spec.max_output:
            raise Rejected(
                "Invalid 'max_output_tokens': integer above maximum value. Expected a value "
                f"<= {spec.max_output}, but got {limit} instead.",
                "integer_above_max_value",
                "max_output_tokens",
            )
    if body.get("max_tool_calls") is not None:
        _typed(body["max_tool_calls"], "max_tool_calls", "integer")
        if body["max_tool_calls"] < 1:
            raise Rejected(
                "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, "
                f"but got {body['max_tool_calls']} instead.",
                "integer_below_min_value",
                "max_tool_calls",
            )
    if body.get("top_logprobs") is not None:
        _typed(body["top_logprobs"], "top_logprobs", "integer")
        if not 0 <= body["top_logprobs"] <= 20:
            raise Rejected(
                "Invalid 'top_logprobs': expected a value from 0 to 20.",
                "invalid_value",
                "top_logprobs",
            )
    for key, most in (("temperature", 2.0), ("top_p", 1.0)):
        if body.get(key) is None:
            continue
        if not spec.sampling:
            raise Rejected(
                f"Unsupported parameter: '{key}' is not supported with this model.",
                "unsupported_parameter",
                key,
            )
        _typed(body[key], key, "number")
        if not 0 <= body[key] <= most:
            raise Rejected(
                f"Invalid '{key}': expected a value from 0 to {most:g}.", "invalid_value", key
            )
    reasoning = body.get("reasoning")
    if reasoning is not None:
        _typed(reasoning, "reasoning", "object")
        _unknown(reasoning, ("effort", "summary", "generate_summary", "context"), "reasoning")
        effort = reasoning.get("effort")
        if effort is not None and effort not in spec.efforts:
            levels = [f"'{e}'" for e in spec.efforts]
            listed = (
                ", ".join(levels[:-1]) + f", and {levels[-1]}" if len(levels) > 1 else levels[0]
            )
            raise Rejected(
                f"Unsupported value: 'reasoning.effort' does not support '{effort}' with this "
                f"model. Supported values are: {listed}.",
                "unsupported_value",
                "reasoning.effort",
            )
        for key in ("summary", "generate_summary"):
            if reasoning.get(key) is not None:
                _one_of(reasoning[key], f"reasoning.{key}", ("auto", "concise", "detailed"))
    text = body.get("text")
    if text is not None:
        _typed(text, "text", "object")
        _unknown(text, ("format", "verbosity"), "text")
        if text.get("verbosity") is not None:
            _one_of(text["verbosity"], "text.verbosity", ("low", "medium", "high"))
        fmt = text.get("format")
        if fmt is not None:
            _typed(fmt, "text.format", "object")
            _one_of(fmt.get("type"), "text.format.type", ("text", "json_object", "json_schema"))
            if fmt["type"] == "json_schema":
                _missing(fmt, ["name", "schema"], "text.format")
                if fmt.get("strict") is True:
                    _strict_schema(fmt["schema"], str(fmt["name"]))
    include = body.get("include")
    if include is not None:
        _typed(include, "include", "array")
        for n, name in enumerate(include):
            _one_of(name, f"include[{n}]", sorted(INCLUDES))
        if "reasoning.encrypted_content" in include and body.get("store", True) is not False:
            raise Rejected(
                "Encrypted reasoning content ('reasoning.encrypted_content' in 'include') is "
                "only returned when 'store' is false.",
                "invalid_value",
                "include",
            )
    for key, values in (
        ("truncation", ("auto", "disabled")),
        ("service_tier", SERVICE_TIERS),
        ("prompt_cache_retention", ("in_memory", "24h")),
    ):
        if body.get(key) is not None:
            _one_of(body[key], key, values)
    for key in ("metadata", "client_metadata"):
        meta = body.get(key)
        if meta is None:
            continue
        _typed(meta, key, "object")
        if key == "metadata" and len(meta) > 16:
            raise Rejected(
                "Invalid 'metadata': too many properties. Expected an object with at most 16 "
                f"properties, but got an object with {len(meta)} properties instead.",
                "object_above_max_properties",
                "metadata",
            )
        for k, v in meta.items():
            _typed(v, f"{key}.{k}", "string")
            if key == "metadata" and (len(k) > 64 or len(v) > 512):
                raise Rejected(
                    f"Invalid 'metadata.{k}': keys are at most 64 characters and values at "
                    "most 512.",
                    "invalid_value",
                    f"metadata.{k}",
                )
    if body.get("background"):
        raise Rejected(
            "Background mode is not simulated by this local server (nor would loopbot poll "
            "for it).",
            "unsupported_value",
            "background",
        )
    if body.get("conversation") is not None:
        if body.get("previous_response_id") is not None:
            raise Rejected(
                "Mutually exclusive parameters: Ensure you are only providing one of: "
                "'previous_response_id' or 'conversation'.",
                "mutually_exclusive_parameters",
                "conversation",
            )
        named = body["conversation"]
        named = named.get("id") if isinstance(named, dict) else named
        raise Rejected(f"Conversation with id '{named}' not found.", "not_found", "conversation")
    if body.get("prompt") is not None:
        named = body["prompt"]
        named = named.get("id") if isinstance(named, dict) else named
        raise Rejected(f"Prompt with id '{named}' not found.", "not_found", "prompt")
    _missing(body, ["input"], "")
    given = body["input"]
    _typed(given, "input", "string", "array")
    if isinstance(given, list) and not given:
        raise Rejected(
            "Invalid 'input': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            "empty_array",
            "input",
        )


# -- the answer as it streams ------------------------------------------------------------


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


# -- script helpers ----------------------------------------------------------------------


def text(s: str, **kw: Any) -> Reply:
    """A reply that says ``s``: one assistant message."""
    part = {"type": "output_text", "text": s}
    return Reply([{"type": "message", "role": "assistant", "content": [part]}], **kw)


def call(name: str, arguments: Json | str, *, call_id: str | None = None, **kw: Any) -> Reply:
    """A reply that calls function tool ``name`` with ``arguments`` (JSON-encoded if not
    a string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    item: Json = {"type": "function_call", "name": name, "arguments": args}
    if call_id is not None:
        item["call_id"] = call_id
    return Reply([item], **kw)


def custom(name: str, input: str, *, call_id: str | None = None, **kw: Any) -> Reply:
    """A reply that calls custom tool ``name`` with free-form ``input``."""
    item: Json = {"type": "custom_tool_call", "name": name, "input": input}
    if call_id is not None:
        item["call_id"] = call_id
    return Reply([item], **kw)


def cx_exec(js: str, **kw: Any) -> Reply:
    """Codex's code mode (gpt-6.1-sol): a call of its one code tool, the custom tool
    ``exec``, whose input is JavaScript run with Codex's tools on the ``tools`` object."""
    return custom("exec", js, **kw)


def cx_shell(cmd: str, **kw: Any) -> Reply:
    """``cx_exec`` of JavaScript that runs the shell command ``cmd`` through Codex's
    ``exec_command`` tool and shows its result."""
    return cx_exec(
        f"const r = await tools.exec_command({{cmd: {json.dumps(cmd)}}}); text(r);", **kw
    )


def cx_patch(patch: str, **kw: Any) -> Reply:
    """``cx_exec`` of JavaScript that applies ``patch`` (``*** Begin Patch`` ...) through
    Codex's ``apply_patch`` tool and shows its result."""
    return cx_exec(f"text(await tools.apply_patch({json.dumps(patch)}));", **kw)


def cut_text(s: str, **kw: Any) -> Reply:
    """A reply cut at ``max_output_tokens`` in its text: ``response.incomplete``."""
    return text(s, status="incomplete", incomplete_reason="max_output_tokens", **kw)


# -- the server --------------------------------------------------------------------------


def _decoded(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    try:
        if encoding == "gzip":
            return gzip.decompress(raw)
        if encoding == "deflate":
            return zlib.decompress(raw)
    except (OSError, zlib.error) as exc:
        raise Rejected(f"Could not decode the {encoding} body: {exc}", None) from exc
    raise Rejected(f"Unsupported Content-Encoding: '{encoding}'.", None, status=415)


def _read_body() -> Any:
    raw = _decoded(request.get_data(), request.headers.get("Content-Encoding", ""))
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise Rejected(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON.)",
            None,
        ) from exc


@dataclass
class _Stored:
    """A response kept (``store`` not false): its whole conversation, for
    ``previous_response_id``."""

    items: list[Json]
    model: str


class OpenAIServer:
    def __init__(self) -> None:
        self.script: deque[Item] = deque()
        self.responder: Responder | None = None
        self.requests: list[Json] = []  # every JSON-object body sent to /v1/responses
        self.headers: list[dict[str, str]] = []
        self.input_tokens: list[int] = []  # the count of each of ``requests``
        self.responses: list[Json] = []  # every response answered with a 200
        self.hosted_tools: set[str] = set()  # hosted tool types any request offered
        self.models: dict[str, ModelSpec] = default_models()
        self.window_override: int | None = None  # every model's window, when set
        # Whether a scripted call must name a tool the request offers (see ``_misscripted``).
        self.strict_tools = True
        self.cache = PromptCache()
        self.stored: dict[str, _Stored] = {}  # response id -> its conversation
        self.stored_items: dict[str, Json] = {}  # output item id -> item, when stored
        # Output item id -> the reasoning item it came with, when that reasoning item
        # could be sent back (encrypted, or stored): it must be.
        self.issued: dict[str, str] = {}
        self.lock = threading.Lock()
        self._server: BaseWSGIServer | None = None
        self.url = ""
        self.app = self._build_app()

    def start(self, host: str = "127.0.0.1", port: int = 0) -> OpenAIServer:
        self._server = make_server(host, port, self.app, threaded=True)
        self.url = f"http://{host}:{self._server.server_port}"
        # A short poll: ``stop`` returns within it (a test fixture stops one per test).
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="openai-server",
        ).start()
        return self

    @property
    def base_url(self) -> str:
        """What ``OPENAI_BASE_URL`` should be."""
        return f"{self.url}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def play(self, *items: Item) -> None:
        with self.lock:
            self.script.extend(items)

    def reset(self) -> None:
        with self.lock:
            self.script.clear()
            self.requests.clear()
            self.headers.clear()
            self.input_tokens.clear()
            self.responses.clear()
            self.hosted_tools.clear()
            self.stored.clear()
            self.stored_items.clear()
            self.issued.clear()
            self.responder = None
        self.cache.clear()

    def add_model(self, spec: ModelSpec) -> ModelSpec:
        """Add ``spec`` to the catalogue, or replace the model of the same id."""
        with self.lock:
            self.models[spec.id] = spec
        return spec

    def window(self, spec: ModelSpec) -> int:
        """The context window the server enforces for ``spec``."""
        return self.window_override if self.window_override is not None else spec.window

    # -- validation ----------------------------------------------------------------------

    def _model(self, body: Json) -> ModelSpec:
        _missing(body, ["model"], "")
        _typed(body["model"], "model", "string")
        spec = self.models.get(body["model"])
        if spec is None:
            raise Rejected(
                f"The requested model '{body['model']}' does not exist.",
                "model_not_found",
                "model",
            )
        return spec

    def _context(self, body: Json, spec: ModelSpec, offered: Offered) -> list[Json]:
        """The whole conversation ``body`` sends (a previous response's, then its input,
        references resolved), each item checked; raises ``Rejected``."""
        items: list[Json] = []
        prev = body.get("previous_response_id")
        if prev is not None:
            _typed(prev, "previous_response_id", "string")
            with self.lock:
                stored = self.stored.get(prev)
            if stored is None:
                raise Rejected(
                    f"Previous response with id '{prev}' not found.",
                    "previous_response_not_found",
                    "previous_response_id",
                )
            items.extend(stored.items)
        seen_reasoning = {
            str(i.get("id")) for i in items if i.get("type") == "reasoning" and "id" in i
        }
        for n, item in enumerate(_as_items(body["input"])):
            at = f"input[{n}]"
            kind = check_item(item, at, offered)
            if kind == "item_reference":
                with self.lock:
                    found = self.stored_items.get(item["id"])
                if found is None:
                    raise Rejected(f"Item with id '{item['id']}' not found.", None, f"{at}.id")
                item, kind = found, str(found.get("type"))
            elif kind == "reasoning":
                seen_reasoning.add(self._reasoning_checked(item, spec, at))
            elif kind == "compaction":
                raise Rejected(
                    f"The encrypted content for {at} could not be verified (this server issues "
                    "no compaction items).",
                    "invalid_encrypted_content",
                    f"{at}.encrypted_content",
                )
            item_id = item.get("id")
            with self.lock:
                needs = self.issued.get(item_id) if isinstance(item_id, str) else None
            if needs is not None and needs not in seen_reasoning:
                raise Rejected(
                    f"Item '{item_id}' of type '{kind}' was provided without its required "
                    f"'reasoning' item: '{needs}'.",
                    None,
                    "input",
                )
            items.append(item if "type" in item else {"type": "message", **item})
        conversation_invalid(items)
        return items

    def _reasoning_checked(self, item: Json, spec: ModelSpec, at: str) -> str:
        """A reasoning item sent back must be one this server issued to this model; its
        id."""
        given = item.get("id")
        sealed = item.get("encrypted_content")
        if sealed is None:
            with self.lock:
                known = isinstance(given, str) and given in self.stored_items
            if not known:
                raise Rejected(
                    f"Item with id '{given}' not found. Items are not persisted when `store` "
                    "is set to false. Try again with `store` set to true, or remove this item "
                    "from your input.",
                    None,
                    "input",
                )
            return str(given)
        issued = reasoning_item_id(sealed, spec.id)
        if issued is None or (given is not None and given != issued):
            raise Rejected(
                f"The encrypted content for item {given or at} could not be verified.",
                "invalid_encrypted_content",
                f"{at}.encrypted_content",
            )
        return issued

    def _checked(
        self, body: Json, keys: frozenset[str], window: bool = True
    ) -> tuple[ModelSpec, list[Json], int]:
        """Everything the API checks before answering, in its words (raises ``Rejected``):
        the model, the conversation and, unless not ``window``, the context window; the
        conversation and its token count (of the part kept, under ``truncation: "auto"``)."""
        spec = self._model(body)
        check_fields(body, spec, keys)
        offered = Offered()
        if body.get("tools") is not None:
            check_tools(body["tools"], "tools", offered)
        items = self._context(body, spec, offered)
        with self.lock:
            self.hosted_tools |= offered.hosted
        if body.get("tool_choice") is not None:
            check_tool_choice(body["tool_choice"], offered)
        prompt = {**body, "input": items}
        tokens = count_tokens(prompt)
        most = self.window(spec) if window else tokens
        while tokens > most and body.get("truncation") == "auto" and len(items) > 1:
            items = items[1:]  # the API drops the oldest items to fit
            tokens = count_tokens({**body, "input": items})
        if tokens > most:
            raise Rejected(
                "Your input exceeds the context window of this model. Please adjust your input "
                "and try again.",
                "context_length_exceeded",
                "input",
            )
        return spec, items, tokens

    # -- the answer ----------------------------------------------------------------------

    def _next(self, body: Json) -> Item:
        with self.lock:
            if self.script:
                return self.script.popleft()
            responder = self.responder
        if responder is not None:
            return responder(body)
        return Fail(500, "the local model has no scripted reply left", "server_error")

    def _misscripted(self, body: Json, items: list[Json], reply: Reply) -> str | None:
        """Why a model could not have answered ``body`` with ``reply`` (a test's mistake):
        a call of a tool the request does not offer, any call under ``tool_choice:
        "none"``, several calls under ``parallel_tool_calls: false``."""
        offered = Offered()
        check_tools(body.get("tools") or [], "tools", offered)  # checked: this collects
        for item in items:
            if item.get("type") == "additional_tools":
                check_tools(item["tools"], "tools", offered)
        calls = [i for i in reply.output if i.get("type") in ("function_call", "custom_tool_call")]
        for c in calls:
            names = offered.functions if c["type"] == "function_call" else offered.customs
            if c.get("name") not in names:
                return (
                    f"the script calls the {c['type'].replace('_', ' ')} tool '{c.get('name')}', "
                    f"which the request does not offer (offered: {sorted(names)})"
                )
        if calls and body.get("tool_choice") == "none":
            return "the script calls a tool, but the request's tool_choice is 'none'"
        if len(calls) > 1 and body.get("parallel_tool_calls") is False:
            return "the script makes several tool calls, but parallel_tool_calls is false"
        return None

    def _output(self, body: Json, spec: ModelSpec, reply: Reply) -> tuple[list[Json], int]:
        """The reply's output items, completed as the API sends them (ids, statuses, the
        reasoning item first when the request sends ``reasoning``), and its reasoning
        tokens."""
        include = body.get("include") or []
        sealed = "reasoning.encrypted_content" in include
        reasoning = body.get("reasoning")
        summarise = isinstance(reasoning, dict) and (
            reasoning.get("summary") or reasoning.get("generate_summary")
        )
        out: list[Json] = []
        for given in reply.output:
            item = dict(given)
            kind = item.get("type")
            if kind == "message":
                item.setdefault("id", new_id("msg"))
                item.setdefault("status", "completed")
                item.setdefault("role", "assistant")
                parts = []
                for part in item.get("content") or []:
                    if part.get("type") == "output_text":
                        part = {"annotations": [], "logprobs": [], **part}
                    parts.append(part)
                item["content"] = parts
                item = {"id": item.pop("id"), "type": "message", **item}
            elif kind in ("function_call", "custom_tool_call"):
                prefix = "fc" if kind == "function_call" else "ctc"
                item = {"id": item.pop("id", new_id(prefix)), **item}
                item.setdefault("status", "completed")
                item.setdefault("call_id", new_id("call"))
            elif kind == "reasoning":
                item = {"id": item.pop("id", new_id("rs")), **item}
                item.setdefault("summary", [])
            else:
                raise Rejected(
                    f"the script's output item type {kind!r} is not one this server plays",
                    "script_error",
                    status=500,
                    kind="server_error",
                )
            out.append(item)
        thinks = reasoning is not None and reply.reasoning
        if thinks and not any(i["type"] == "reasoning" for i in out):
            summary = []
            if summarise and reply.summary:
                summary = [{"type": "summary_text", "text": reply.summary}]
            out.insert(0, {"id": new_id("rs"), "type": "reasoning", "summary": summary})
        for item in out:
            if item["type"] == "reasoning":
                if sealed:
                    item["encrypted_content"] = encrypted_reasoning(item["id"], spec.id)
                if not summarise:
                    item["summary"] = []
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        spent = 0
        if any(i["type"] == "reasoning" for i in out):
            scripted = reply.reasoning_tokens
            spent = scripted if scripted is not None else REASONING_TOKENS.get(effort, 64)
        return out, spent

    def _response(self, body: Json, spec: ModelSpec, items: list[Json], reply: Reply) -> Json:
        """The Responses API's answer to ``body`` from ``reply``: output, status, usage as
        scripted or computed (the prompt cache; a cut at ``max_output_tokens``)."""
        out, spent = self._output(body, spec, reply)
        status: str = reply.status
        reason = reply.incomplete_reason or (
            "max_output_tokens" if status == "incomplete" else None
        )
        said = output_tokens([i for i in out if i["type"] != "reasoning"], spent)
        limit = body.get("max_output_tokens")
        if isinstance(limit, int) and said > limit:
            out, said = _cut(out, spent, limit)
            status, reason = "incomplete", "max_output_tokens"
        elif status == "incomplete" and out:
            out[-1] = {**out[-1], "status": "incomplete"} if "status" in out[-1] else out[-1]
        prompt = {**body, "input": items}
        units = _units(prompt)
        cached, written = self.cache.use(spec.id, body.get("prompt_cache_key"), units)
        total = sum(t for _, t in units)
        usage: Json = {
            "input_tokens": total,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": said,
            "output_tokens_details": {"reasoning_tokens": min(spent, said)},
        }
        if reply.usage is not None:
            usage = {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                **reply.usage,
            }
        usage.setdefault("total_tokens", int(usage["input_tokens"]) + int(usage["output_tokens"]))
        return {
            **_skeleton(body, spec),
            "status": status,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "output": out,
            "usage": usage,
        }

    def _keep(self, body: Json, items: list[Json], response: Json) -> None:
        """Record ``response``; store it unless ``store: false``; note which of its items
        must come back with their reasoning item."""
        out = response["output"]
        stored = body.get("store", True) is not False
        sealed = "reasoning.encrypted_content" in (body.get("include") or [])
        with self.lock:
            self.responses.append(response)
            if stored:
                self.stored[response["id"]] = _Stored([*items, *out], response["model"])
                for item in out:
                    self.stored_items[item["id"]] = item
            thought: str | None = None
            for item in out:
                if item["type"] == "reasoning":
                    thought = item["id"] if (stored or sealed) else None
                elif thought is not None:
                    self.issued[item["id"]] = thought

    def _answer(self, body: Json) -> tuple[Response, int]:
        """Check ``body``, then answer it with the next script item."""
        spec, items, _ = self._checked(body, REQUEST_KEYS)  # before the script is used
        item = self._next(body)
        if item.delay:
            time.sleep(item.delay)
        if isinstance(item, Fail):
            if item.in_stream and body.get("stream") is True:
                shell = _skeleton(body, spec)
                return Response(failed_events(shell, item), mimetype="text/event-stream"), 200
            resp, status = _err(Rejected(item.message, item.code, None, item.status, item.type))
            for k, v in item.headers.items():
                resp.headers[k] = v
            return resp, status
        if self.strict_tools and (why := self._misscripted(body, items, item)) is not None:
            raise Rejected(f"local model: {why}", "script_error", status=500, kind="server_error")
        response = self._response(body, spec, items, item)
        self._keep(body, items, response)
        if body.get("stream") is True:
            return Response(sse_events(response), mimetype="text/event-stream"), 200
        return jsonify(response), 200

    def _build_app(self) -> Flask:
        app = Flask("local-openai")
        app.json.sort_keys = False  # type: ignore[attr-defined]  # fields in the API's order
        srv = self

        def authorised() -> None:
            auth = request.headers.get("Authorization", "")
            scheme, _, key = auth.partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise Rejected(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                    "YOUR_KEY).",
                    "invalid_api_key",
                    status=401,
                )

        def body_object() -> Json:
            body = _read_body()
            if not isinstance(body, dict):
                raise Rejected(
                    f"Invalid type for body: expected an object, but got {_kind_of(body)} instead.",
                    "invalid_type",
                )
            return body

        @app.errorhandler(Rejected)
        def rejected(e: Rejected) -> tuple[Response, int]:
            return _err(e)

        @app.errorhandler(HTTPException)
        def http_error(e: HTTPException) -> tuple[Response, int]:
            status = e.code or 500
            message = f"Invalid URL ({request.method} {request.path})"
            if status == 405:
                message = f"Method not allowed ({request.method} {request.path})"
            return jsonify(error_body(message, "invalid_request_error", None)), status

        @app.post("/v1/responses")
        def responses() -> tuple[Response, int]:
            authorised()
            body = body_object()
            with srv.lock:
                srv.requests.append(body)
                srv.headers.append(dict(request.headers))
            tokens = srv._counted(body)
            with srv.lock:
                srv.input_tokens.append(tokens)
            return srv._answer(body)

        @app.post("/v1/responses/input_tokens")
        def input_tokens() -> tuple[Response, int]:
            authorised()
            body = body_object()
            # Over the window is no error here: the count is how a client finds out.
            _, _, tokens = srv._checked(body, COUNT_KEYS, window=False)
            return jsonify({"object": "response.input_tokens", "input_tokens": tokens}), 200

        @app.get("/v1/models")
        def models() -> tuple[Response, int]:
            authorised()
            with srv.lock:
                data = [model_info(m) for m in srv.models.values()]
            return jsonify({"object": "list", "data": data}), 200

        @app.get("/v1/models/<path:model_id>")
        def model(model_id: str) -> tuple[Response, int]:
            authorised()
            with srv.lock:
                spec = srv.models.get(model_id)
            if spec is None:
                raise Rejected(
                    f"The model '{model_id}' does not exist or you do not have access to it.",
                    "model_not_found",
                    status=404,
                )
            return jsonify(model_info(spec)), 200

        return app

    def _counted(self, body: Json) -> int:
        """The request's input tokens for ``input_tokens``: with the previous response's
        conversation when it names one this server stored."""
        prev = body.get("previous_response_id")
        with self.lock:
            stored = self.stored.get(prev) if isinstance(prev, str) else None
        if stored is None:
            return count_tokens(body)
        return count_tokens({**body, "input": [*stored.items, *_as_items(body.get("input"))]})


def _cut(out: list[Json], spent: int, limit: int) -> tuple[list[Json], int]:
    """``out`` cut where ``limit`` output tokens run out (the reasoning first, as the model
    spends them): the item the cut falls in is shortened and ``incomplete``, later ones
    are dropped. The output and its tokens (``limit``)."""
    left = limit - spent
    kept: list[Json] = []
    for item in out:
        if item["type"] == "reasoning":
            kept.append(item)
            continue
        if left <= 0:
            break
        cost = _said(item)
        if cost <= left:
            kept.append(item)
            left -= cost
            continue
        chars = left * 4
        cut = dict(item)
        if cut["type"] == "message":
            parts, room = [], chars
            for part in cut.get("content") or []:
                said = str(part.get("text", ""))
                parts.append({**part, "text": said[:room]} if "text" in part else part)
                room -= min(room, len(said))
                if room <= 0:
                    break
            cut["content"] = parts
        elif cut["type"] == "function_call":
            cut["arguments"] = str(cut.get("arguments", ""))[: max(0, chars - len(cut["name"]))]
        elif cut["type"] == "custom_tool_call":
            cut["input"] = str(cut.get("input", ""))[: max(0, chars - len(cut["name"]))]
        cut["status"] = "incomplete"
        kept.append(cut)
        break
    return kept, limit


def _skeleton(body: Json, spec: ModelSpec) -> Json:
    """A response object to ``body`` in progress: every field the API sends, no output."""
    reasoning = body.get("reasoning")
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": spec.id,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {
            "effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
            "summary": reasoning.get("summary") if isinstance(reasoning, dict) else None,
        },
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": body.get("service_tier") or "default",
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "usage": None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
