"""Webhook ingress benchmark: loopbot's web app vs a bare Flask endpoint, same gunicorn.

    .venv/bin/python bench/webhook.py [--seconds 10] [--workers 2] [--connections 16]
        [--worker-class gevent|gthread|sync] [--slow-clients 50] [--smoke]

Starts a private redis-server, runs each app under gunicorn (the same worker class and
settings; gevent by default, as ``loopbot web`` and the Procfile), and drives both on
loopback with signed ``issues.labeled`` deliveries, each with a new delivery id (so
loopbot verifies, dedupes, routes and enqueues every one):

1. throughput: wrk, closed loop, ``--connections`` connections for ``--seconds``;
2. latency: an open-loop driver at a fixed 200 requests/s, p50/p99;
3. slow clients (loopbot only): the same open loop while ``--slow-clients`` connections
   each send a partial request a byte every 0.5 s; p99.

Prints one table. Needs wrk (``./scripts/setup --dev``). ``--smoke``: one second each, no
warm-up, a smaller rate, fewer slow clients and in-process calls (see bench/_smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _smoke
from bot.core.signature import sign, verify
from bot.standins.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
SECRET = "bench-secret"
KEY = (
    "-----BEGIN RSA PRIVATE KEY-----\nbench-key-not-used-by-the-web-process\n"
    "-----END RSA PRIVATE KEY-----\n"
)
PAYLOAD = {
    "action": "labeled",
    "issue": {"number": 7, "title": "t", "body": "b" * 2000},
    "label": {"name": "loop:ready"},
    "sender": {"login": "alice", "type": "User"},
    "installation": {"id": 1},
    "repository": {"full_name": "acme/widgets"},
}

# Every request is a new delivery with its own body (GitHub never sends the same body
# twice: it carries the delivery's own timestamps), so loopbot's replay check passes and
# each request is verified, deduped, routed and enqueued. wrk cannot compute an HMAC, so
# the signatures are computed here, one per body, and indexed by the request counter.
WRK_LUA = """
local prefix = [[%PREFIX%]]
local suffix = [[%SUFFIX%]]
local sigs = {%SIGS%}
local counter = 0
local thread_id = 0
local tid = 0
setup = function(thread) thread:set("tid", tid); tid = tid + 1 end
init = function(args) thread_id = tid end
request = function()
  local n = (counter * 2 + thread_id) %% #sigs
  counter = counter + 1
  local headers = {}
  headers["Content-Type"] = "application/json"
  headers["X-GitHub-Event"] = "issues"
  headers["X-GitHub-Delivery"] = string.format("wrk-%%s-%%d-%%d", "%RUN%", thread_id, counter)
  headers["X-Hub-Signature-256"] = sigs[n + 1]
  return wrk.format("POST", "/webhook", headers, prefix .. n .. suffix)
end
"""
WRK_BODIES_PER_SECOND = 12_000  # more than a run sends: a repeat would be a (cheaper) replay


def gunicorn(
    app: str, port: int, env: dict[str, str], workers: int, worker_class: str
) -> subprocess.Popen[bytes]:
    cmd = [
        str(ROOT / ".venv/bin/gunicorn"),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--worker-class",
        worker_class,
        "--log-level",
        "warning",
        app,
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(f"http://127.0.0.1:{port}/webhook", content=b"{}", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{app} did not start on port {port}")


def run_wrk(url: str, seconds: int, connections: int) -> float:
    count = WRK_BODIES_PER_SECOND * max(seconds, 2)
    run = uuid.uuid4().hex[:8]
    prefix, suffix = json.dumps({**PAYLOAD, "bench": f"{run}-@@"}).split("@@")
    sigs = ",".join(f'"{sign(SECRET, f"{prefix}{n}{suffix}".encode())}"' for n in range(count))
    lua = (
        WRK_LUA.replace("%PREFIX%", prefix)
        .replace("%SUFFIX%", suffix)
        .replace("%SIGS%", sigs)
        .replace("%RUN%", run)
    ).replace("%%", "%")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", f.name, url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(f.name)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise SystemExit(f"wrk saw {non2xx.group(1)} error responses:\n{out}")
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    assert m, out
    total = re.search(r"(\d+) requests in", out)
    assert total, out
    if int(total.group(1)) > count:
        raise SystemExit(f"wrk sent more than {count} requests: raise WRK_BODIES_PER_SECOND")
    return float(m.group(1))


def signed_body(tag: str) -> tuple[bytes, str]:
    """A delivery body of its own (see WRK_LUA) and its signature."""
    body = json.dumps({**PAYLOAD, "bench": tag}).encode()
    return body, sign(SECRET, body)


def open_loop(url: str, rate: int, seconds: int) -> list[float]:
    """Send ``rate`` requests/s on a fixed schedule; latency counts from the scheduled time."""
    run = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    lock = threading.Lock()
    total = rate * seconds
    start = time.perf_counter() + 0.2
    n_threads = 8

    def worker(k: int) -> None:
        with httpx.Client(timeout=5) as client:
            for i in range(k, total, n_threads):
                due = start + i / rate
                body, sig = signed_body(f"{run}-{i}")
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                r = client.post(
                    url,
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "X-GitHub-Event": "issues",
                        "X-GitHub-Delivery": f"lat-{uuid.uuid4()}",
                        "X-Hub-Signature-256": sig,
                    },
                )
                done = time.perf_counter()
                assert r.status_code in (200, 202), r.text
                with lock:
                    latencies.append((done - due) * 1000)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(latencies) != total:  # a thread failed (its error is printed above)
        raise SystemExit(f"open loop: {len(latencies)} of {total} requests answered 200/202")
    return latencies


class SlowClients:
    """``n`` connections that each send a partial request one byte every 0.5 s."""

    LINE = b"POST /webhook HTTP/1.1\r\nHost: bench\r\nX-GitHub-Event: issues\r\n"

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.socks: list[socket.socket] = []
        self.stop = threading.Event()

    def __enter__(self) -> SlowClients:
        for _ in range(self.n):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            s.send(self.LINE[:1])
            self.socks.append(s)
        threading.Thread(target=self._trickle, daemon=True).start()
        time.sleep(0.5)
        return self

    def _trickle(self) -> None:
        i = 1
        while not self.stop.wait(0.5):
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.send(self.LINE[i % len(self.LINE) : i % len(self.LINE) + 1])
            i += 1

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()


def in_process(redis_url: str, n: int = 2000) -> dict[str, float]:
    """Microseconds per call without HTTP: where a loopbot request's time goes."""
    import bare_app  # type: ignore[import-not-found]  # bench/ is on sys.path as a script
    import structlog

    from bot.core.rules.routing import Enqueue, route
    from bot.core.settings import load_settings
    from bot.io.queues import CommandEnqueuer, control_queue
    from bot.io.redis import connect
    from bot.web.app import create_app

    env = {
        "REDIS_URL": redis_url,
        "GITHUB_APP_ID": "1",
        "GITHUB_PRIVATE_KEY": KEY,
        "GITHUB_WEBHOOK_SECRET": SECRET,
    }
    # Logging as in production (a JSON line per request), written to /dev/null.
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the benchmark
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(devnull))
    app = create_app(load_settings(env, role="web")).test_client()
    bare = bare_app.app.test_client()
    body = json.dumps(PAYLOAD).encode()
    headers = {"X-GitHub-Event": "issues", "X-Hub-Signature-256": sign(SECRET, body)}
    conn = connect(redis_url)
    enqueuer = CommandEnqueuer(control_queue(conn))
    decision = route("issues", PAYLOAD, app_id=1, delivery="x")
    assert isinstance(decision, Enqueue)
    cmd = decision.command

    def loopbot() -> None:
        tag = uuid.uuid4().hex
        one, sig = signed_body(tag)
        h = {**headers, "X-GitHub-Delivery": tag, "X-Hub-Signature-256": sig}
        response = app.post("/webhook", data=one, headers=h)
        assert response.json == {"status": "queued", "job": f"cmd-{tag}"}, response.json

    calls: dict[str, Callable[[], object]] = {
        "bare flask request": lambda: bare.post("/webhook", data=body),
        "loopbot request": loopbot,
        "verify + parse + route": lambda: (
            verify(SECRET.encode(), body, headers["X-Hub-Signature-256"]),
            route("issues", json.loads(body), app_id=1, delivery=uuid.uuid4().hex),
        ),
        "enqueue (one round trip)": lambda: enqueuer.enqueue(
            cmd.model_copy(update={"delivery": uuid.uuid4().hex}), uuid.uuid4().hex
        ),
        "one Redis PING": conn.ping,
    }
    out = {}
    for name, fn in calls.items():
        for _ in range(max(n // 10, 1)):  # warm-up
            fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - start) / n * 1e6
    return out


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--worker-class", default="gevent", choices=["gevent", "gthread", "sync"])
    ap.add_argument("--slow-clients", type=int, default=50)
    ap.add_argument(
        "--warmup", type=int, default=2, help="seconds of wrk before each run (0: none)"
    )
    ap.add_argument("--calls", type=int, default=2000, help="in-process calls of each kind")
    args = _smoke.parse(ap, seconds=1, rate=50, slow_clients=5, warmup=0, calls=200)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: ./scripts/setup --dev")

    redis = RedisServer().start()
    env = {
        **os.environ,
        "REDIS_URL": redis.url,
        "GITHUB_APP_ID": "1",
        "GITHUB_PRIVATE_KEY": KEY,
        "GITHUB_WEBHOOK_SECRET": SECRET,
        "LOOPBOT_LOG_FORMAT": "json",
        "PYTHONPATH": str(ROOT),
    }
    results = {}
    slow_lat: list[float] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, app in [
            ("bare flask", "bench.bare_app:app"),
            ("one write", "bench.bare_app:durable"),
            ("loopbot", "bot.web.wsgi:app_from_env()"),
        ]:
            port = free_port()
            proc = gunicorn(app, port, env, args.workers, args.worker_class)
            procs.append(proc)
            url = f"http://127.0.0.1:{port}/webhook"
            if args.warmup:
                run_wrk(url, args.warmup, args.connections)
            rps = run_wrk(url, args.seconds, args.connections)
            lat = open_loop(url, args.rate, args.seconds)
            results[name] = (rps, pct(lat, 50), pct(lat, 99))
            if name == "loopbot":
                with SlowClients(port, args.slow_clients):
                    slow_lat = open_loop(url, args.rate, args.seconds)
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        micro = in_process(redis.url, args.calls)
        enqueued = subprocess.run(
            ["redis-cli", "-p", str(redis.port), "llen", "rq:queue:loopbot-control"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        redis.stop()

    print(
        f"webhook ingress, gunicorn {args.workers} {args.worker_class} workers, "
        f"wrk -c{args.connections}, "
        f"{args.seconds}s; latency at {args.rate} req/s open loop"
    )
    print(f"{'app':<12}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name, (rps, p50, p99) in results.items():
        print(f"{name:<12}{rps:>10.0f}{p50:>10.2f}{p99:>10.2f}")
    ratio = results["loopbot"][0] / results["bare flask"][0]
    floor = results["loopbot"][0] / results["one write"][0]
    print(f"loopbot / bare throughput: {ratio:.1%}   (jobs enqueued by loopbot: {enqueued})")
    print(f"loopbot / one Redis write per request: {floor:.1%}   (target >= 90%)")
    print(
        f"loopbot with {args.slow_clients} slow clients open: p99 {pct(slow_lat, 99):.2f} ms "
        f"(p50 {pct(slow_lat, 50):.2f} ms)"
    )
    print("\nin-process, no HTTP (µs per call):")
    for name, us in micro.items():
        print(f"  {name:<24}{us:>8.0f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
