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
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.serving import BaseWSGIServer, make_server

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise

Json = dict[str, Any]


@dataclass
class Reply:
    content: list[Json]
    stop_reason: str = "end_turn"
    usage: Json = field(default_factory=lambda: {"input_tokens": 100, "output_tokens": 50})
    delay: float = 0.0
    model: str | None = None
    stop_details: Json | None = None  # a refusal's {"type": "refusal", "category", ...}


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
    content = msg.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _tool_use_ids(msg: Json) -> list[str]:
    if msg.get("role") != "assistant":
        return []
    return [str(b.get("id")) for b in _blocks(msg) if b.get("type") == "tool_use"]


def invalid(body: Json) -> str | None:
    """Why the real Messages API would reject ``body`` with a 400, in its words; or None.

    Checks what a harness can get wrong when it stores, cuts or resumes a conversation:
    ``max_tokens`` within the model's output limit, no empty message but an optional
    final assistant one, every tool_use answered by a tool_result in the very next
    message, and every tool_result answering a tool_use of the message before.
    """
    limit = body.get("max_tokens")
    if not isinstance(limit, int) or limit < 1:
        return "max_tokens: Field required to be a positive integer"
    if limit > MAX_OUTPUT_TOKENS:
        return (
            f"max_tokens: {limit} > {MAX_OUTPUT_TOKENS}, which is the maximum allowed "
            f"number of output tokens for {body.get('model')}"
        )
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "messages: at least one message is required"
    for i, msg in enumerate(msgs):
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


class AnthropicServer:
    def __init__(self) -> None:
        self.script: deque[Item] = deque()
        self.responder: Responder | None = None
        self.requests: list[Json] = []
        self.arrivals: list[float] = []  # wall-clock time each request arrived
        self.headers: list[dict[str, str]] = []
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

    def reset(self) -> None:
        with self.lock:
            self.script.clear()
            self.requests.clear()
            self.headers.clear()
            self.responder = None

    def _next(self, body: Json) -> Item:
        with self.lock:
            if self.script:
                return self.script.popleft()
            responder = self.responder
        if responder is not None:
            return responder(body)
        return Fail(500, "the local model has no scripted reply left", "api_error")

    def _build_app(self) -> Flask:
        app = Flask("local-anthropic")
        srv = self

        @app.post("/v1/messages")
        def messages() -> tuple[Response, int]:
            if not request.headers.get("x-api-key") and not request.headers.get("Authorization"):
                return _err(401, "authentication_error", "missing x-api-key")
            body = request.get_json(force=True)
            with srv.lock:
                srv.arrivals.append(time.time())
                srv.requests.append(body)
                srv.headers.append(dict(request.headers))
            if (why := invalid(body)) is not None:
                return _err(400, "invalid_request_error", why)  # the script is not used
            item = srv._next(body)
            if item.delay:
                time.sleep(item.delay)
            if isinstance(item, Fail):
                resp, status = _err(item.status, item.error_type, item.message)
                for k, v in item.headers.items():
                    resp.headers[k] = v
                return resp, status
            usage = {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                **item.usage,
            }
            message = {
                "id": f"msg_{next(_ids):08d}",
                "type": "message",
                "role": "assistant",
                "model": item.model or body.get("model", "claude-test"),
                "content": item.content,
                "stop_reason": item.stop_reason,
                "stop_sequence": None,
                "usage": usage,
            }
            if item.stop_details is not None:
                message["stop_details"] = item.stop_details
            return jsonify(message), 200

        @app.post("/v1/messages/count_tokens")
        def count() -> tuple[Response, int]:
            body = request.get_json(force=True)
            return jsonify({"input_tokens": len(json.dumps(body)) // 4}), 200

        @app.get("/v1/models")
        def models() -> tuple[Response, int]:
            return jsonify(
                {"data": [{"id": "claude-test", "type": "model"}], "has_more": False}
            ), 200

        return app


def _err(status: int, kind: str, message: str) -> tuple[Response, int]:
    return jsonify({"type": "error", "error": {"type": kind, "message": message}}), status
