"""What a test scripts: ``Reply`` and ``Fail``, and the helpers that build replies (text,
tool calls of each backend's tools, the stop reasons, structured answers)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bot.standins.anthropic.wire import Json, _blocks


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
    # The connection is dropped after this many bytes of the answer (its Content-Length
    # says the whole), as a connection cut mid-answer: the client gets a truncated body or
    # stream and no error status. None: the answer is sent whole.
    cut_after: int | None = None


@dataclass
class Fail:
    status: int
    message: str = "injected"
    error_type: str = "api_error"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Reading:
    """A scripted reply made from the request it answers: how a test's model "reads" an
    image or a document it was sent (``reply`` gets the request's body)."""

    reply: Callable[[Json], Reply | Fail]
    delay: float = 0.0


Item = Reply | Fail | Reading
Responder = Callable[[Json], Reply | Fail]
_ids = itertools.count(1)


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


def structured(obj: Json, **kw: Any) -> Reply:
    """A JSON answer, as a model does under ``output_config`` with a JSON schema."""
    return text(json.dumps(obj), **kw)
