"""The model gateway's OpenAI side: Responses API requests from Codex, forwarded and metered.

The same gateway as ``jobs/gateway/messages.py`` (a Unix socket bound into the sandbox, a
placeholder key, one call at a time, the budget checked before and charged after each
call, every exchange a ``gateway_call`` event), speaking OpenAI's Responses API
(``POST /v1/responses``, and ``/v1/responses/input_tokens``) to Codex inside the sandbox
and to ``OPENAI_BASE_URL`` with ``OPENAI_API_KEY`` outside it. Per request it:

* refuses another model than the loop's, and what the API would do for the sandbox or
  bill apart from tokens: hosted tools (web search, file search, code interpreter, image
  generation, remote MCP, computer use, hosted tool search), items stored on OpenAI's side
  (``previous_response_id``, ``conversation``, ``item_reference``, stored ``prompt``), and
  inputs the API would fetch (a file id, an http(s) image or file URL);
* drops fields that change the price (``service_tier``, ``background``) and any field the
  API does not document; sends ``store: false`` (nothing kept on OpenAI's side);
* caps ``max_output_tokens`` at the loop's limit (setting it when Codex does not) and
  sets ``reasoning.effort`` to the loop's effort when the loop has one;
* reads the usage from ``response.completed`` (or ``response.incomplete``/``.failed``) and
  charges it at the OpenAI price table (``bot.core.pricing``); a cut answer is charged
  its worst case.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
from typing import Any

import httpx

from bot.core.pricing import usage_from_responses
from bot.core.record import Usage
from bot.core.rules.loop import budget
from bot.core.settings import Settings
from bot.io.logs import get_logger
from jobs.gateway.messages import ModelGateway, Refused, has_media
from jobs.gateway.usage import SseReader

log = get_logger("loopbot.gateway")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# The documented request fields passed on; anything else is dropped (an undocumented
# field is either refused by the API or does something loopbot did not decide).
FIELDS = frozenset(
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
    }
)
# Fields that bring content the request does not show (stored on OpenAI's side): the
# budget's bound cannot see it, and the sandbox would reach state it did not write.
STORED = ("previous_response_id", "conversation", "prompt")
# Tools the sandbox's own process runs: everything else is run by the API for it.
LOCAL_TOOLS = frozenset({"function", "custom", "namespace", "local_shell"})
# Input items a conversation of local tools holds (Codex's). Any other (a hosted tool's
# call or output, an item reference, a typeless item that is not a message) is refused:
# the API would run, fetch or look it up.
ITEMS = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "reasoning",
        "additional_tools",
    }
)
# What ``POST /responses/input_tokens`` takes of a request: everything that is input.
COUNTED = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "truncation",
)
# Codex's request headers passed on as Codex sends them to OpenAI (its wire format and
# request metadata); never an organisation, project or account header.
PASSED_HEADERS = (
    "x-openai-internal-codex-responses-lite",
    "x-codex-beta-features",
    "x-codex-turn-metadata",
    "x-codex-window-id",
    "x-client-request-id",
    "originator",
    "session-id",
    "thread-id",
)


def _refuse(message: str) -> Refused:
    return Refused(400, "invalid_request_error", f"loopbot: {message}")


def _check_tools(tools: Any, where: str) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _refuse(f"{where} must be a list")
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in LOCAL_TOOLS:
            raise _refuse(
                f"{where}: the tool type {kind!r} runs on the API's side (billed apart, with "
                "its own network); only function, custom and local tools are allowed"
            )
        if kind == "namespace":
            _check_tools(tool.get("tools") or [], f"{where} (namespace {tool.get('name')!r})")


def _check_items(items: Any) -> None:
    """Every input item is one of ``ITEMS`` (a message may leave its type out)."""
    if not isinstance(items, list):
        return  # a string: the user's text
    for item in items:
        if not isinstance(item, dict):
            raise _refuse("an input item must be an object")
        kind = item.get("type")
        if kind is None and "role" in item and "content" in item:
            continue  # a message without its type, as the API takes it
        if kind not in ITEMS:
            raise _refuse(
                f"the input item type {kind!r} is not one a local agent's conversation holds "
                "(a hosted tool's item or a reference to one stored on OpenAI's side)"
            )
        if kind == "additional_tools":
            _check_tools(item.get("tools"), "additional_tools")


def _check_choice(choice: Any) -> None:
    """``tool_choice``: none, auto, required, or a local tool (or an allowed set of them)."""
    if choice is None or choice in ("none", "auto", "required"):
        return
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom"):
            return
        if kind == "allowed_tools":
            _check_tools(choice.get("tools") or [], "tool_choice.allowed_tools")
            return
    raise _refuse(f"tool_choice {str(choice)[:80]!r} names no local tool")


def _remote(node: Any) -> str | None:
    """The first input part the API would fetch or look up for the sandbox: a file id,
    an http(s) image or file URL, on any part. Tool calls' arguments and outputs' text
    are data, not parts: only objects' fields are judged."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        if item.get("file_id"):
            return "a file id (a file stored on OpenAI's side)"
        for key in ("image_url", "file_url"):
            url = item.get(key)
            if isinstance(url, dict):
                url = url.get("url")
            if isinstance(url, str) and not url.startswith("data:"):
                return f"an {key} the API would fetch"
        stack.extend(v for k, v in item.items() if k not in ("arguments", "input", "text"))
    return None


def ruling_texts(body: dict[str, Any]) -> set[str]:
    """Digests of the texts that rule the model: ``instructions`` and every developer or
    system message of the input."""
    found = set()
    if isinstance(body.get("instructions"), str):
        found.add(("instructions", body["instructions"]))
    items = body.get("input")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or item.get("role") not in ("developer", "system"):
            continue
        content = item.get("content")
        parts = [content] if isinstance(content, str) else content or []
        text = "\n".join(
            p if isinstance(p, str) else str(p.get("text", ""))
            for p in parts
            if isinstance(p, (str, dict))
        )
        found.add((str(item["role"]), text))
    return {hashlib.sha256(f"{role}\0{text}".encode()).hexdigest() for role, text in found}


class ResponsesGateway(ModelGateway):
    """A loop's gateway for the codex backend: OpenAI's Responses API.

    ``trusted``: digests of the developer and system texts of the loop's first request
    (``ruling_texts``), kept with the session by the harness. Codex's resumed thread is a
    file in the sandbox's HOME, which the agent can write: a developer message it added
    there would come back with the next turn as a rule. Every later request's ruling
    texts must be among those the first request carried, else it is refused."""

    PATHS = {"/v1/responses": "call", "/v1/responses/input_tokens": "count"}
    RESPONSE_HEADERS = ("x-request-id", "openai-processing-ms")
    ERROR_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")

    def __init__(
        self, upstream: OpenAIUpstream, trusted: set[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(None, **kwargs)
        self.upstream = upstream
        self.trusted = trusted

    # -- the API -----------------------------------------------------------------------------

    def error_body(self, status: int, kind: str, message: str) -> bytes:
        code = {401: "invalid_api_key", 404: "not_found", 413: "request_too_large"}.get(status)
        error = {"message": message, "type": kind, "param": None, "code": code}
        return json.dumps({"error": error}).encode()

    def authorised(self, headers: Any) -> bool:
        bearer = headers.get("authorization") or ""
        key = bearer[7:] if bearer.lower().startswith("bearer ") else ""
        return secrets.compare_digest(key.encode(), self.placeholder.encode())

    def forwarded_headers(self, headers: Any) -> dict[str, str]:
        return {name: headers[name] for name in PASSED_HEADERS if headers.get(name)}

    def budgeted(self, body: dict[str, Any]) -> dict[str, Any]:
        # Every field but the output cap: a structured output's schema, the tool choice
        # and the rest are input the API bills too.
        seen = {k: v for k, v in body.items() if k != "max_output_tokens"}
        seen["max_tokens"] = self.max_output(body)
        if has_media(body.get("input")):
            seen[budget.MIN_INPUT] = self.policy.spec.window
        return seen

    def max_output(self, body: dict[str, Any]) -> int:
        return int(body["max_output_tokens"])

    def counting(self, body: dict[str, Any]) -> dict[str, Any]:
        return {k: body[k] for k in COUNTED if k in body}

    def reader(self) -> Any:
        return _ResponsesUsage(self.policy.model)

    def forward(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        return self.upstream.send(path.removeprefix("/v1"), body, headers)

    # -- the rules ---------------------------------------------------------------------------

    def shaped(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Refused(400, "invalid_request_error", "the body must be a JSON object")
        asked = body.get("model")
        if asked != self.policy.model:
            raise _refuse(f"this loop's model is {self.policy.model}; {asked!r} is not allowed")
        for name in STORED:
            if body.get(name):
                raise _refuse(f"`{name}` brings content stored on OpenAI's side; not allowed")
        out = {k: v for k, v in body.items() if k in FIELDS}
        _check_tools(out.get("tools"), "tools")
        _check_choice(out.get("tool_choice"))
        items = out.get("input")
        _check_items(items)
        if (why := _remote(items)) is not None or (why := _remote(out.get("text"))):
            raise _refuse(f"the request holds {why}; not allowed")
        ruling = ruling_texts(out)
        if self.trusted is None:
            self.trusted = ruling  # the loop's first request: Codex's own and loopbot's
        elif not ruling <= self.trusted:
            raise _refuse(
                "the request carries a developer or system message that the loop's first "
                "request did not (the resumed session's files were changed in the sandbox)"
            )
        out["store"] = False
        cap = min(self.policy.max_tokens, self.policy.spec.max_output)
        given = out.get("max_output_tokens")
        usable = isinstance(given, int) and not isinstance(given, bool) and given > 0
        out["max_output_tokens"] = min(int(given), cap) if usable else cap  # type: ignore[arg-type]
        effort = self.policy.effort
        if effort is not None and effort in self.policy.spec.efforts:
            reasoning = out.get("reasoning") if isinstance(out.get("reasoning"), dict) else {}
            out["reasoning"] = {**(reasoning or {}), "effort": effort}
        return out


class _ResponsesUsage(SseReader):
    """One answer's usage and content, read from the Responses stream (or whole)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.buffer = b""
        self.whole = b""
        self.final: dict[str, Any] | None = None
        self.items: dict[int, dict[str, Any]] = {}
        self.stop_reason = ""
        self.done = False

    def _event(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            self.items[int(data.get("output_index") or 0)] = data["item"]
        elif kind in ("response.completed", "response.incomplete", "response.failed") and (
            isinstance(data.get("response"), dict)
        ):
            self._final(data["response"])

    def _final(self, response: dict[str, Any]) -> None:
        self.final = response
        self.done = True
        status = str(response.get("status") or "")
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        self.stop_reason = f"{status}: {reason}" if reason else status
        output = response.get("output")
        if isinstance(output, list) and output:
            self.items = {i: o for i, o in enumerate(output) if isinstance(o, dict)}

    def usage(self) -> Usage | None:
        if self.whole:
            with contextlib.suppress(ValueError):
                whole = json.loads(self.whole)
                if isinstance(whole, dict):
                    self._final(whole)
        usage = (self.final or {}).get("usage")
        if not isinstance(usage, dict):
            return None
        return usage_from_responses(self.model, usage)

    def content(self) -> list[dict[str, Any]]:
        """The answer's output as the session log and the step count read it: text
        blocks, and each tool call as a ``tool_use`` block."""
        out: list[dict[str, Any]] = []
        for i in sorted(self.items):
            item = self.items[i]
            kind = item.get("type")
            if kind == "message":
                text = "".join(
                    str(c.get("text", ""))
                    for c in item.get("content") or []
                    if isinstance(c, dict) and c.get("type") == "output_text"
                )
                if text:
                    out.append({"type": "text", "text": text})
            elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
                given = item.get("arguments", item.get("input", item.get("action")))
                out.append(
                    {
                        "type": "tool_use",
                        "id": str(item.get("call_id", "")),
                        "name": str(item.get("name", kind)),
                        "input": {"input": given} if not isinstance(given, dict) else given,
                    }
                )
        return out


class OpenAIUpstream:
    """The worker's side of the OpenAI API: ``OPENAI_BASE_URL`` with ``OPENAI_API_KEY``
    (one HTTP client per worker; the gateway sends each of Codex's calls through it)."""

    def __init__(self, settings: Settings, timeout: float = 600.0) -> None:
        key = settings.openai_api_key
        self.base_url = str(settings.openai_base_url or DEFAULT_BASE_URL).rstrip("/")
        self.client = httpx.Client(
            base_url=self.base_url,
            headers={"authorization": f"Bearer {key.get_secret_value() if key else ''}"},
            timeout=httpx.Timeout(timeout, connect=30.0),
        )

    def send(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        """``body`` to ``path``: the answer, open for streaming (any status)."""
        request = self.client.build_request("POST", path, json=body, headers=headers)
        return self.client.send(request, stream=True)

    def count(self, request: dict[str, Any]) -> int | None:
        """``request``'s input tokens as the API counts them
        (``POST /responses/input_tokens``); None when it cannot say."""
        try:
            resp = self.client.post(
                "/responses/input_tokens", json={k: request[k] for k in COUNTED if k in request}
            )
            resp.raise_for_status()
            return int(resp.json()["input_tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("precall.count_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            return None

    def model_exists(self, model: str) -> tuple[bool, str]:
        """Whether ``GET /models/{model}`` knows ``model`` (doctor's check of the key)."""
        try:
            resp = self.client.get(f"/models/{model}", timeout=30.0)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"[:300]
        if resp.status_code == 200:
            return True, "known to the API"
        return False, f"HTTP {resp.status_code}: {resp.text[:200]}"
