"""How the list views scale with the number of loops stored.

    .venv/bin/python bench/scale.py [--loops 5000] [--smoke]

Starts a private redis-server, stores ``--loops`` loop records of a realistic size
(four findings, a verify tail, usage for two roles), then times what runs repeatedly
against all of them: one dashboard page (``/api/loops``, polled every 2 s by an open
dashboard), a Prometheus scrape (``/metrics``), the reconciler's pass over active loops
and `loopbot status`. Whole records are read only where one loop is asked for.
``--smoke``: 50 loops (see bench/_smoke.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _smoke
from bot.core.record import LoopRecord, Status, Usage
from bot.io.metrics import render
from bot.io.redis import connect
from bot.io.store import Store
from bot.standins.redis_server import RedisServer


def record(i: int) -> LoopRecord:
    statuses = list(Status)
    finding = {
        "severity": "sev2",
        "category": "tests",
        "path": "src/app.py",
        "line": 3,
        "title": "t" * 60,
        "body": "b" * 400,
    }
    return LoopRecord(
        repo=f"acme/repo{i % 50}",
        issue=i + 1,
        installation_id=1,
        status=statuses[i % len(statuses)],
        findings=[finding] * 4,
        last_verify={"passed": False, "tail": "x" * 4000, "seconds": 3.2},
        usage={
            "claude-sonnet-4-6/agent": Usage(input_tokens=90_000, output_tokens=4_000, cost_usd=1),
            "claude-sonnet-4-6/critic": Usage(input_tokens=9_000, output_tokens=900, cost_usd=0.1),
        },
        updated_at=1_700_000_000 + i,
    )


def timed(fn: Callable[[], object], runs: int = 5) -> float:
    fn()  # warm up (and let the first call backfill anything)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=5000)
    args = _smoke.parse(ap, loops=50)
    server = RedisServer().start()
    try:
        redis = connect(server.url)
        store = Store(redis)
        for i in range(args.loops):
            store.put(record(i), touch=False)
        size = len(record(0).model_dump_json())
        active = {Status.RUNNING.value, Status.QUEUED.value}
        rows = [
            ("dashboard page (50 newest)", timed(lambda: store.recent(50))),
            ("dashboard page, status filter", timed(lambda: store.recent(50, 0, "failed"))),
            ("/metrics scrape", timed(lambda: render(redis))),
            (
                "reconciler: find active loops",
                timed(lambda: [s for s in store.summaries() if s["status"] in active]),
            ),
            ("read every whole record (before)", timed(store.all)),
        ]
        print(f"{args.loops} loops stored, {size:,} bytes per record")
        print(f"{'operation':36s} {'median ms':>10s}")
        for name, ms in rows:
            print(f"{name:36s} {ms:10.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
