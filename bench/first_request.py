"""Latency from a signed ``issues.labeled`` delivery to the first model request.

    .venv/bin/python bench/first_request.py [--rounds 10] [--smoke]

Everything real but GitHub and the model (local servers): the web app, a
``loopbot worker`` process (forking RQ worker plus its control lane), Redis, git and
the sandbox. One loop runs first to warm the worker's mirror; then, each round, a
writer labels a new issue and the time until the model server receives the loop's
first request is measured (that includes the webhook, the permission check, the
config read, the status comment, the mirror fetch and the worktree). ``--smoke``: one
round (see bench/_smoke.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from werkzeug.serving import make_server

from bench import _env, _smoke
from bot.core.ids import LoopId
from bot.core.record import TERMINAL
from bot.io.logs import configure
from bot.standins import anthropic as m
from bot.web.app import create_app

REPO = "bench/latency"
YML = "verify: exit 0\nmax_turns: 1\ncritic:\n  enabled: false\nmerge:\n  enabled: false\n"


def fail(b: _env.Bench, why: str) -> NoReturn:
    """Stop with the end of the worker's log, which says why (e.g. it did not start)."""
    tail = (b.root / "worker.log").read_text(errors="replace")[-3000:]
    raise SystemExit(f"{why}; the end of {b.root}/worker.log:\n{tail}")


def wait_until_finished(b: _env.Bench, worker: subprocess.Popen[bytes], issue: int) -> None:
    """Wait for the loop to end, so that the next round starts on an idle worker."""
    deadline = time.time() + 60
    while time.time() < deadline and worker.poll() is None:
        r = b.rt.store.get(LoopId(REPO, issue))
        if r is not None and r.status in TERMINAL:
            return
        time.sleep(0.02)
    fail(b, f"the loop for issue #{issue} did not finish")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    args = _smoke.parse(ap, rounds=1)
    configure("json", level=logging.WARNING)
    b = _env.start()
    worker = None
    try:
        server = make_server("127.0.0.1", 0, create_app(b.rt.settings, b.rt.redis), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        b.github.webhook_url = f"http://127.0.0.1:{server.server_port}/webhook"
        iid = b.github.add_installation("bench")
        b.github.add_repo(
            REPO,
            {".github/loop.yml": YML, "README.md": "hi\n"},
            installation_id=iid,
            collaborators={"writer": "write"},
        )
        b.model.responder = lambda body: m.text("nothing to do")
        log = open(b.root / "worker.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [sys.executable, "-m", "bot.ops.cli", "worker"],
            env={**os.environ, **b.env},
            stdout=log,
            stderr=log,
        )
        latencies = []
        with b.github.as_user("writer") as u:
            for i in range(args.rounds + 1):
                n = u.post(f"/repos/{REPO}/issues", json={"title": f"t{i}", "body": "b"}).json()[
                    "number"
                ]
                seen = len(b.model.arrivals)
                t0 = time.time()
                u.post(f"/repos/{REPO}/issues/{n}/labels", json={"labels": ["loop:ready"]})
                deadline = time.time() + 30
                while len(b.model.arrivals) == seen and time.time() < deadline:
                    if worker.poll() is not None:
                        fail(b, f"the worker exited with {worker.returncode}")
                    time.sleep(0.002)
                if len(b.model.arrivals) == seen:
                    fail(b, f"no model request for issue #{n}")
                if i > 0:  # round 0 warms the mirror
                    latencies.append((b.model.arrivals[seen] - t0) * 1000)
                wait_until_finished(b, worker, n)
        latencies.sort()
        print(f"labeled → first model request, warm mirror, {len(latencies)} rounds:")
        print(
            f"  median {statistics.median(latencies):.0f} ms   max {latencies[-1]:.0f} ms "
            f"  (target < 1000 ms)"
        )
    finally:
        if worker is not None:
            stop_worker(worker, b.root / "worker.log")
        b.close()


def stop_worker(worker: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, as a deploy: a worker drains (a short job it runs, say a status comment's
    writes in GitHub's one-a-second line, finishes first), so it may take a while on a
    loaded machine; how long, and what it was doing when it took more than 10 s, is
    printed. A worker still running after 60 s is a failure, with its log's end."""
    started = time.monotonic()
    worker.terminate()
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        raise SystemExit(f"the worker did not stop in 60 s; its log ends:\n{_tail(log)}") from None
    took = time.monotonic() - started
    if took > 10:
        print(f"  the worker took {took:.1f} s to stop; its log ends:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_bytes()[-3000:].decode(errors="replace") if log.exists() else "(no log)"


if __name__ == "__main__":
    main()
