"""A local server for Anthropic's Messages API that plays scripted responses.

``POST /v1/messages`` answers with the next item of the script: a message (text and
tool-use blocks, a stop reason, usage with cache fields), an HTTP error such as 429 or
529 with its headers, or a delay (for stall tests). Or a ``responder`` callable decides
from the request. Every request is recorded, body and headers, for assertions.
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
            return jsonify(
                {
                    "id": f"msg_{next(_ids):08d}",
                    "type": "message",
                    "role": "assistant",
                    "model": item.model or body.get("model", "claude-test"),
                    "content": item.content,
                    "stop_reason": item.stop_reason,
                    "stop_sequence": None,
                    "usage": usage,
                }
            ), 200

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
