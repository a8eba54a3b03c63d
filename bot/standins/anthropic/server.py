"""``AnthropicServer``: the Flask app and its routes, the scripts and records a test
reads, and the answer to a request put together from the other modules."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from flask import Flask, Response, jsonify, request
from werkzeug.serving import BaseWSGIServer

from bot.standins import serving
from bot.standins.anthropic.billing import billed_usd
from bot.standins.anthropic.cache import PromptCache, _breakpoints
from bot.standins.anthropic.media import media_invalid
from bot.standins.anthropic.models import ModelSpec, default_models, model_info
from bot.standins.anthropic.replies import (
    Fail,
    Item,
    Reading,
    Reply,
    Responder,
    _ids,
    _with_cwd,
)
from bot.standins.anthropic.sse import sse_events
from bot.standins.anthropic.thinking import (
    _thinking_on,
    redacted_data,
    thinking_invalid,
    thinking_signature,
)
from bot.standins.anthropic.tokens import _units, count_tokens, reply_tokens
from bot.standins.anthropic.triage import is_triage, triage_answer
from bot.standins.anthropic.validate import BETA_FIELDS, REQUEST_KEYS, conversation_invalid, invalid
from bot.standins.anthropic.wire import Json, _err

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise


class AnthropicServer:
    def __init__(self) -> None:
        self.script: deque[Item] = deque()
        # Readiness triage requests: their own script and record, apart from ``script`` and
        # ``requests`` (see ``is_triage``); an empty script answers "ready".
        self.triage: deque[Item] = deque()
        self.triage_requests: list[Json] = []
        self.triage_responses: list[Json] = []  # triage messages answered: billed too
        self.responder: Responder | None = None
        self.requests: list[Json] = []
        self.arrivals: list[float] = []  # wall-clock time each request arrived
        self.headers: list[dict[str, str]] = []
        self.input_tokens: list[int] = []  # ``count_tokens`` of each of ``requests``
        self.counts = 0  # requests to /v1/messages/count_tokens that passed the key check
        self.responses: list[Json] = []  # every message answered (a 200), usage and all
        # Each answered request with its message: what was billed, and for what (a 200).
        self.exchanges: list[tuple[Json, Json]] = []
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
        self._server, self.url = serving.serve(self.app, host, port, "anthropic-server")
        return self

    def stop(self) -> None:
        serving.stop(self._server)

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
            self.triage_responses.clear()
            self.requests.clear()
            self.headers.clear()
            self.input_tokens.clear()
            self.counts = 0
            self.responses.clear()
            self.exchanges.clear()
            self.responder = None
        self.cache.clear()

    def billed_usd(self) -> float:
        """What the API would have billed for every message answered so far
        (``responses``, and triage's), each priced from its own usage (``billing``)."""
        with self.lock:
            answered = [*self.responses, *self.triage_responses]
        return sum(billed_usd(str(r["model"]), r["usage"]) for r in answered)

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
        if (why := media_invalid(body)) is not None:
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
        read, short, long = self.cache.use(spec, body)
        if item.usage is None:
            total = count_tokens(body)
            usage: Json = {
                "input_tokens": total - read - short - long,
                "output_tokens": reply_tokens(content, thought),
                "cache_creation_input_tokens": short + long,
                "cache_read_input_tokens": read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": short,
                    "ephemeral_1h_input_tokens": long,
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

    def _next(self, body: Json) -> Reply | Fail:
        with self.lock:
            if self.script:
                item = self.script.popleft()
                # A scripted reply that reads the request (an image in it) first.
                return item.reply(body) if isinstance(item, Reading) else item
            responder = self.responder
        if responder is not None:
            return responder(body)
        return Fail(500, "the local model has no scripted reply left", "api_error")

    def _next_triage(self, body: Json) -> Reply | Fail:
        with self.lock:
            if self.triage:
                item = self.triage.popleft()
                return item.reply(body) if isinstance(item, Reading) else item
        return triage_answer("ready")

    def _answer(
        self, body: Json, tokens: int, next_item: Callable[[Json], Reply | Fail], keep: bool = False
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
                self.exchanges.append((body, message))
        else:  # a triage answer: kept apart from ``responses``, and billed as any other
            with self.lock:
                self.triage_responses.append(message)
        if item.cut_after is not None:
            return _cut(message, body.get("stream") is True, item.cut_after), 200
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
            with srv.lock:
                srv.counts += 1
            body = request.get_json(force=True)
            if not isinstance(body, dict):
                return _err(400, "invalid_request_error", "the body must be a JSON object")
            spec = srv._model(body)
            if spec is None:
                return _err(404, "not_found_error", f"model: {body.get('model')}")
            why = (
                conversation_invalid(body, spec.system_messages)
                or media_invalid(body)
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


class _Cut(ConnectionAbortedError):
    """Raised inside a response's body to drop the connection (werkzeug closes it)."""


def _cut(message: Json, stream: bool, after: int) -> Response:
    """``message`` as it would be sent, but the connection dropped after ``after`` bytes:
    the headers promise the whole body (Content-Length), so the client sees the answer end
    early, as when a proxy or the network cuts it, and no error status."""
    whole = ("".join(sse_events(message)) if stream else json.dumps(message)).encode()
    kind = "text/event-stream" if stream else "application/json"

    def body() -> Iterator[bytes]:
        yield whole[: max(0, min(after, len(whole) - 1))]
        raise _Cut("the local model cut its answer (a scripted fault)")

    resp = Response(body(), mimetype=kind)
    resp.headers["Content-Length"] = str(len(whole))
    return resp
