"""``loopbot worker --loops N``: one supervisor, N loop slots and a control lane, all real
processes. The slots run loops at the same moment; a SIGTERM to the supervisor drains
every slot (each loop handed over, none lost); a slot that dies is started again and its
loop resumed."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from redis import Redis
from rq import Worker

from bot.core.ids import LoopId
from bot.core.record import TERMINAL, Status
from bot.io import queues
from bot.io.queues import ALL_QUEUES
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web, WorkerProcess, _descendants, wait_for
from tests.helpers import CALC, TEST_CALC, reply_between_turns

YML = "verify: python3 -m unittest -q\nmax_turns: 4\ntriage:\n  enabled: false\n"
FAST = {"LOOPBOT_LEASE_TTL": "3", "LOOPBOT_RECONCILE_INTERVAL": "1"}


def repos_with_issues(github: GitHubServer, count: int) -> list[str]:
    """``count`` repositories of one installation, each with an issue; their loop keys."""
    iid = github.add_installation("acme")
    keys = []
    for i in range(count):
        repo = f"acme/r{i}"
        files = {"calc.py": CALC, "test_calc.py": TEST_CALC, ".github/loop.yml": YML}
        github.add_repo(repo, files, installation_id=iid, collaborators={"writer": "write"})
        with github.as_user("writer") as u:
            r = u.post(f"/repos/{repo}/issues", json={"title": "add", "body": "Fix calc.add."})
            keys.append(LoopId(repo, int(r.json()["number"])).key)
    return keys


def label_all(github: GitHubServer, keys: list[str]) -> None:
    for key in keys:
        loop = LoopId.parse(key)
        with github.as_user("writer") as u:
            u.post(
                f"/repos/{loop.repo}/issues/{loop.issue}/labels", json={"labels": ["loop:ready"]}
            ).raise_for_status()


def first_turns(gate: Any) -> Any:
    """A responder: each loop's first model call passes ``gate`` (a barrier or an event),
    then fixes calc.add; the next says it is done; the critic approves."""

    def respond(body: dict[str, Any]) -> m.Item:
        if (answer := reply_between_turns(body)) is not None:
            return answer
        gate()
        return m.replace("calc.py", "a - b", "a + b")

    return respond


def slots(w: WorkerProcess) -> list[int]:
    """The supervisor's own children (slots and control lane), not their horses."""
    assert w.proc is not None
    out = []
    for pid in _descendants(w.proc.pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == w.proc.pid:
            out.append(pid)
    return out


def ended(store: Store, keys: list[str]) -> bool:
    return all((r := store.get(k)) is not None and r.status in TERMINAL for k in keys)


def where(store: Store, keys: list[str]) -> list[Any]:
    """Each loop's status, phase and last events."""
    out: list[Any] = []
    for key in keys:
        r = store.get(key)
        events = [(e["kind"], str(e["data"])[:120]) for e in store.events(key)][-12:]
        out.append((key, r and (r.status.value, r.phase, r.detail[:200]), events))
    return out


def held_keys(redis: Redis) -> dict[str, Any]:
    """What a stalled loop could wait on: GitHub's pace, merge slots, leases and the loop
    queue's registries (where its jobs wait), with their time to live."""
    out: dict[str, Any] = {}
    for pattern in ("loopbot:gh-*", "loopbot:merge-slot*", "loopbot:lease*", "rq:sched*"):
        for name in redis.scan_iter(match=pattern, count=500):
            kind = redis.type(name).decode()
            value = redis.get(name) if kind == "string" else kind
            out[name.decode()] = (value, redis.pttl(name))
    for q in (queues.loop_queue(redis), queues.control_queue(redis)):
        out[q.name] = {
            "queued": q.job_ids,
            "started": q.started_job_registry.get_job_ids(),
            "scheduled": q.scheduled_job_registry.get_job_ids(),
            "deferred": q.deferred_job_registry.get_job_ids(),
            "failed": q.failed_job_registry.get_job_ids(),
        }
    return out


def merged(store: Store, key: str) -> bool:
    r = store.get(key)
    return r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged")


def test_three_slots_run_three_loops_at_once_then_stop_cleanly(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    keys = repos_with_issues(github, 3)
    # The three first turns must be in the model at the same moment: with one loop at a
    # time the barrier would break after 30 s and the loops fail.
    barrier = threading.Barrier(3, timeout=30)
    model.responder = first_turns(barrier.wait)
    w = workers("a", LOOPBOT_WORKER_LOOPS="3")
    wait_for(lambda: len(slots(w)) == 4, 30, "three slots and the control lane")
    label_all(github, keys)
    store = Store(redis)
    wait_for(lambda: ended(store, keys), 120, "the three loops to end")
    assert all(merged(store, k) for k in keys), [(k, store.get(k)) for k in keys]
    assert not barrier.broken
    for key in keys:
        assert len(github.repo(LoopId.parse(key).repo).pulls) == 1
    # A stop leaves nothing behind: every slot, horse and scheduler gone, exit status 0.
    assert w.proc is not None
    family = _descendants(w.proc.pid)
    stopping = time.monotonic()
    assert w.terminate(timeout=30) == 0, w.output()[-3000:]
    assert time.monotonic() - stopping < 15
    wait_for(lambda: not [p for p in family if Path(f"/proc/{p}").exists()], 10, "no children")


def test_sigterm_to_the_supervisor_hands_every_running_loop_over(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    keys = repos_with_issues(github, 2)
    inside = threading.Semaphore(0)
    release = threading.Event()

    def hold() -> None:  # the first turns wait in the model until the workers are stopped
        inside.release()
        release.wait(60)

    model.responder = first_turns(hold)
    w = workers("a", LOOPBOT_WORKER_LOOPS="2", **FAST)
    label_all(github, keys)
    for _ in keys:
        assert inside.acquire(timeout=60), "both loops in their first model call"
    stopping = time.monotonic()
    assert w.proc is not None
    w.proc.send_signal(signal.SIGTERM)
    # The stop travels supervisor -> slot -> horse; on a loaded machine that can take longer
    # than the rest of the turn (CI saw a loop verify, open its pull request and go on to
    # review before its drain arrived). Each slot says when it has passed SIGTERM to its
    # horse; the horse, waiting on the model's socket, sets DRAIN as the signal lands.
    wait_for(lambda: w.output().count("worker.draining") >= 2, 20, "both horses told to drain")
    release.set()  # the calls return; each loop stops at its next step instead of going on
    assert w.exited(30) == 0, w.output()[-3000:]
    assert time.monotonic() - stopping < 20
    store = Store(redis)
    for key in keys:
        r = store.get(key)
        assert r is not None and r.status == Status.QUEUED, r
        assert "handoff" in [e["kind"] for e in store.events(key)], key
    b = workers("b", LOOPBOT_WORKER_LOOPS="2", **FAST)  # the next deploy
    try:
        wait_for(lambda: ended(store, keys), 120, "both loops to end on the new worker")
    except AssertionError as exc:  # where each loop stands, to see why (seen once in CI)
        state = f"{where(store, keys)}\n{held_keys(redis)}"
        raise AssertionError(f"{exc}: {state}\n{b.output()[-6000:]}") from None
    for key in keys:
        assert merged(store, key), store.get(key)
        r = store.get(key)
        assert r is not None and r.auto_resumes == 0  # handed over, not lost
        assert len(github.repo(LoopId.parse(key).repo).pulls) == 1


def test_a_slot_that_dies_is_started_again_and_its_loop_resumed(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    keys = repos_with_issues(github, 1)
    inside = threading.Event()
    release = threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(60)

    model.responder = first_turns(hold)
    w = workers("a", LOOPBOT_WORKER_LOOPS="2", **FAST)
    wait_for(lambda: len(slots(w)) == 3, 30, "two slots and the control lane")
    label_all(github, keys)
    assert inside.wait(60)
    # The slot whose horse runs the loop: SIGKILL it and its horse, as the OOM killer would.
    busy = wait_for(lambda: _busy_slot(redis), 10, "the busy slot")
    assert busy in slots(w)
    for pid in [*_descendants(busy), busy]:
        os.kill(pid, signal.SIGKILL)
    model.responder = first_turns(lambda: None)
    release.set()
    wait_for(lambda: len(slots(w)) == 3 and busy not in slots(w), 30, "the slot started again")
    store = Store(redis)
    wait_for(lambda: ended(store, keys), 120, "the loop to end")
    assert merged(store, keys[0]), store.get(keys[0])
    r = store.get(keys[0])
    assert r is not None and r.auto_resumes == 1
    assert "supervisor.child_died" in w.output()
    assert not any(redis.llen(f"rq:queue:{q}") for q in ALL_QUEUES)


def _busy_slot(redis: Redis) -> int | None:
    """The pid of the RQ worker (a slot) running a job now."""
    busy = [w.pid for w in Worker.all(connection=redis) if w.get_state() == "busy"]
    return busy[0] if len(busy) == 1 else None


def test_a_new_worker_runs_the_scheduler_once_a_dead_one_s_lock_lapses(
    workers: Any, redis: Redis
) -> None:
    """A deploy starts the new worker while the old scheduler's lock may still stand (a
    scheduler killed, or its lock not yet expired: RQ keeps it 61 s). RQ tries the lock
    again only at its maintenance, every 10 minutes, and waits 405 s between looks when
    idle: every scheduled job (a loop's retry after its hand-over, the gate's timer) waited
    that long. CI saw a handed-over loop sit queued ~2 minutes on the new worker, until the
    reconciler's grace. The scheduler slot now looks again every few seconds."""
    lock = "rq:scheduler-lock:" + queues.LOOP_QUEUE
    redis.set(lock, "a-scheduler-that-died", ex=3)  # what is left of the old worker's
    b = workers("b", LOOPBOT_WORKER_LOOPS="2", **FAST)
    wait_for(lambda: b.output().count("supervisor.started") >= 3, 30, "the slots started")
    queues.enqueue_gate(redis, "acme/gone", 1, after=1)  # runs: "nothing to merge"
    scheduled = queues.loop_queue(redis).scheduled_job_registry
    assert scheduled.count == 1
    try:
        wait_for(lambda: scheduled.count == 0, 30, "the scheduled job to be moved to its queue")
    except AssertionError:
        raise AssertionError(b.output()[-4000:]) from None
    assert redis.get(lock) not in (None, b"a-scheduler-that-died")
