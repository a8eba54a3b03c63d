"""Webhook ingress benchmark: loopbot's web app vs a bare Flask endpoint, same gunicorn.

    .venv/bin/python bench/webhook.py [--seconds 10] [--rounds 3] [--workers 2]
        [--connections 16] [--worker-class gevent|gthread|sync] [--slow-clients 50] [--smoke]

Starts a private redis-server, runs each app under gunicorn (the same settings for all:
``bot/web/serving.py``'s, as ``loopbot web`` uses, and the same worker class, gevent by
default), and drives them on loopback with signed ``issues.labeled`` deliveries, each
with a new delivery id (so loopbot verifies, dedupes, routes and enqueues every one):

1. throughput: wrk, closed loop, ``--connections`` connections for ``--seconds``, each
   app ``--rounds`` times, interleaved (bare, one write, loopbot, bare, ...) so that a
   busy spell on a shared machine hits all three; the table shows the medians;
2. latency: an open-loop driver at a fixed 200 requests/s, p50/p99;
3. slow clients (loopbot only): the same open loop while ``--slow-clients`` connections
   each send a partial request a byte every 0.5 s; p99.

Each app's stderr is appended to a file (see ``LogFile``): loopbot writes its JSON line
per delivery there, and the count of ``webhook.enqueued`` lines must equal the jobs
enqueued, which must equal the deliveries answered. Prints one table. Needs wrk
(``./scripts/setup --dev``). ``--smoke``: one round of one second, no warm-up, a smaller
rate, fewer slow clients and in-process calls (see bench/_smoke.py).
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
from bot.web.serving import GUNICORN_SETTINGS

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
-- A global, not a local: setup() runs in wrk's main Lua state and sets each thread's
-- global "tid"; a local here would shadow it, and every thread would be thread 0,
-- sending the same delivery ids (half the requests then took the duplicate path).
tid = 0
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


class LogFile:
    """A server's stderr, appended to a file as ``2>> web.log`` would: loopbot renders and
    writes its JSON line per delivery, and pays for both; a terminal instead would make
    the benchmark measure the terminal (and a collector on a pipe adds its own CPU)."""

    LINE = b'"event": "webhook.enqueued"'

    def __init__(self, path: Path) -> None:
        self.path = path

    def enqueued(self) -> int:
        """How many ``webhook.enqueued`` lines were written (read after the server exits)."""
        with self.path.open("rb") as f:
            return sum(self.LINE in line for line in f)

    def tail(self) -> str:
        return self.path.read_bytes()[-2000:].decode(errors="replace")


def gunicorn_config(directory: Path) -> Path:
    """``loopbot web``'s gunicorn settings as a config file, for every app alike."""
    path = directory / "gunicorn.conf.py"
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in GUNICORN_SETTINGS.items()))
    return path


def gunicorn(
    app: str,
    port: int,
    env: dict[str, str],
    workers: int,
    worker_class: str,
    config: Path,
    log: LogFile,
) -> subprocess.Popen[bytes]:
    cmd = [
        str(ROOT / ".venv/bin/gunicorn"),
        "--config",
        str(config),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
        "--worker-class",  # on the command line, so it wins over the config file's
        worker_class,
        "--log-level",
        "warning",
        app,
    ]
    with log.path.open("ab") as stderr:  # the server keeps its own copy
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(f"http://127.0.0.1:{port}/webhook", content=b"{}", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise SystemExit(f"{app} did not start on port {port}:\n{log.tail()}")


def run_wrk(url: str, seconds: int, connections: int) -> tuple[float, int]:
    """Requests per second, and how many requests were answered."""
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
    return float(m.group(1)), int(total.group(1))


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
    from bot.io.logs import configure, get_logger
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
    configure("json")
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the benchmark
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(devnull))
    app = create_app(load_settings(env, role="web")).test_client()
    bare = bare_app.app.test_client()
    body = json.dumps(PAYLOAD).encode()
    headers = {"X-GitHub-Event": "issues", "X-Hub-Signature-256": sign(SECRET, body)}
    conn = connect(redis_url)
    enqueuer = CommandEnqueuer(control_queue(conn))
    decision = route("issues", PAYLOAD, app_id=1, delivery="x")
    assert isinstance(decision, Enqueue)
    cmd = decision.command
    log = get_logger("loopbot.web")

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
        "the floor's RPUSH": lambda: conn.rpush("bench:in-process", body),
        "the JSON log line": lambda: log.info(
            "webhook.enqueued",
            delivery="d",
            gh_event="issues",
            action="labeled",
            kind=cmd.kind,
            repo=cmd.repo,
            issue=cmd.issue,
            actor=cmd.actor,
            job="cmd-d",
            ms=0.5,
        ),
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
    ap.add_argument(
        "--rounds", type=int, default=3, help="wrk runs of each app, interleaved; medians shown"
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--worker-class", default="gevent", choices=["gevent", "gthread", "sync"])
    ap.add_argument("--slow-clients", type=int, default=50)
    ap.add_argument(
        "--warmup", type=int, default=2, help="seconds of wrk on each app first (0: none)"
    )
    ap.add_argument("--calls", type=int, default=2000, help="in-process calls of each kind")
    args = _smoke.parse(ap, seconds=1, rounds=1, rate=50, slow_clients=5, warmup=0, calls=200)
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
    apps = {
        "bare flask": "bench.bare_app:app",
        "one write": "bench.bare_app:durable",
        "loopbot": "bot.web.wsgi:app_from_env()",
    }
    rps: dict[str, list[float]] = {name: [] for name in apps}
    latency: dict[str, tuple[float, float]] = {}
    slow_lat: list[float] = []
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs_dir = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    logs = {name: LogFile(logs_dir / f"{name.replace(' ', '-')}.log") for name in apps}
    ports = {name: free_port() for name in apps}
    urls = {name: f"http://127.0.0.1:{port}/webhook" for name, port in ports.items()}
    try:
        config = gunicorn_config(logs_dir)
        for name, app in apps.items():
            procs[name] = gunicorn(
                app, ports[name], env, args.workers, args.worker_class, config, logs[name]
            )
        answered = 0  # by loopbot: each a new delivery, so each one enqueued
        wrk_runs = 0
        if args.warmup:
            for name, url in urls.items():
                _, n = run_wrk(url, args.warmup, args.connections)
                answered += n if name == "loopbot" else 0
            wrk_runs += 1
        for _ in range(args.rounds):
            for name, url in urls.items():
                per_second, n = run_wrk(url, args.seconds, args.connections)
                rps[name].append(per_second)
                answered += n if name == "loopbot" else 0
            wrk_runs += 1
        for name, url in urls.items():
            lat = open_loop(url, args.rate, args.seconds)
            latency[name] = (pct(lat, 50), pct(lat, 99))
            answered += len(lat) if name == "loopbot" else 0
        with SlowClients(ports["loopbot"], args.slow_clients):
            slow_lat = open_loop(urls["loopbot"], args.rate, args.seconds)
        answered += len(slow_lat)
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        enqueued = int(
            subprocess.run(
                ["redis-cli", "-p", str(redis.port), "llen", "rq:queue:loopbot-control"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        logged = logs["loopbot"].enqueued()
        micro = in_process(redis.url, args.calls)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        redis.stop()
        shutil.rmtree(logs_dir)
    if logged != enqueued:
        raise SystemExit(f"loopbot enqueued {enqueued} jobs but logged {logged} of them")
    # wrk counts the answers it read; a request still in flight when a run stops is
    # enqueued but not counted: at most one per connection per run.
    if not answered <= enqueued <= answered + args.connections * wrk_runs:
        raise SystemExit(
            f"loopbot answered {answered} deliveries but enqueued {enqueued}: "
            "were some deliveries duplicates?"
        )

    median = {name: statistics.median(runs) for name, runs in rps.items()}
    print(
        f"webhook ingress, gunicorn {args.workers} {args.worker_class} workers, "
        f"wrk -c{args.connections}, {args.seconds}s x {args.rounds} interleaved (median); "
        f"latency at {args.rate} req/s open loop"
    )
    print(f"{'app':<12}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name in rps:
        p50, p99 = latency[name]
        print(f"{name:<12}{median[name]:>10.0f}{p50:>10.2f}{p99:>10.2f}")
    for name, runs in rps.items():
        print(f"  req/s in each round, {name}: {', '.join(f'{r:.0f}' for r in runs)}")
    ratio = median["loopbot"] / median["bare flask"]
    floor = median["loopbot"] / median["one write"]
    paired = [lb / ow for lb, ow in zip(rps["loopbot"], rps["one write"], strict=True)]
    print(f"loopbot / bare throughput: {ratio:.1%}   (jobs enqueued by loopbot: {enqueued})")
    print(
        f"loopbot / one Redis write per request: {floor:.1%}   (target >= 90%; "
        f"each round: {', '.join(f'{r:.1%}' for r in paired)})"
    )
    print(f"loopbot's webhook.enqueued log lines: {logged}, one per job")
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
