"""Prometheus metrics.

Loop state lives in Redis, shared by every process on every machine, so the loop
metrics are read from Redis at scrape time by a collector: any web process answers for
the whole deployment. Job durations are recorded by the jobs into a Redis-backed
histogram for the same reason. Webhook latency is measured in the web process itself
(set ``PROMETHEUS_MULTIPROC_DIR`` under gunicorn to aggregate its workers).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from bot.core.record import Status
from bot.core.spend.caps import MICRO
from bot.io import schedules
from bot.io.github import tally
from bot.io.queues import ALL_QUEUES
from bot.io.spend import SpendMeter
from bot.io.store import Store

JOB_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, float("inf"))
_JOB_KEY = "loopbot:metrics:job:"
_JOB_KINDS = "loopbot:metrics:job-kinds"  # which histograms exist: no keyspace SCAN per scrape

WEBHOOK_SECONDS = Histogram(
    "loopbot_webhook_seconds",
    "Time to verify, route and enqueue one webhook delivery",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


def observe_job(redis: Any, kind: str, seconds: float) -> None:
    """Record one job's duration (loop, critic, gate, dispatch)."""
    key = _JOB_KEY + kind
    pipe = redis.pipeline()
    for bound in JOB_BUCKETS:
        if seconds <= bound:
            pipe.hincrby(key, str(bound), 1)
    pipe.hincrbyfloat(key, "sum", seconds)
    pipe.sadd(_JOB_KINDS, kind)
    pipe.execute()


_PACE_KEY = "loopbot:metrics:github-pace"  # job kind -> seconds waited for GitHub's pace
_PACE_LOOP = "loopbot:github-paced:"  # + loop key: seconds its jobs waited (kept a week)


def observe_pace(redis: Any, kind: str, loop: str | None, seconds: float) -> None:
    """Record how long one job waited for GitHub's pace (bot/io/github/pace.py), in all
    and for its loop."""
    if seconds <= 0:
        return
    pipe = redis.pipeline()
    pipe.hincrbyfloat(_PACE_KEY, kind, seconds)
    if loop is not None:
        pipe.incrbyfloat(_PACE_LOOP + loop, seconds)
        pipe.expire(_PACE_LOOP + loop, 7 * 86400)
    pipe.execute()


def paced_seconds(redis: Any, loop: str) -> float:
    """How long the jobs of ``loop`` have waited for GitHub's pace."""
    return float(redis.get(_PACE_LOOP + loop) or 0.0)


# The order of the token counts in a summary (see bot.core.record.summarize).
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


class RedisCollector(Collector):
    def __init__(self, redis: Any) -> None:
        self.redis = redis

    def collect(self) -> Iterator[Any]:
        # Summaries, not whole records: a scrape stays cheap with thousands of loops.
        store = Store(self.redis)
        summaries = store.summaries()
        loops = GaugeMetricFamily("loopbot_loops", "Loops by status", labels=["status"])
        counts = {s.value: 0 for s in Status}
        for row in summaries:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        for status, n in counts.items():
            loops.add_metric([status], n)
        yield loops
        yield CounterMetricFamily(
            "loopbot_turns",
            "Agent turns started by all loops",
            value=store.counter("turns"),
        )
        yield CounterMetricFamily(
            "loopbot_cost_usd",
            "Model cost of all loops in USD",
            value=sum(row["cost_usd"] for row in summaries),
        )
        tokens = CounterMetricFamily(
            "loopbot_tokens", "Model tokens", labels=["model", "role", "kind"]
        )
        totals: dict[tuple[str, str, str], int] = {}
        for row in summaries:
            for slot, counts_by_kind in row["tokens"].items():
                model, _, role = slot.rpartition("/")
                for kind, n in zip(TOKEN_KINDS, counts_by_kind, strict=True):
                    totals[(model, role, kind)] = totals.get((model, role, kind), 0) + n
        for labels, n in sorted(totals.items()):
            tokens.add_metric(list(labels), n)
        yield tokens
        depth = GaugeMetricFamily("loopbot_queue_depth", "Jobs waiting", labels=["queue"])
        for q in ALL_QUEUES:
            depth.add_metric([q], int(self.redis.llen(f"rq:queue:{q}")))
        yield depth
        hist = HistogramMetricFamily(
            "loopbot_job_duration_seconds", "Job durations", labels=["job"]
        )
        kinds = sorted(k.decode() for k in self.redis.smembers(_JOB_KINDS))
        pipe = self.redis.pipeline(transaction=False)
        for kind in kinds:
            pipe.hgetall(_JOB_KEY + kind)
        for kind, raw in zip(kinds, pipe.execute(), strict=True):
            data = {k.decode(): float(v) for k, v in raw.items()}
            buckets = [
                (("+Inf" if b == float("inf") else str(b)), data.get(str(b), 0.0))
                for b in JOB_BUCKETS
            ]
            hist.add_metric([kind], buckets, data.get("sum", 0.0))
        yield hist
        paced = CounterMetricFamily(
            "loopbot_github_pace_wait_seconds",
            "Time jobs waited for GitHub's pace (write slots, pauses, places in flight)",
            labels=["job"],
        )
        for kind, seconds in sorted(self.redis.hgetall(_PACE_KEY).items()):
            paced.add_metric([kind.decode()], float(seconds))
        yield paced
        requests = CounterMetricFamily(
            "loopbot_github_requests",
            "GitHub requests sent, by the job that sent them, its phase (a turn, the "
            "pull request, a catch-up, a review, the gate's decision...), kind (read, "
            "write, or read304: a read answered 304 Not Modified) and route",
            labels=["job", "phase", "kind", "route"],
        )
        for c, n in sorted(tally.by_phase(self.redis).items()):
            requests.add_metric([c.job, c.phase, c.kind, c.what], n)
        yield requests
        yield from _spend(self.redis)
        yield from _schedules(self.redis)


def _spend(redis: Any) -> Iterator[Any]:
    """What every model call was billed, as charged under the spend caps (``bot.io.spend``):
    running totals that only rise, whatever happens to the loops' records."""
    labels = ["repo", "backend", "model"]
    usd = CounterMetricFamily(
        "loopbot_spend_usd", "Model spend in USD, as each call was charged", labels=labels
    )
    tokens = CounterMetricFamily(
        "loopbot_spend_tokens",
        "Model tokens billed (input, output, cache_read, cache_write)",
        labels=[*labels, "kind"],
    )
    for (repo, backend, model, kind), value in sorted(SpendMeter(redis, 0).totals().items()):
        if kind == "usd_micro":
            usd.add_metric([repo, backend, model], value / MICRO)
        else:
            tokens.add_metric([repo, backend, model, kind], value)
    yield from (usd, tokens)


def _schedules(redis: Any) -> Iterator[Any]:
    """Each schedule's runs and skipped slots, and when its next and last slots are."""
    labels = ["repo", "task"]
    runs = CounterMetricFamily(
        "loopbot_schedule_runs", "Slots a schedule ran (any outcome but skipped)", labels=labels
    )
    skips = CounterMetricFamily(
        "loopbot_schedule_skips", "Slots skipped: the last run was still active", labels=labels
    )
    next_slot = GaugeMetricFamily(
        "loopbot_schedule_next_slot_timestamp_seconds", "A schedule's next slot", labels=labels
    )
    last_slot = GaugeMetricFamily(
        "loopbot_schedule_last_slot_timestamp_seconds",
        "The slot a schedule last ran or skipped",
        labels=labels,
    )
    for row in schedules.overview(redis, time.time()):
        if row["error"]:
            continue
        key = [row["repo"], row["task"]]
        runs.add_metric(key, row["runs"])
        skips.add_metric(key, row["skips"])
        next_slot.add_metric(key, row["next"])
        if row["last_slot"] is not None:
            last_slot.add_metric(key, row["last_slot"])
    yield from (runs, skips, next_slot, last_slot)


def render(redis: Any) -> bytes:
    registry = CollectorRegistry()
    registry.register(RedisCollector(redis))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Local())
    return generate_latest(registry)


class _Local(Collector):
    """This process's own metrics (the webhook latency histogram)."""

    def collect(self) -> Iterator[Any]:
        yield from WEBHOOK_SECONDS.collect()
