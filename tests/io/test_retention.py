"""LOOPBOT_RETENTION_DAYS: an ended loop's record is archived to its cost summary, which
the spend report still reads; its detail goes (real Redis, the reconciler's step)."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner
from redis import Redis

from bot.core.record import LoopRecord, Reason, Status, Usage
from bot.io.store import Store
from bot.ops.cli import main
from jobs import reconciler
from jobs.runtime import Runtime

DAY = 86_400


def _loop(store: Store, issue: int, status: Status, ended_days_ago: float) -> LoopRecord:
    r = LoopRecord(repo="acme/widgets", issue=issue, installation_id=1, status=status)
    r.reason = Reason.MERGED.value if status is Status.COMPLETED else ""
    r.record_usage("claude-test", "agent", Usage(input_tokens=100, output_tokens=10, cost_usd=0.25))
    r.cost_usd = 0.25
    r.findings = [{"id": "F1", "body": "x" * 2000}]  # the kind of weight that goes
    r.created_at = r.updated_at = time.time() - ended_days_ago * DAY
    store.put(r, touch=False)
    store.save_conversation(r.key, [{"role": "user", "content": "hi"}])
    store.event(r.key, "loop_created", actor="writer")
    return r


def test_ended_loops_past_retention_keep_only_their_cost_summary(
    rt: Runtime, redis: Redis, env: dict[str, str]
) -> None:
    store = rt.store
    days = rt.settings.retention_days
    old = _loop(store, 1, Status.COMPLETED, days + 1)
    running = _loop(store, 2, Status.RUNNING, days + 1)  # active: never archived
    recent = _loop(store, 3, Status.FAILED, days - 1)
    assert reconciler.archive_expired(rt, time.time()) == [old.key]
    assert store.get(old.key) is None and store.conversation(old.key) == []
    assert store.events(old.key) == []
    assert store.get(running.key) is not None and store.get(recent.key) is not None
    assert store.is_archived(old.key) and not store.is_archived(recent.key)
    assert old.key not in {s["key"] for s in store.summaries()}
    (kept,) = store.archived()
    assert (kept.key, kept.status, kept.cost_usd, kept.findings) == (old.key, old.status, 0.25, [])
    assert len(redis.hget("loopbot:archive", old.key) or b"") < 1000  # compact
    assert reconciler.archive_expired(rt, time.time()) == []  # once

    out = CliRunner().invoke(
        main,
        ["report", "--since", f"{days + 2}d", "--format", "json"],
        env={"REDIS_URL": env["REDIS_URL"]},
    )
    total = json.loads(out.output)["repos"]["(total)"]
    assert (total["loops_started"], total["loops_merged"]) == (3, 1)
    assert total["usd"] == 0.75
