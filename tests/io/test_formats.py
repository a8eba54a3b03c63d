"""Formats two releases share on one Redis (bot/core/formats.py): what release 0.1.0
wrote is read by this one, and a job or record from a newer release is left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from bot.core import formats
from bot.core.record import LoopRecord, Status
from bot.io.queues import (
    ALL_QUEUES,
    COMMAND_ENTRY,
    CONTROL_QUEUE,
    LOOP_QUEUE,
    JobKind,
    fetch_job,
    func_name,
)
from bot.io.store import Store
from jobs import entry
from tests.conftest import run_worker
from tests.helpers import DATA

# Job format 1, as release 0.1.0 wrote and ran it: a release that changes any of these
# must bump JOB_FORMAT (and move its queues), or old workers would run what they do not
# know and new ones would refuse what is already queued.
FORMAT_1_QUEUES = ("loopbot-control", "loopbot-loops")
FORMAT_1_FUNCTIONS = {
    JobKind.COMMAND: "jobs.dispatch.handle_command",
    JobKind.LOOP: "jobs.loop.run_loop",
    JobKind.CRITIC: "jobs.critic.run_critic",
    JobKind.GATE: "jobs.merge_gate.run_gate",
}


def test_job_format_1_keeps_release_0_1_0s_queues_and_functions() -> None:
    assert formats.JOB_FORMAT == 1, "a new job format: add its queues and keep reading 1"
    assert (CONTROL_QUEUE, LOOP_QUEUE) == FORMAT_1_QUEUES
    assert set(FORMAT_1_QUEUES) <= set(ALL_QUEUES)
    assert {kind: func_name(kind) for kind in JobKind} == FORMAT_1_FUNCTIONS
    assert set(entry.JOBS) == set(FORMAT_1_FUNCTIONS)


@pytest.mark.parametrize(
    ("base", "fmt", "name"),
    [("loopbot-loops", 1, "loopbot-loops"), ("loopbot-loops", 2, "loopbot-loops-v2")],
)
def test_a_new_job_format_gets_queues_an_older_worker_never_reads(
    base: str, fmt: int, name: str
) -> None:
    assert formats.queue_name(base, fmt) == name


@pytest.mark.parametrize(
    ("meta", "refused"),
    [
        ({}, False),  # release 0.1.0 wrote no format: 1
        ({"format": 1}, False),
        ({"format": 2}, True),
        ({"format": "1"}, True),
        ({"format": True}, True),
        ({"format": 0}, True),
    ],
)
def test_which_job_formats_a_worker_runs(meta: dict[str, object], refused: bool) -> None:
    assert (formats.job_format_problem(meta) is not None) is refused


def test_every_job_carries_its_format(redis: Redis) -> None:
    from bot.io.queues import enqueue_critic, enqueue_gate

    enqueue_critic(redis, "acme/widgets", 1)
    enqueue_gate(redis, "acme/widgets", 1)
    queue = Queue(LOOP_QUEUE, connection=redis, serializer=JSONSerializer)
    assert [fetch_job(j, redis).meta for j in queue.job_ids] == [{"format": 1}] * 2


def test_a_job_from_a_newer_release_is_refused_not_run(redis: Redis, tmp_path: Path) -> None:
    # What a release with job format 2 would look like if it (wrongly) used these queues.
    marker = tmp_path / "ran"
    job = Queue(CONTROL_QUEUE, connection=redis, serializer=JSONSerializer).enqueue(
        COMMAND_ENTRY, json.dumps({"touch": str(marker)}), meta={"format": 2}
    )
    run_worker(redis)
    fetched = fetch_job(job.id, redis)
    assert fetched.get_status(refresh=True) == "failed"
    result = fetched.latest_result()
    assert result is not None and "job format 2" in (result.exc_string or "")
    assert not marker.exists()


def test_a_record_release_0_1_0_wrote_is_read_and_updated(redis: Redis) -> None:
    raw = (DATA / "record_v0.1.0.json").read_text()
    assert '"format"' not in raw  # as 0.1.0 wrote it
    redis.set("loopbot:loop:acme/widgets#7", raw)
    store = Store(redis)
    record = store.get("acme/widgets#7")
    assert record is not None
    assert (record.format, record.status, record.turn, record.pr_number) == (
        1,
        Status.RUNNING,
        2,
        9,
    )
    assert record.usage["claude-test/agent"].input_tokens == 100
    assert record.waiting is not None and record.waiting.cap == 2
    assert record.sections[0]["done"] is True
    store.set_fields("acme/widgets#7", phase="verify")
    # Every field 0.1.0 wrote is still there, with its value, after this release rewrote it.
    after = json.loads(redis.get("loopbot:loop:acme/widgets#7") or b"{}")
    before = json.loads(raw)
    changed = {k for k in before if before[k] != after.get(k)}
    assert changed == {"phase", "updated_at", "active_seconds"}, changed


def test_a_record_from_a_newer_release_is_never_rewritten(redis: Redis) -> None:
    record = LoopRecord(repo="acme/widgets", issue=8, installation_id=1)
    newer = json.loads(record.model_dump_json()) | {"format": 2, "field_of_v3": {"x": 1}}
    redis.set("loopbot:loop:acme/widgets#8", json.dumps(newer))
    with pytest.raises(formats.NewerFormat, match="newer release"):
        Store(redis).set_fields("acme/widgets#8", phase="verify")
    assert json.loads(redis.get("loopbot:loop:acme/widgets#8") or b"{}") == newer
