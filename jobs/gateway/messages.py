"""The model gateway: the only way to the model from inside the sandbox.

An agent backend that runs inside the sandbox (Claude Code: ``jobs/agents/claude_code.py``)
never holds the Anthropic key. It is given a placeholder key and an
``ANTHROPIC_BASE_URL`` that reaches this gateway: an HTTP server on a Unix socket
(mode 0600, owned by the sandbox's uid), bind-mounted into the sandbox, where a relay
listens on the sandbox's own loopback (as the egress proxy's socket is reached). The
gateway runs in the worker, outside the sandbox, and for each request:

* checks the placeholder key (anything else: 401), the path (``/v1/messages``, and
  ``/v1/messages/count_tokens``), and that the request names the loop's model (another
  model: 400, never forwarded);
* caps ``max_tokens`` at the loop's limit and sets thinking and effort as the loop's
  settings say (the built-in agent's ``thinking_params``);
* checks the issue's lifetime budget against the call's worst case before it is sent
  (``precall``); once a budget is spent it answers 400 with a message the CLI shows,
  and every later request gets the same (the turn then ends ``budget_exhausted``);
* counts the model calls it sends against the turn's step cap (``max_calls``), whoever
  in the sandbox makes them; past the cap it answers 400 the same way (``capped``, the
  turn then ends ``step_cap``);
* sends the request with the real key (the worker's ``anthropic`` client, no retries:
  the backend retries what the API refuses), streams the answer back as it arrives,
  reads its usage from the stream (``message_start`` and ``message_delta``, read by
  ``jobs.gateway.usage``), prices it and charges the issue; an answer cut off
  mid-stream is charged at its worst case, as the API may have billed it;
* records each exchange (``gateway_call`` events: the model, usage, cost, stop reason
  and what the model wrote) for the session log, which redacts it as it redacts the
  built-in agent's.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import secrets
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anthropic
import httpx

from bot.core import attachments
from bot.core.models import ModelSpec, thinking_params
from bot.core.record import Usage
from bot.core.rules.loop import budget
from bot.io.logs import get_logger
from jobs import precall
from jobs.gateway.usage import MessagesUsage
from jobs.sandbox import egress

log = get_logger("loopbot.gateway")

SANDBOX_SOCKET = "/run/loopbot/model.sock"
SANDBOX_PORT = 8377  # the relay inside the sandbox listens on 127.0.0.1 at this port
BASE_URL = f"http://127.0.0.1:{SANDBOX_PORT}"
PLACEHOLDER_PREFIX = "sk-ant-loopbot-placeholder-"
MAX_CONNECTIONS = 16  # concurrent connections from the sandbox (Claude Code uses one or two)
MAX_BODY = 32 * 1024 * 1024  # the Messages API's own request size limit (32 MB)
# JSON objects and arrays in one body: each costs the worker far more memory parsed than
# its two bytes of JSON (a 32 MB body of ``{}`` took 2.7 GB); a real conversation holds
# tens of thousands.
MAX_NODES = 500_000
# JSON values of any kind in one body (strings, numbers, keys too): a short string costs
# the worker some 60 bytes parsed for its 4 or 5 of JSON (a 33.6 MB body of them grew it
# by 732 MiB). Every value but a body's first follows a ``,`` or a ``:`` (or opens a
# container), so their count bounds the values without parsing; commas and colons inside
# strings count too, which only makes the bound safer. A conversation that fills a 1M
# window holds a few hundred thousand.
MAX_VALUES = 1_000_000
# What a request may carry to the API. Anything else is dropped before it is sent: a
# field that changes the price (``speed``, ``service_tier``, ``inference_geo``) or makes
# the API reach out for the sandbox (``mcp_servers``, ``container``) is not the loop's to
# ask for. These are the fields Claude Code sends, and the sampling ones.
FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "max_tokens",
        "metadata",
        "stream",
        "thinking",
        "context_management",
        "output_config",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
    }
)
# Beta features passed on, by name up to their date: none changes the price (the
# 1M-context and fast-mode betas do) or lets the API fetch for the sandbox (MCP, web).
BETAS = (
    "claude-code-",
    "interleaved-thinking-",
    "context-management-",
    "thinking-token-count-",
    "advanced-tool-use-",
    "effort-",
    "thinking-display-updates-",
    "fine-grained-tool-streaming-",
    "token-efficient-tools-",
    "prompt-caching-",
    "structured-outputs-",
)


def allowed_betas(header: str) -> str:
    """The ``anthropic-beta`` header with only the betas of ``BETAS``."""
    names = [b.strip() for b in header.split(",") if b.strip()]
    return ",".join(b for b in names if b.startswith(BETAS))


def _remote_sources(node: Any) -> bool:
    """Whether any image or document block in ``node`` (at any depth: a tool result holds
    blocks too) has a source the API would fetch (a URL, an uploaded file): the model's
    network, used by a sandbox that has none. A tool call's input is data, not a block:
    not looked into."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            source = item.get("source")
            if (
                item.get("type") in ("image", "document")
                and isinstance(source, dict)
                and source.get("type") in ("url", "file")
            ):
                return True
            stack.extend(v for k, v in item.items() if k != "input")
        elif isinstance(item, list):
            stack.extend(item)
    return False


# Content the API bills by its pixels or pages, not its bytes: a request holding any has
# no bound from its size (a 4.6 KB PDF held 242K tokens of text), so the budget assumes
# the whole context window. Anthropic's blocks and OpenAI's parts.
MEDIA = frozenset({"image", "document", "input_image", "input_file", "computer_screenshot"})


def has_media(node: Any) -> bool:
    """Whether ``node`` holds an image, a document or a file at any depth (a tool's
    result holds blocks too). A tool call's arguments are data, not content."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") in MEDIA:
                return True
            stack.extend(v for k, v in item.items() if k not in ("input", "arguments"))
        elif isinstance(item, list):
            stack.extend(item)
    return False


def image_tokens(node: Any) -> int | None:
    """The input tokens of every image in ``node`` by Anthropic's formula (width * height
    / 750, of the image as the API scales it); None when ``node`` holds media the formula
    does not bound: a document, a URL or file source, an image that does not decode."""
    total, stack = 0, [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind = item.get("type")
            if kind == "document":
                return None
            if kind == "image":
                source = item.get("source") or {}
                try:
                    data = base64.b64decode(str(source.get("data", "")), validate=True)
                except ValueError:
                    return None
                size = attachments.image_size(data) if source.get("type") == "base64" else None
                if size is None:
                    return None
                total += attachments.image_tokens(*size)
                continue
            stack.extend(v for k, v in item.items() if k != "input")
        elif isinstance(item, list):
            stack.extend(item)
    return total


# Fields of a Messages request the budget check and the token count look at.
_COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking")


@dataclass(frozen=True)
class Policy:
    """What the loop allows the backend: its model (and what the API says of it), the
    output cap, the effort."""

    model: str
    spec: ModelSpec
    max_tokens: int
    effort: str | None = None


@dataclass
class Exchange:
    """One model call through the gateway, as the session log shows it."""

    model: str
    status: int
    usage: Usage | None = None
    stop_reason: str = ""
    content: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""


class Refused(Exception):
    """A request the gateway does not forward: (status, error type, message)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


Guard = Callable[[dict[str, Any]], budget.Call]  # raises precall.OverBudget
Charge = Callable[[str, Usage], None]


class ModelGateway:
    """One loop's gateway (start it before the backend's turn, stop it after): the
    Anthropic Messages API as Claude Code and opencode speak it. ``jobs.gateway.responses``
    is the same gateway for OpenAI's Responses API (Codex); a subclass overrides the
    methods between ``-- the API --`` and ``-- the rules --``."""

    PATHS = {"/v1/messages": "call", "/v1/messages/count_tokens": "count"}
    RESPONSE_HEADERS = ("request-id", "anthropic-organization-id")
    ERROR_HEADERS = ("retry-after", "x-should-retry", "request-id")

    def __init__(
        self,
        client: anthropic.Anthropic | None,
        policy: Policy,
        *,
        run_dir: Path,
        guard: Guard,
        charge: Charge,
        on_exchange: Callable[[Exchange], None] = lambda _: None,
        sandbox_uid: int | None = None,
        timeout: float = 600.0,
    ) -> None:
        # No retries: the backend retries what the API refuses. (None: a subclass's own.)
        self.client = client.with_options(max_retries=0, timeout=timeout) if client else None
        self.policy = policy
        self.guard, self.charge, self.on_exchange = guard, charge, on_exchange
        self.placeholder = PLACEHOLDER_PREFIX + secrets.token_hex(16)
        self.run_dir = run_dir
        self.socket_path = run_dir / "model.sock"
        self.sandbox_uid = sandbox_uid
        self.exhausted = ""  # the budget's sentence, once a request was refused for it
        # Set by the harness (a step cap reached): every later request is refused.
        self.closed = ""
        # The turn's step cap, counted here (set by the harness): model calls sent to the
        # API, whoever in the sandbox made them (the CLI, or a process of its own with the
        # placeholder key, which the CLI's own cap never counts). Past it every request is
        # refused and ``capped`` says why.
        self.max_calls: int | None = None
        self.admitted = 0
        self.capped = ""
        self.calls = 0
        self.first_request: float | None = None  # monotonic, for the benchmark
        self._server: _Server | None = None
        self._lock = threading.Lock()
        self._one_call = threading.Lock()  # see _Handler.do_POST

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ModelGateway:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o711)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = _Server(str(self.socket_path), _Handler)
        server.gateway = self
        os.chmod(self.socket_path, 0o600)
        if self.sandbox_uid is not None:
            os.chown(self.socket_path, self.sandbox_uid, -1)
        # ``stop`` (at the end of every CLI turn) waits for the serving loop to notice:
        # at socketserver's default poll of 0.5 s that was up to half a second a turn.
        threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="gateway",
        ).start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> ModelGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API -----------------------------------------------------------------------------

    def error_body(self, status: int, kind: str, message: str) -> bytes:
        """An error as the API words it (the backend parses and shows it)."""
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    def forwarded_headers(self, headers: Any) -> dict[str, str]:
        """The request headers passed on to the API: only the betas of ``BETAS``."""
        betas = allowed_betas(headers.get("anthropic-beta") or "")
        return {"anthropic-beta": betas} if betas else {}

    def budgeted(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the budget check and the token count see of a shaped request."""
        seen = {k: body[k] for k in (*_COUNTED, "max_tokens") if k in body}
        if has_media(body.get("messages")) or has_media(body.get("system")):
            # Images by the documented formula on top of every byte; anything else the
            # formula does not bound (a PDF's pages, a URL) takes the whole window.
            pixels = image_tokens([body.get("messages"), body.get("system")])
            window = self.policy.spec.window
            seen[budget.MIN_INPUT] = window if pixels is None else budget.size(seen) + pixels
        return seen

    def max_output(self, body: dict[str, Any]) -> int:
        return int(body["max_tokens"])

    def counting(self, body: dict[str, Any]) -> dict[str, Any]:
        """A shaped request as the token-count path takes it."""
        body.pop("max_tokens", None)
        return body

    def reader(self) -> Any:
        """A fresh reader of one answer's usage and content (``MessagesUsage``'s methods)."""
        return MessagesUsage(self.policy.model)

    # -- the rules ---------------------------------------------------------------------------

    def shaped(self, body: Any) -> dict[str, Any]:
        """``body`` as it may be sent: the loop's model, capped output, the loop's
        thinking. Raises ``Refused`` for what is never sent."""
        if not isinstance(body, dict):
            raise Refused(400, "invalid_request_error", "the body must be a JSON object")
        asked = body.get("model")
        if asked != self.policy.model:
            raise Refused(
                400,
                "invalid_request_error",
                f"loopbot: this loop's model is {self.policy.model}; {asked!r} is not allowed",
            )
        out = {k: v for k, v in body.items() if k in FIELDS}
        tools = out.get("tools")
        if tools is not None and (
            not isinstance(tools, list)
            or any(not isinstance(t, dict) or t.get("type", "custom") != "custom" for t in tools)
        ):
            # Server tools (web search, web fetch, code execution) are billed per use and
            # reach the network for the sandbox; Claude Code's own tools are all custom.
            raise Refused(400, "invalid_request_error", "loopbot: only custom tools are allowed")
        if _remote_sources(out.get("messages")) or _remote_sources(out.get("system")):
            raise Refused(
                400,
                "invalid_request_error",
                "loopbot: content the API would fetch (a URL or file source) is not allowed",
            )
        spec = self.policy.spec
        cap = min(self.policy.max_tokens, spec.max_output)
        given = out.get("max_tokens")
        out["max_tokens"] = min(given, cap) if isinstance(given, int) and given > 0 else cap
        params = thinking_params(spec, self.policy.effort)
        if params:
            out["thinking"] = params["thinking"]
            config = {k: v for k, v in (out.get("output_config") or {}).items() if k != "effort"}
            if "output_config" in params:
                config |= params["output_config"]
            if config:
                out["output_config"] = config
            else:
                out.pop("output_config", None)
        else:
            thinking = out.get("thinking")
            if isinstance(thinking, dict) and thinking.get("type") == "enabled":
                room = out["max_tokens"] - 1
                if room < 1024:
                    out["thinking"] = {"type": "disabled"}
                else:
                    out["thinking"] = {
                        **thinking,
                        "budget_tokens": min(int(thinking.get("budget_tokens", room)), room),
                    }
        on = isinstance(out.get("thinking"), dict) and out["thinking"].get("type") in (
            "enabled",
            "adaptive",
        )
        if not on and isinstance(out.get("context_management"), dict):
            # Clearing thinking needs thinking on: without it the API refuses the edit.
            edits = [
                e
                for e in out["context_management"].get("edits") or []
                if not str(e.get("type", "")).startswith("clear_thinking")
            ]
            if edits:
                out["context_management"] = {**out["context_management"], "edits": edits}
            else:
                out.pop("context_management")
        return out

    def authorised(self, headers: Any) -> bool:
        key = headers.get("x-api-key") or ""
        bearer = headers.get("authorization") or ""
        if bearer.lower().startswith("bearer "):
            key = key or bearer[7:]
        return secrets.compare_digest(key.encode(), self.placeholder.encode())

    def admit(self, body: dict[str, Any]) -> budget.Call:
        """The budget check before a call: its worst case, or ``Refused`` (and the
        gateway refuses everything after: the budget does not come back in a turn)."""
        if self.exhausted:
            raise Refused(400, "invalid_request_error", f"loopbot: {self.exhausted}")
        if self.closed:
            raise Refused(400, "invalid_request_error", f"loopbot: {self.closed}")
        if self.max_calls is not None and self.admitted >= self.max_calls:
            self.capped = f"the turn's step cap ({self.max_calls} model calls) is reached"
            raise Refused(400, "invalid_request_error", f"loopbot: {self.capped}")
        try:
            worst = self.guard(self.budgeted(body))
        except precall.OverBudget as exc:
            self.exhausted = f"{exc.prefix}{exc}"
            raise Refused(400, "invalid_request_error", f"loopbot: {self.exhausted}") from None
        self.admitted += 1  # sent: it counts against the cap whatever the API answers
        return worst

    def forward(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The request sent with the real key: the API's answer, streaming, whatever its
        status (an error's body is read). Raises when no answer came."""
        assert self.client is not None
        try:
            raw = self.client.post(
                path,
                cast_to=httpx.Response,
                body=body,
                options={"headers": {"X-Stainless-Raw-Response": "stream", **headers}},
            )
        except anthropic.APIStatusError as exc:  # refused by the API
            return exc.response
        return cast(Any, raw).http_response


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` at once: each thread lives in
    the worker, outside the sandbox's process limit, so the agent may not open more."""

    daemon_threads = True
    request_queue_size = 64
    gateway: ModelGateway

    def __init__(self, path: str, handler: Any) -> None:
        super().__init__(path, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # over the bound: closed unanswered
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 300  # an idle kept-alive connection gives its slot back
    server: _Server

    def address_string(self) -> str:
        return "sandbox"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        paths = ", ".join(self.server.gateway.PATHS)
        self._error(404, "not_found_error", f"loopbot's gateway answers {paths} only")

    def do_POST(self) -> None:
        gw = self.server.gateway
        path = self.path.split("?", 1)[0]
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            # The worker's memory is outside the sandbox's limits: never read more than
            # the API itself accepts (413 request_too_large, as the API answers).
            self.close_connection = True
            self._error(413, "request_too_large", f"a request body is at most {MAX_BODY} bytes")
            return
        # One request at a time, from reading its body to charging its answer: each call
        # is judged against a spend that holds every call before it (concurrent calls
        # were each judged alone and overran the budget together), and the worker holds
        # one body in memory, not sixteen.
        with gw._one_call:
            self._one(gw, path, length)

    def _one(self, gw: ModelGateway, path: str, length: int) -> None:
        raw = self.rfile.read(length) if length else b""
        if self.headers.get("content-encoding", "identity").lower() != "identity":
            # Read as sent: a compressed body would be forwarded unchecked or not at all.
            self._error(415, "invalid_request_error", "loopbot's gateway takes plain JSON")
            return
        if not gw.authorised(self.headers):
            self._error(401, "authentication_error", "invalid x-api-key")
            return
        kind = gw.PATHS.get(path)
        if kind is None:
            self._error(404, "not_found_error", f"loopbot's gateway does not answer {path}")
            return
        nodes = raw.count(b"{") + raw.count(b"[")
        if nodes > MAX_NODES:
            self._error(413, "request_too_large", f"more than {MAX_NODES} JSON objects")
            return
        if nodes + raw.count(b",") + raw.count(b":") + 1 > MAX_VALUES:
            self._error(413, "request_too_large", f"more than {MAX_VALUES} JSON values")
            return
        try:
            body = gw.shaped(json.loads(raw or b"null"))
        except (ValueError, RecursionError):  # not JSON, not UTF-8, compressed
            self._error(400, "invalid_request_error", "the body is not JSON")
            return
        except Refused as exc:  # shown in the session log: the backend may not say why
            log.info("gateway.refused", why=exc.message[:200])
            gw.on_exchange(Exchange(gw.policy.model, exc.status, error=exc.message))
            self._error(exc.status, exc.kind, exc.message)
            return
        del raw
        headers = gw.forwarded_headers(self.headers)
        if kind == "count":
            # The key is not lent once the budget is spent, the step cap reached or the
            # turn closed (a count is free, but it is the operator's key and rate limit).
            # (Not marked ``capped``: the turn ends step_cap on a model call refused.)
            at_cap = gw.max_calls is not None and gw.admitted >= gw.max_calls
            cap = f"the turn's step cap ({gw.max_calls} model calls) is reached"
            if why := gw.exhausted or gw.closed or (cap if at_cap else ""):
                self._error(400, "invalid_request_error", f"loopbot: {why}")
                return
            self._relay(gw, path, gw.counting(body), headers, counted=False)
            return
        with gw._lock:
            gw.calls += 1
            if gw.first_request is None:
                gw.first_request = time.monotonic()
        try:
            worst = gw.admit(body)
        except Refused as exc:
            log.info("gateway.refused", why=exc.message[:200])
            gw.on_exchange(Exchange(gw.policy.model, exc.status, error=exc.message))
            self._error(exc.status, exc.kind, exc.message)
            return
        self._relay(gw, path, body, headers, counted=True, worst=worst)

    def _relay(
        self,
        gw: ModelGateway,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        counted: bool,
        worst: budget.Call | None = None,
    ) -> None:
        started = time.monotonic()
        model = gw.policy.model
        try:
            http_resp = gw.forward(path, body, headers)
        except Exception as exc:  # noqa: BLE001 - no answer: it may have been billed
            if counted and worst is not None:
                gw.charge(model, precall.worst_usage(worst, gw.max_output(body)))
            self._error(529, "overloaded_error", f"loopbot's gateway: {type(exc).__name__}")
            return
        if http_resp.status_code >= 400:  # refused by the API: not billed
            try:
                content = http_resp.read()
            finally:
                http_resp.close()
            self._send(http_resp.status_code, http_resp.headers, content)
            if counted:
                text = content.decode(errors="replace")[:300]
                gw.on_exchange(Exchange(model, http_resp.status_code, error=text))
            return
        reader = gw.reader()
        reader.long_cache = budget.write_rate(body) > budget.CACHE_WRITE
        complete = False
        try:
            self.send_response(http_resp.status_code)
            ctype = http_resp.headers.get("content-type", "application/json")
            self.send_header("content-type", ctype)
            self.send_header("transfer-encoding", "chunked")
            for name in gw.RESPONSE_HEADERS:
                if name in http_resp.headers:
                    self.send_header(name, http_resp.headers[name])
            self.end_headers()
            for chunk in http_resp.iter_bytes():
                if counted:
                    reader.feed(chunk, stream="event-stream" in ctype)
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            complete = True
        except Exception as exc:  # noqa: BLE001 - the sandbox's side or the API's: a cut
            log.warning("gateway.stream_cut", error=f"{type(exc).__name__}: {exc}"[:200])
            self.close_connection = True
        finally:
            http_resp.close()
        if not counted:
            return
        used = reader.usage() if complete or reader.done else None
        if used is None and worst is not None:
            used = precall.worst_usage(worst, gw.max_output(body))  # cut: the worst case
        if used is not None:
            gw.charge(model, used)
        gw.on_exchange(
            Exchange(
                model,
                http_resp.status_code,
                usage=used,
                stop_reason=reader.stop_reason,
                content=reader.content(),
                seconds=time.monotonic() - started,
                error="" if complete else "cut off",
            )
        )

    def _send(self, status: int, headers: Any, content: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", headers.get("content-type", "application/json"))
        for name in self.server.gateway.ERROR_HEADERS:
            if name in headers:
                self.send_header(name, headers[name])
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def _error(self, status: int, kind: str, message: str) -> None:
        data = self.server.gateway.error_body(status, kind, message)
        self._send(status, {"x-should-retry": "false"}, data)


def relay_prelude() -> str:
    """The shell lines that start, inside the sandbox, the relay from
    127.0.0.1:``SANDBOX_PORT`` to the gateway's socket."""
    return egress.relay_prelude(SANDBOX_SOCKET, SANDBOX_PORT, "model gateway", "no model")


def free_socket_dir(base: Path) -> Path:
    """A fresh private directory under ``base`` for one gateway's socket (a Unix socket
    path must stay under ~100 bytes)."""
    base.mkdir(parents=True, exist_ok=True)
    path = Path(os.path.join(base, "gw-" + secrets.token_hex(4)))
    path.mkdir(mode=0o711)
    return path
