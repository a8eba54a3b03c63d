"""What a test scripts: ``Reply`` and ``Fail``, and the helpers that build replies (text,
function and custom tool calls, Codex's code mode, a cut reply)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.standins.openai.wire import Json


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
