"""``OpenAIServer``: the Flask app and its routes, the scripts, records and stored
responses, and the answer to a request put together from the other modules."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer

from bot.standins import serving
from bot.standins.openai.cache import PromptCache
from bot.standins.openai.items import check_item, conversation_invalid
from bot.standins.openai.models import ModelSpec, default_models, model_info
from bot.standins.openai.reasoning import encrypted_reasoning, reasoning_item_id
from bot.standins.openai.replies import Fail, Item, Reply, Responder
from bot.standins.openai.response import _cut, _skeleton
from bot.standins.openai.sse import failed_events, sse_events
from bot.standins.openai.tokens import (
    REASONING_TOKENS,
    _as_items,
    _units,
    count_tokens,
    output_tokens,
)
from bot.standins.openai.tools import Offered, check_tool_choice, check_tools
from bot.standins.openai.validate import (
    COUNT_KEYS,
    REQUEST_KEYS,
    _kind_of,
    _missing,
    _typed,
    check_fields,
)
from bot.standins.openai.wire import Json, Rejected, _err, _read_body, error_body, new_id

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise


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
        self._server, self.url = serving.serve(self.app, host, port, "openai-server")
        return self

    @property
    def base_url(self) -> str:
        """What ``OPENAI_BASE_URL`` should be."""
        return f"{self.url}/v1"

    def stop(self) -> None:
        serving.stop(self._server)

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
