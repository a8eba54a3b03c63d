"""The model gateway's own limits, against a real gateway on a Unix socket: it lives in
the worker, outside the sandbox's memory and process limits, so what the sandbox sends
it must not be able to exhaust the worker."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import anthropic

from bot.core.models import ModelSpec
from bot.core.rules import budget
from jobs import gateway

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
