"""A local server for Anthropic's Messages API that plays scripted responses.

``POST /v1/messages`` answers with the next item of the script: a message (text and
tool-use blocks, a stop reason, usage with cache fields), an HTTP error such as 429 or
529 with its headers, or a delay (for stall tests). Or a ``responder`` callable decides
from the request. Every request is recorded, body and headers, for assertions.

Every stop reason the real API gives can be scripted (``cut_tool``, ``cut_text``,
``paused``, ``refused``, ``context_full``), in the shapes the SDK parses. And the server is
at least as strict as the real API about what it is sent (``invalid``): a conversation
with a tool call left unanswered, or a tool result that answers no call, is a 400
``invalid_request_error`` in the API's words, before any script item is used, so a
broken conversation the agent stored fails a test instead of passing it.

It behaves like the real API where a harness can get the API wrong: a catalogue of
models (``ModelSpec``; ``GET /v1/models``, unknown and retired ones a 404), each with its
context window (``prompt is too long``, checked before the script is used), output limit,
thinking types and effort levels; one deterministic token count (``count_tokens``) for the
window, ``/v1/messages/count_tokens`` and usage; usage computed unless a ``Reply`` sets it,
split by a prompt-cache simulation (``PromptCache``: breakpoints, the 20-block lookback,
the minimum cacheable prefix, TTLs); and thinking blocks signed for their text and model,
which must come back unchanged, to the same model, before the message's other blocks.
Where unsure, it is harsher than the API, never kinder.

loopbot's readiness triage call (known by its schema, ``is_triage``) has a script and a
record of its own (``play_triage``, ``triage_requests``), validated like any request: the
scripts tests write for the agent and the critic stay theirs, and an unscripted triage
is answered "ready".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import logging
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from flask import Flask, Response, jsonify, request
from werkzeug.serving import BaseWSGIServer, make_server

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise

Json = dict[str, Any]


@dataclass
class Reply:
    content: list[Json]
    stop_reason: str = "end_turn"
    # None: computed from the request and the reply (``count_tokens``, the prompt cache).
    usage: Json | None = None
    delay: float = 0.0
    model: str | None = None
    stop_details: Json | None = None  # a refusal's {"type": "refusal", "category", ...}
    # The thinking block's text when the request turns thinking on; None: a generated one.
    thinking: str | None = None
    redacted: bool = False  # also a ``redacted_thinking`` block, after the thinking one


@dataclass
class Fail:
    status: int
    message: str = "injected"
    error_type: str = "api_error"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Item = Reply | Fail
Responder = Callable[[Json], Item]
_ids = itertools.count(1)
# The output limit the server enforces on ``max_tokens`` (Sonnet 4.5's and Haiku 4.5's:
# https://platform.claude.com/docs/en/about-claude/models/overview); more is a 400.
MAX_OUTPUT_TOKENS = 64_000

Lifecycle = Literal["active", "deprecated", "retired"]
EFFORTS = ("low", "medium", "high", "xhigh", "max")
THINKING_TYPES = ("adaptive", "enabled", "disabled", "between_tools")


@dataclass(frozen=True)
class ModelSpec:
    """One model of the catalogue, as ``GET /v1/models/{id}`` describes it.

    ``window`` is ``max_input_tokens``, ``max_output`` is ``max_tokens``; ``thinking`` the
    ``thinking.type`` values a request may send, ``efforts`` the ``output_config.effort``
    levels; ``min_cache_tokens`` the shortest prefix the prompt cache stores.
    """

    id: str
    display_name: str = ""
    window: int = 200_000
    max_output: int = MAX_OUTPUT_TOKENS
    lifecycle: Lifecycle = "active"
    deprecated_at: str | None = None
    retires_at: str | None = None
    thinking: frozenset[str] = frozenset({"adaptive", "disabled"})
    efforts: tuple[str, ...] = ("low", "medium", "high")
    min_cache_tokens: int = 1024
    created_at: str = "2025-01-01T00:00:00Z"
    line: str | None = None
    system_messages: bool = False  # mid-conversation system messages (Opus 4.8 only)


def default_models() -> dict[str, ModelSpec]:
    """The catalogue a new server starts with: every model name the tests, the demo and the
    benchmarks send, and one of each lifecycle and thinking style."""
    budget_only = frozenset({"enabled", "disabled"})
    specs = [
        ModelSpec("claude-test", "Claude Test", line="sonnet"),
        ModelSpec(
            "claude-sonnet-5-5",
            "Claude Sonnet 5.5",
            window=1_000_000,
            max_output=128_000,
            efforts=EFFORTS,
            created_at="2026-06-01T00:00:00Z",
            line="sonnet",
        ),
        ModelSpec(
            "claude-opus-4-8",
            "Claude Opus 4.8",
            window=1_000_000,
            max_output=128_000,
            efforts=EFFORTS,
            created_at="2026-09-01T00:00:00Z",
            line="opus",
            system_messages=True,
        ),
        ModelSpec(
            "claude-sonnet-4-6",
            "Claude Sonnet 4.6",
            thinking=frozenset({"adaptive", "enabled", "disabled"}),
            efforts=("low", "medium", "high", "max"),
            min_cache_tokens=2048,
            created_at="2026-02-17T00:00:00Z",
            line="sonnet",
        ),
        ModelSpec(
            "claude-haiku-4-5",
            "Claude Haiku 4.5",
            thinking=budget_only,
            efforts=(),
            min_cache_tokens=4096,
            created_at="2025-10-01T00:00:00Z",
            line="haiku",
        ),
        ModelSpec(
            "claude-sonnet-4-5",
            "Claude Sonnet 4.5",
            lifecycle="deprecated",
            deprecated_at="2026-05-29T00:00:00Z",
            retires_at="2026-11-30T00:00:00Z",
            thinking=budget_only,
            efforts=(),
            created_at="2025-09-29T00:00:00Z",
            line="sonnet",
        ),
        ModelSpec(
            "claude-3-5-haiku-20241022",
            "Claude Haiku 3.5",
            max_output=8192,
            lifecycle="retired",
            deprecated_at="2025-12-19T00:00:00Z",
            retires_at="2026-02-19T00:00:00Z",
            thinking=frozenset({"disabled"}),
            efforts=(),
            min_cache_tokens=2048,
            created_at="2024-10-22T00:00:00Z",
            line="haiku",
        ),
    ]
    return {s.id: s for s in specs}


def model_info(spec: ModelSpec, window: int | None = None) -> Json:
    """``spec`` in the shape of the SDK's ``ModelInfo`` (every capability key present)."""

    def sup(flag: bool) -> Json:
        return {"supported": flag}

    return {
        "type": "model",
        "id": spec.id,
        "display_name": spec.display_name or spec.id,
        "created_at": spec.created_at,
        "max_input_tokens": window if window is not None else spec.window,
        "max_tokens": spec.max_output,
        "lifecycle": spec.lifecycle,
        "deprecated_at": spec.deprecated_at,
        "retires_at": spec.retires_at,
        "line": spec.line,
        "capabilities": {
            "batch": sup(True),
            "citations": sup(True),
            "code_execution": sup(False),
            "context_management": {"supported": False},
            "effort": {
                "supported": bool(spec.efforts),
                **{e: sup(e in spec.efforts) for e in EFFORTS},
            },
            "image_input": sup(True),
            "pdf_input": sup(True),
            "server_tools": {
                "supported": False,
                "code_execution": sup(False),
                "web_search": sup(False),
            },
            "structured_outputs": sup(True),
            "thinking": {
                "supported": bool(spec.thinking & {"adaptive", "enabled"}),
                "types": {t: sup(t in spec.thinking) for t in THINKING_TYPES},
            },
        },
    }


# -- the token count ---------------------------------------------------------------------

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
    else:  # images, documents, anything else: its JSON, which is never less
        said = _canon({k: v for k, v in _uncached(block).items() if k != "type"})
    return BLOCK_OVERHEAD + _text_tokens(said)


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

    Deterministic, monotonic (more content is never fewer tokens) and never more than a
    quarter of the request's JSON (``len(json.dumps(body)) // 4``): the text is counted at
    four characters a token, the JSON around it only as a few tokens a block.
    """
    return sum(u.tokens for u in _units(body)) if isinstance(body, dict) else 0


def reply_tokens(content: list[Json], thinking: str = "") -> int:
    """The output tokens of a reply: its blocks, and ``thinking``, the text of its thinking
    (billed in full even when the reply shows none of it)."""
    said = sum(block_tokens(b) for b in content if b.get("type") != "thinking")
    return max(1, said + (_text_tokens(thinking) if thinking else 0))


# -- thinking signatures -----------------------------------------------------------------

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


# -- the prompt cache --------------------------------------------------------------------

MAX_CACHE_POINTS = 4
CACHE_LOOKBACK = 20  # positions checked before each breakpoint, after its own
CACHE_TTL = {"5m": 300.0, "1h": 3600.0}


def _breakpoints(body: Json, units: list[_Unit]) -> tuple[list[int], str | None]:
    """The positions that are cache breakpoints, or why the API would reject them."""
    points = [n for n, u in enumerate(units) if u.cache is not None]
    nested = 0
    msgs = body.get("messages")
    for msg in msgs if isinstance(msgs, list) else []:
        for block in _blocks(msg if isinstance(msg, dict) else {}):
            content = block.get("content")
            if block.get("type") == "tool_result" and isinstance(content, list):
                nested += sum(1 for b in content if isinstance(b, dict) and "cache_control" in b)
    top = body.get("cache_control")
    if top is not None and units and units[-1].cache is None:
        units[-1].cache = top  # automatic caching: the last cacheable block
        points.append(len(units) - 1)
    found = len(points) + nested
    if found > MAX_CACHE_POINTS:
        return points, (
            f"A maximum of {MAX_CACHE_POINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )
    seen_short = False
    for n in points:
        cache = units[n].cache
        if not isinstance(cache, dict) or cache.get("type") != "ephemeral":
            return points, f"{units[n].path}.cache_control.type: Input should be 'ephemeral'"
        ttl = cache.get("ttl", "5m")
        if ttl not in CACHE_TTL:
            return points, f"{units[n].path}.cache_control.ttl: Input should be '5m' or '1h'"
        if ttl == "1h" and seen_short:
            return points, (
                f"{units[n].path}.cache_control: a `ttl='1h'` cache_control block must not "
                "come after a `ttl='5m'` cache_control block"
            )
        seen_short = seen_short or ttl == "5m"
        if units[n].empty:
            return points, f"{units[n].path}: cache_control cannot be set for empty text blocks"
    return points, None


@dataclass
class _Entry:
    tokens: int
    ttl: float
    expires: float


class PromptCache:
    """The prompt cache of one server: prefixes, by a hash of the model and everything up
    to and including a breakpoint (tools, system, messages; ``cache_control`` left out).

    A request reads the longest prefix stored by an earlier one that ends at one of its
    breakpoints or at one of the ``CACHE_LOOKBACK`` positions just before it, and stores
    the prefix at each of its breakpoints that is at least the model's
    ``min_cache_tokens`` long. An entry lives for its TTL (5 minutes
    unless ``ttl: "1h"``) after it was last written or read.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries: dict[str, _Entry] = {}
        self.clock = clock
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def use(self, model: ModelSpec, body: Json) -> tuple[int, int, str | None]:
        """(cache read tokens, cache creation tokens, the 5m/1h TTL written) for ``body``."""
        units = _units(body)
        points, why = _breakpoints(body, units)
        if why is not None or not points:
            return 0, 0, None
        digest = hashlib.sha256(model.id.encode()).digest()
        hashes: list[str] = []
        prefix: list[int] = []
        total = 0
        for u in units:
            digest = hashlib.sha256(digest + u.key.encode()).digest()
            hashes.append(digest.hex())
            total += u.tokens
            prefix.append(total)
        now = self.clock()
        with self.lock:
            self.entries = {h: e for h, e in self.entries.items() if e.expires > now}
            hit = -1
            for b in points:
                for n in range(b, max(-1, b - CACHE_LOOKBACK - 1), -1):
                    if hashes[n] in self.entries:
                        hit = max(hit, n)
                        break
            if hit >= 0:
                entry = self.entries[hashes[hit]]
                entry.expires = now + entry.ttl
            read = prefix[hit] if hit >= 0 else 0
            for b in points:
                cache = units[b].cache or {}
                ttl = CACHE_TTL[cache.get("ttl", "5m")]
                if prefix[b] >= model.min_cache_tokens:
                    old = self.entries.get(hashes[b])
                    ttl = max(ttl, old.ttl if old else 0.0)  # a 1h entry stays 1h
                    self.entries[hashes[b]] = _Entry(prefix[b], ttl, now + ttl)
        last = points[-1]
        if prefix[last] < model.min_cache_tokens or hit >= last:
            return read, 0, None
        return read, prefix[last] - read, (units[last].cache or {}).get("ttl", "5m")


def text(s: str, **kw: Any) -> Reply:
    return Reply([{"type": "text", "text": s}], **kw)


def tool(name: str, input: Json, *, say: str = "", **kw: Any) -> Reply:
    """One tool call (with optional text before it): stop reason ``tool_use``."""
    blocks: list[Json] = [{"type": "text", "text": say}] if say else []
    blocks.append(
        {"type": "tool_use", "id": f"toolu_{next(_ids):06d}", "name": name, "input": input}
    )
    return Reply(blocks, stop_reason="tool_use", **kw)


def bash(command: str, **kw: Any) -> Reply:
    return tool("bash", {"command": command}, **kw)


def write_file(path: str, content: str, **kw: Any) -> Reply:
    return tool(
        "str_replace_based_edit_tool",
        {"command": "create", "path": path, "file_text": content},
        **kw,
    )


def replace(path: str, old: str, new: str, **kw: Any) -> Reply:
    return tool(
        "str_replace_based_edit_tool",
        {"command": "str_replace", "path": path, "old_str": old, "new_str": new},
        **kw,
    )


# -- Claude Code's own tools (the claude-code backend: its CLI calls them) ------------------
# A path under ``CWD`` is made absolute when the reply is sent, from the working directory
# Claude Code states in its first message ("Primary working directory: ..."): its Write
# and Edit tools take absolute paths only.
CWD = "@cwd/"
# Claude Code's line, and opencode's (in its system prompt's <env>).
_CWD_LINE = re.compile(r"(?:Primary working directory|  Working directory): (\S+)")
_MOVED = re.compile(r"the repository is now at (\S+)")


def cc_bash(command: str, **kw: Any) -> Reply:
    return tool("Bash", {"command": command, "description": "Run a command"}, **kw)


def cc_write(path: str, content: str, **kw: Any) -> Reply:
    return tool("Write", {"file_path": CWD + path, "content": content}, **kw)


def cc_edit(path: str, old: str, new: str, **kw: Any) -> Reply:
    return tool("Edit", {"file_path": CWD + path, "old_string": old, "new_string": new}, **kw)


# -- opencode's tools (the opencode backend): absolute paths, as its tools describe them ---


def oc_bash(command: str, **kw: Any) -> Reply:
    return tool("bash", {"command": command, "description": "Run a command"}, **kw)


def oc_write(path: str, content: str, **kw: Any) -> Reply:
    return tool("write", {"filePath": CWD + path, "content": content}, **kw)


def oc_edit(path: str, old: str, new: str, **kw: Any) -> Reply:
    return tool("edit", {"filePath": CWD + path, "oldString": old, "newString": new}, **kw)


def _working_dir(body: Json) -> str | None:
    """The working directory this model writes paths under. Harsh, as a model that
    trusts its history is: the first one the conversation named, even after the session
    moved to another worker, unless a prompt says in so many words where the repository
    is now (loopbot's note on a moved session; the newest such note wins)."""
    first = moved = None
    for msg in body.get("messages") or []:
        for b in _blocks(msg):
            text = str(b.get("text", ""))
            for note in _MOVED.finditer(text):
                moved = note.group(1).rstrip(";")
            found = _CWD_LINE.search(text)
            if found and first is None:
                first = found.group(1)
    if moved or first:
        return moved or first
    system = body.get("system") or ""
    if isinstance(system, list):
        system = "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    found = _CWD_LINE.search(str(system))
    return found.group(1) if found else None


def _with_cwd(content: list[Json], body: Json) -> list[Json]:
    cwd = _working_dir(body)
    out = []
    for b in content:
        given = (b.get("input") or {}) if b.get("type") == "tool_use" else {}
        for name in ("file_path", "filePath"):
            path = given.get(name)
            if isinstance(path, str) and path.startswith(CWD) and cwd:
                b = {**b, "input": {**b["input"], name: f"{cwd}/{path[len(CWD) :]}"}}
        out.append(b)
    return out


def cut_tool(name: str, partial: Json, *, say: str = "", **kw: Any) -> Reply:
    """A reply cut at ``max_tokens`` in the middle of a tool call: the tool_use block is
    there, with only the input written before the cut (``partial``, often ``{}``)."""
    reply = tool(name, partial, say=say, **kw)
    reply.stop_reason = "max_tokens"
    return reply


def cut_text(s: str, **kw: Any) -> Reply:
    """A reply cut at ``max_tokens`` in its text."""
    return text(s, stop_reason="max_tokens", **kw)


def paused(s: str = "", **kw: Any) -> Reply:
    """``pause_turn``: the model stopped mid-turn; sent back as it is, it carries on."""
    return Reply([{"type": "text", "text": s}] if s else [], stop_reason="pause_turn", **kw)


def refused(
    s: str = "",
    *,
    category: str | None = "cyber",
    explanation: str | None = "This request was declined because it could enable cyber harm.",
    **kw: Any,
) -> Reply:
    """``refusal``: whatever text was streamed before the classifier stopped it, and
    ``stop_details`` (https://platform.claude.com/docs/en/test-and-evaluate/
    strengthen-guardrails/handle-streaming-refusals). Usage is still billed."""
    details = {"type": "refusal", "category": category, "explanation": explanation}
    return Reply(
        [{"type": "text", "text": s}] if s else [],
        stop_reason="refusal",
        stop_details=details,
        **kw,
    )


def context_full(s: str = "", **kw: Any) -> Reply:
    """``model_context_window_exceeded``: the reply filled the context window, cut."""
    return Reply(
        [{"type": "text", "text": s}] if s else [],
        stop_reason="model_context_window_exceeded",
        **kw,
    )


def _blocks(msg: Json) -> list[Json]:
    if not isinstance(msg, dict):
        return []
    content = msg.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


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


def structured(obj: Json, **kw: Any) -> Reply:
    """A JSON answer, as a model does under ``output_config`` with a JSON schema."""
    return text(json.dumps(obj), **kw)


# -- readiness triage (bot/core/rules/triage.py) -------------------------------------------------
# A triage request is known by its schema's top-level keys. Tests script its answers apart
# from the conversation's (``AnthropicServer.play_triage``), so a script written for the
# agent and the critic is not consumed by it; unscripted, it is answered "ready".
TRIAGE_KEYS = ("readiness", "proposed_criteria")


def is_triage(body: Json) -> bool:
    """Whether ``body`` asks for loopbot's readiness triage (its JSON schema says so)."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    props = schema.get("properties") if isinstance(schema, dict) else None
    return isinstance(props, dict) and all(k in props for k in TRIAGE_KEYS)


def triage_answer(
    readiness: str = "ready",
    *,
    outcome: str = "",
    reasons: tuple[str, ...] = (),
    criteria: tuple[str, ...] = (),
    sub_issues: tuple[tuple[str, str], ...] = (),
    **kw: Any,
) -> Reply:
    """A triage answer in its schema."""
    return structured(
        {
            "readiness": readiness,
            "checkable_outcome": outcome,
            "reasons": list(reasons) or [f"the local model's {readiness} verdict"],
            "proposed_criteria": list(criteria),
            "sub_issues": [{"title": t, "body": b} for t, b in sub_issues],
        },
        **kw,
    )


# -- end readiness triage ------------------------------------------------------------------------


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


class AnthropicServer:
    def __init__(self) -> None:
        self.script: deque[Item] = deque()
        # Readiness triage requests: their own script and record, apart from ``script`` and
        # ``requests`` (see ``is_triage``); an empty script answers "ready".
        self.triage: deque[Item] = deque()
        self.triage_requests: list[Json] = []
        self.responder: Responder | None = None
        self.requests: list[Json] = []
        self.arrivals: list[float] = []  # wall-clock time each request arrived
        self.headers: list[dict[str, str]] = []
        self.input_tokens: list[int] = []  # ``count_tokens`` of each of ``requests``
        self.responses: list[Json] = []  # every message answered (a 200), usage and all
        self.models: dict[str, ModelSpec] = default_models()
        self.window_override: int | None = None  # every model's window, when set
        # What /v1/models says the window is, when it should differ from the one enforced:
        # a client that believes a stale figure must still survive the real one.
        self.advertised_window: int | None = None
        self.cache = PromptCache()
        self.lock = threading.Lock()
        self._server: BaseWSGIServer | None = None
        self.url = ""
        self.app = self._build_app()

    def start(self, host: str = "127.0.0.1", port: int = 0) -> AnthropicServer:
        self._server = make_server(host, port, self.app, threaded=True)
        self.url = f"http://{host}:{self._server.server_port}"
        threading.Thread(
            target=self._server.serve_forever, daemon=True, name="anthropic-server"
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def play(self, *items: Item) -> None:
        with self.lock:
            self.script.extend(items)

    def play_triage(self, *items: Item) -> None:
        """Script the answers to readiness triage requests, in order."""
        with self.lock:
            self.triage.extend(items)

    def reset(self) -> None:
        with self.lock:
            self.script.clear()
            self.triage.clear()
            self.triage_requests.clear()
            self.requests.clear()
            self.headers.clear()
            self.input_tokens.clear()
            self.responses.clear()
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

    def advertised(self, spec: ModelSpec) -> int:
        """The context window the Models API reports for ``spec``."""
        return self.advertised_window if self.advertised_window is not None else self.window(spec)

    def _model(self, body: Json) -> ModelSpec | None:
        """The model ``body`` names, if it can be called (known, not retired)."""
        spec = self.models.get(str(body.get("model")))
        return spec if spec is not None and spec.lifecycle != "retired" else None

    def _rejected(self, body: Json, spec: ModelSpec, tokens: int) -> str | None:
        """Why the API would answer 400 to ``body`` (before any script item is used)."""
        extra = sorted(set(body) - REQUEST_KEYS)
        if extra:
            return f"{extra[0]}: Extra inputs are not permitted"
        if "stream" in body and not isinstance(body["stream"], bool):
            return "stream: Input should be a valid boolean"
        if (why := invalid(body, spec)) is not None:
            return why
        if (why := _breakpoints(body, _units(body))[1]) is not None:
            return why
        if (why := thinking_invalid(body, spec)) is not None:
            return why
        if tokens > (most := self.window(spec)):
            return f"prompt is too long: {tokens} tokens > {most} maximum"
        return None

    def _message(self, body: Json, spec: ModelSpec, item: Reply) -> Json:
        """The Messages API's answer to ``body`` from ``item``: thinking first when the
        request turns it on, usage as scripted or computed."""
        number = next(_ids)
        model = item.model or str(body.get("model", "claude-test"))
        content = _with_cwd([dict(b) for b in item.content], body)
        thought = ""
        if _thinking_on(body):
            omitted = body["thinking"].get("display") == "omitted"
            for b in content:  # scripted thinking blocks: signed here unless they are
                if b.get("type") == "thinking":
                    thought += str(b.get("thinking", ""))
                    b.setdefault("signature", thinking_signature(model, str(b.get("thinking", ""))))
            if not any(b.get("type") in ("thinking", "redacted_thinking") for b in content):
                thought = item.thinking or f"Reading the request before answering (#{number})."
                shown = "" if omitted else thought
                opening: list[Json] = [
                    {
                        "type": "thinking",
                        "thinking": shown,
                        "signature": thinking_signature(model, shown),
                    }
                ]
                if item.redacted:
                    opening.append({"type": "redacted_thinking", "data": redacted_data(model)})
                content = opening + content
        read, created, ttl = self.cache.use(spec, body)
        if item.usage is None:
            total = count_tokens(body)
            usage: Json = {
                "input_tokens": total - read - created,
                "output_tokens": reply_tokens(content, thought),
                "cache_creation_input_tokens": created,
                "cache_read_input_tokens": read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": created if ttl == "5m" else 0,
                    "ephemeral_1h_input_tokens": created if ttl == "1h" else 0,
                },
            }
        else:
            usage = {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                **item.usage,
            }
        message = {
            "id": f"msg_{number:08d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": item.stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        if item.stop_details is not None:
            message["stop_details"] = item.stop_details
        return message

    def _next(self, body: Json) -> Item:
        with self.lock:
            if self.script:
                return self.script.popleft()
            responder = self.responder
        if responder is not None:
            return responder(body)
        return Fail(500, "the local model has no scripted reply left", "api_error")

    def _next_triage(self, body: Json) -> Item:
        with self.lock:
            if self.triage:
                return self.triage.popleft()
        return triage_answer("ready")

    def _answer(
        self, body: Json, tokens: int, next_item: Callable[[Json], Item], keep: bool = False
    ) -> tuple[Response, int]:
        """Validate ``body``, then answer it with ``next_item``'s item; ``keep``: record
        the message answered in ``responses``."""
        # Every rejection comes before the script is used, as the API's validation does.
        spec = self._model(body)
        if spec is None:
            return _err(404, "not_found_error", f"model: {body.get('model')}")
        if (why := self._rejected(body, spec, tokens)) is not None:
            return _err(400, "invalid_request_error", why)
        item = next_item(body)
        if item.delay:
            time.sleep(item.delay)
        if isinstance(item, Fail):
            resp, status = _err(item.status, item.error_type, item.message)
            for k, v in item.headers.items():
                resp.headers[k] = v
            return resp, status
        message = self._message(body, spec, item)
        if keep:
            with self.lock:
                self.responses.append(message)
        if body.get("stream") is True:
            return Response(sse_events(message), mimetype="text/event-stream"), 200
        return jsonify(message), 200

    def _build_app(self) -> Flask:
        app = Flask("local-anthropic")
        srv = self

        def unauthorized() -> tuple[Response, int] | None:
            if not request.headers.get("x-api-key") and not request.headers.get("Authorization"):
                return _err(401, "authentication_error", "missing x-api-key")
            return None

        @app.post("/v1/messages")
        def messages() -> tuple[Response, int]:
            if (denied := unauthorized()) is not None:
                return denied
            body = request.get_json(force=True)
            tokens = count_tokens(body)
            if isinstance(body, dict) and is_triage(body):  # its own script and record
                with srv.lock:
                    srv.triage_requests.append(body)
                return srv._answer(body, tokens, srv._next_triage)
            with srv.lock:
                srv.arrivals.append(time.time())
                srv.requests.append(body)
                srv.headers.append(dict(request.headers))
                srv.input_tokens.append(tokens)
            if not isinstance(body, dict):
                return _err(400, "invalid_request_error", "the body must be a JSON object")
            betas = request.headers.get("anthropic-beta", "")
            for name, beta in BETA_FIELDS.items():
                if name in body and beta not in betas:
                    return _err(
                        400, "invalid_request_error", f"{name}: Extra inputs are not permitted"
                    )
            return srv._answer(body, tokens, srv._next, keep=True)

        @app.post("/v1/messages/count_tokens")
        def count() -> tuple[Response, int]:
            if (denied := unauthorized()) is not None:
                return denied
            body = request.get_json(force=True)
            if not isinstance(body, dict):
                return _err(400, "invalid_request_error", "the body must be a JSON object")
            spec = srv._model(body)
            if spec is None:
                return _err(404, "not_found_error", f"model: {body.get('model')}")
            why = (
                conversation_invalid(body, spec.system_messages)
                or _breakpoints(body, _units(body))[1]
            )
            if why is None:
                why = thinking_invalid(body, spec)
            if why is not None:
                return _err(400, "invalid_request_error", why)
            return jsonify({"input_tokens": count_tokens(body)}), 200

        @app.get("/v1/models/<path:model_id>")
        def model(model_id: str) -> tuple[Response, int]:
            if (denied := unauthorized()) is not None:
                return denied
            spec = srv.models.get(model_id)
            if spec is None:
                return _err(404, "not_found_error", f"model: {model_id}")
            return jsonify(model_info(spec, srv.advertised(spec))), 200

        @app.get("/v1/models")
        def models() -> tuple[Response, int]:
            if (denied := unauthorized()) is not None:
                return denied
            # Newest first, as the API lists them; ``after_id``/``before_id`` page through.
            specs = sorted(srv.models.values(), key=lambda m: m.created_at, reverse=True)
            ids = [m.id for m in specs]
            try:
                limit = int(request.args.get("limit", 20))
            except ValueError:
                limit = 0
            if not 1 <= limit <= 1000:
                return _err(400, "invalid_request_error", "limit: must be between 1 and 1000")
            after, before = request.args.get("after_id"), request.args.get("before_id")
            for given in (after, before):
                if given is not None and given not in ids:
                    return _err(404, "not_found_error", f"model: {given}")
            if before is not None:
                end = ids.index(before)
                page = specs[max(0, end - limit) : end]
                more = end - limit > 0
            else:
                start = ids.index(after) + 1 if after is not None else 0
                page = specs[start : start + limit]
                more = start + limit < len(specs)
            return jsonify(
                {
                    "data": [model_info(m, srv.advertised(m)) for m in page],
                    "has_more": more,
                    "first_id": page[0].id if page else None,
                    "last_id": page[-1].id if page else None,
                }
            ), 200

        return app


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


def _err(status: int, kind: str, message: str) -> tuple[Response, int]:
    return jsonify({"type": "error", "error": {"type": kind, "message": message}}), status
