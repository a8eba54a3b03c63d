"""Slow clients cannot stop the webhook (issue 10, item 4).

Under gunicorn's sync workers two connections that trickle bytes held /healthz for 30 s,
longer than GitHub waits for a delivery (10 s, and it does not redeliver by itself). Here
the real ``loopbot web`` process gets 50 such connections, and /healthz and signed
deliveries must still answer within a second while they are open.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis

from bot.core import signature
from bot.io.queues import CONTROL_QUEUE
from tests.helpers import loopbot_web

SLOW_CLIENTS = 50
TRICKLE = b"POST /webhook HTTP/1.1\r\nHost: loopbot\r\nX-GitHub-Event: issues\r\n"


@contextlib.contextmanager
def slow_clients(port: int, n: int, seconds: float) -> Iterator[list[socket.socket]]:
    """``n`` connections that each send a partial request one byte every 0.5 s."""
    socks: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:
        for i in range(int(seconds / 0.5)):
            if stop.wait(0.5):
                return
            for s in socks:
                with contextlib.suppress(OSError):
                    s.send(TRICKLE[i % len(TRICKLE) : i % len(TRICKLE) + 1])

    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.send(TRICKLE[:1])
            socks.append(s)
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        time.sleep(0.7)  # the server has accepted them and is waiting for more bytes
        yield socks
    finally:
        stop.set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


def labeled(number: int) -> dict[str, object]:
    return {
        "action": "labeled",
        "issue": {"number": number},
        "label": {"name": "loop:ready"},
        "sender": {"login": "alice", "type": "User"},
        "installation": {"id": 5},
        "repository": {"full_name": "acme/widgets"},
    }


@pytest.mark.slow
def test_fifty_slow_connections_do_not_stop_healthz_or_webhooks(
    env: dict[str, str], redis: Redis, tmp_path: Path
) -> None:
    with loopbot_web(env, tmp_path / "web.log") as url:
        port = int(url.rsplit(":", 1)[1])
        secret = env["GITHUB_WEBHOOK_SECRET"]
        timings: list[tuple[str, float, int]] = []
        with slow_clients(port, SLOW_CLIENTS, seconds=5), httpx.Client(timeout=3) as client:
            for _ in range(20):
                start = time.monotonic()
                r = client.get(url + "/healthz", headers={"Connection": "close"})
                timings.append(("healthz", time.monotonic() - start, r.status_code))
            for i in range(5):
                body = json.dumps(labeled(i + 1)).encode()
                start = time.monotonic()
                r = client.post(
                    url + "/webhook",
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "X-GitHub-Event": "issues",
                        "X-GitHub-Delivery": f"slow-{i}",
                        "X-Hub-Signature-256": signature.sign(secret, body),
                        "Connection": "close",
                    },
                )
                timings.append(("webhook", time.monotonic() - start, r.status_code))
        slowest = max(t for _, t, _ in timings)
        assert all(t < 1.0 for _, t, _ in timings), f"slowest answer took {slowest:.2f}s"
        assert [c for w, _, c in timings if w == "healthz"] == [200] * 20
        assert [c for w, _, c in timings if w == "webhook"] == [202] * 5
        assert redis.llen(f"rq:queue:{CONTROL_QUEUE}") == 5  # the Lua enqueue ran under gevent
        # The slow sockets are gone; the process still serves.
        assert httpx.get(url + "/healthz", timeout=2).status_code == 200
