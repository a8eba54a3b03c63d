"""The slots and the line in a real Redis (bot/io/pace.py), the lifecycle acting on them
(jobs/lifecycle.py), and the reconciler's pass that keeps them true (jobs/reconciler.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Reason, Status
from bot.core.rules.pace import Waiter
from bot.io.pace import SLOTS, Pace
from bot.io.queues import LOOP_QUEUE
from bot.standins.github import GitHubServer
from jobs import lifecycle
from jobs.lifecycle import Pacing
from jobs.reconciler import keep_pace, resume_lapsed, show_places
from jobs.runtime import Runtime
from tests.helpers import REPO, open_issue, queued, sample_repo


def k(repo: str, n: int) -> str:
    return LoopId(repo, n).key


def fill(pace: Pace, repo: str, count: int, *, cap: int, start: int = 1) -> list[str]:
    keys = [k(repo, i) for i in range(start, start + count)]
    for i, key in enumerate(keys):
        pace.enter(key, repo, priority=False, since=float(start + i), max_parallel=cap)
    return keys


def test_enter_admits_up_to_the_cap_then_lines_up(redis: Redis) -> None:
    pace = Pace(redis)
    first = pace.enter("a/x#1", "a/x", priority=False, since=1.0, max_parallel=2, operator=20)
    assert [w.key for w in first.admitted] == ["a/x#1"] and not first.places
    pace.enter("a/x#2", "a/x", priority=False, since=2.0, max_parallel=2)
    third = pace.enter("a/x#3", "a/x", priority=False, since=3.0, max_parallel=2)
    assert third.admitted == () and third.places["a/x#3"].place == 1
    fourth = pace.enter("a/x#4", "a/x", priority=True, since=4.0, max_parallel=2)
    assert {key: p.place for key, p in fourth.places.items()} == {"a/x#4": 1, "a/x#3": 2}
    # Asking again changes nothing: a slot is kept, a place in line is kept.
    assert pace.enter("a/x#1", "a/x", priority=False, since=9.0).held
    again = pace.enter("a/x#3", "a/x", priority=True, since=9.0)
    assert again.places["a/x#3"].place == 2
    assert pace.waiter("a/x#3") == Waiter("a/x#3", "a/x", False, 3.0)
    # An end lets the first in line in: the priority loop.
    out = pace.release("a/x#1")
    assert [w.key for w in out.admitted] == ["a/x#4"]
    assert set(out.slots) == {"a/x#2", "a/x#4"}
    # Leaving the line frees no slot.
    assert pace.release("a/x#3").admitted == ()
    assert pace.state().line == {}


def test_two_ends_at_once_never_admit_past_the_cap(redis: Redis) -> None:
    """Two workers end a loop each at the same instant, again and again: each end lets in
    exactly one waiter, and the slots never hold more than the cap, even for a moment."""
    pace = Pace(redis)
    cap, rounds = 2, 15
    running = fill(pace, "a/x", cap, cap=cap)
    fill(pace, "a/x", 2 * rounds, cap=cap, start=cap + 1)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        probe = Redis(connection_pool=redis.connection_pool)
        while not stop.is_set():
            seen.append(int(probe.hlen(SLOTS)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    admitted: list[str] = []
    lock = threading.Lock()
    for _ in range(rounds):
        gate = threading.Barrier(2)
        ending = [running.pop(0), running.pop(0)]

        def end(key: str, gate: threading.Barrier = gate) -> None:
            gate.wait()
            out = Pace(redis).release(key)
            with lock:
                admitted.extend(w.key for w in out.admitted)

        threads = [threading.Thread(target=end, args=(key,)) for key in ending]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        state = pace.state()
        assert len(state.slots) == cap, state.slots
        running = sorted(state.slots, key=lambda key: int(key.partition("#")[2]))
    stop.set()
    watcher.join(5)
    assert seen and max(seen) <= cap
    assert len(admitted) == len(set(admitted)) == 2 * rounds  # each waiter once, none lost
    assert pace.state().line == {}


def test_the_operator_cap_holds_across_repositories_under_concurrent_ends(redis: Redis) -> None:
    pace = Pace(redis)
    pace.admit(operator=3)
    for repo in ("a/x", "b/y", "c/z"):
        fill(pace, repo, 1, cap=5)
    for repo in ("a/x", "b/y", "c/z"):
        fill(pace, repo, 4, cap=5, start=2)
    assert len(pace.state().slots) == 3 and len(pace.state().line) == 12
    peak = 0
    for _ in range(4):
        slots = list(pace.state().slots)
        gate = threading.Barrier(len(slots))

        def end(key: str, gate: threading.Barrier = gate) -> None:
            gate.wait()
            Pace(redis).release(key)

        threads = [threading.Thread(target=end, args=(key,)) for key in slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        peak = max(peak, len(pace.state().slots))
    assert peak == 3
    assert pace.state().line == {}


def test_reprioritize_moves_a_waiter_forward(redis: Redis) -> None:
    pace = Pace(redis)
    fill(pace, "a/x", 3, cap=1)
    assert pace.reprioritize("a/x#3", True) and not pace.reprioritize("a/x#3", True)
    assert not pace.reprioritize("a/x#1", True)  # holds a slot: nothing to move
    assert [w.key for w in pace.release("a/x#1").admitted] == ["a/x#3"]


# -- the lifecycle on the line --------------------------------------------------------------


def _create(rt: Runtime, github: GitHubServer, iid: int, cap: int) -> str:
    n = open_issue(github)
    gh = rt.github.installation(iid)
    lifecycle.create(
        rt.store,
        LoopId(REPO, n),
        installation_id=iid,
        actor="writer",
        max_turns=3,
        pacing=Pacing(priority=False, max_parallel=cap, operator_max=20, gh=gh),
    )
    return LoopId(REPO, n).key


def _status_body(github: GitHubServer, n: int) -> str:
    found = [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if c["_issue"] == n and "<!-- loopbot:status -->" in c["body"]
    ]
    assert len(found) <= 1
    return found[0] if found else ""


def test_a_loop_past_the_cap_waits_without_a_job_and_starts_when_one_ends(
    rt: Runtime, github: GitHubServer, redis: Redis
) -> None:
    iid = sample_repo(github)
    store = rt.store
    one, two = _create(rt, github, iid, 1), _create(rt, github, iid, 1)
    assert queued(redis) == 1  # only the first loop's job
    waiting = store.get(two)
    assert waiting is not None and waiting.status is Status.QUEUED
    assert waiting.waiting is not None and waiting.waiting.posted
    assert waiting.phase == "waiting (place 1)"
    assert "1st in line; 1 loop of this repository is running" in _status_body(github, 2)
    assert [e["kind"] for e in store.events(two)] == ["loop_created", "waiting"]
    # The first one ends: the second is admitted, its job enqueued, its comment updated.
    lifecycle.finish(store, one, Status.FAILED, Reason.MAX_TURNS, gh=rt.github.installation(iid))
    after = store.get(two)
    assert after is not None and after.waiting is None and after.phase == "queued"
    assert queued(redis) == 2 and Pace(redis).holds_slot(two)
    assert "in line" not in _status_body(github, 2) and "queued" in _status_body(github, 2)
    assert [e["kind"] for e in store.events(two)][-1] == "admitted"


def test_cancelling_a_waiter_leaves_the_line_and_places_move_up(
    rt: Runtime, github: GitHubServer, redis: Redis
) -> None:
    iid = sample_repo(github)
    store = rt.store
    keys = [_create(rt, github, iid, 1) for _ in range(4)]
    assert [store.get(key).waiting.place for key in keys[1:]] == [1, 2, 3]  # type: ignore[union-attr]
    # Cancelled with Redis alone (loopbot cancel): records move at once, comments later.
    assert lifecycle.cancel(redis, keys[1], Reason.CANCELLED, "cli") == "cancelled"
    assert Pace(redis).waiter(keys[1]) is None
    moved = [store.get(key).waiting for key in keys[2:]]  # type: ignore[union-attr]
    assert [(w.place, w.posted) for w in moved] == [(1, False), (2, False)]  # type: ignore[union-attr]
    assert "2nd in line" in _status_body(github, 3)
    # The reconciler's pass (it has GitHub) tells the issues; while GitHub fails it
    # tries one comment per pass, not every one, and leaves them for the next pass.
    fault = github.inject("PATCH", r"/issues/comments/\d+$", 422, times=1000)
    keep_pace(rt)
    assert show_places(rt) == 0 and fault.hits == 1
    fault.times = 0
    assert show_places(rt) == 2 and show_places(rt) == 0
    assert "1st in line" in _status_body(github, 3) and "2nd in line" in _status_body(github, 4)
    assert all(store.get(key).waiting.posted for key in keys[2:])  # type: ignore[union-attr]
    assert queued(redis) == 1


def test_the_reconciler_repairs_what_a_crash_left(
    rt: Runtime, github: GitHubServer, redis: Redis
) -> None:
    iid = sample_repo(github)
    store = rt.store
    pace = Pace(redis)
    one, two = _create(rt, github, iid, 1), _create(rt, github, iid, 1)
    # A crash between the end of the first loop and its release: the record is ended,
    # the slot still taken, the second loop stranded in line.
    ended = store.get(one)
    assert ended is not None
    store.put(ended.model_copy(update={"status": Status.FAILED, "phase": "failed"}))
    assert pace.holds_slot(one) and pace.waiter(two) is not None
    # Also: a loop queued by code that knew no pace (no slot, no place, no job), and a
    # running one from before the pace existed.
    three, four = k(REPO, 3), k(REPO, 4)
    template = store.get(two)
    assert template is not None
    for key, status in ((three, Status.QUEUED), (four, Status.RUNNING)):
        number = LoopId.parse(key).issue
        store.put(
            template.model_copy(
                update={"issue": number, "status": status, "waiting": None, "phase": "x"}
            )
        )
    assert sorted(keep_pace(rt)) == sorted([one, three, four])
    assert keep_pace(rt) == []  # nothing left to repair
    state = pace.state()
    assert set(state.slots) == {two, four}  # the stale slot went to #2; #4 is counted
    assert list(state.line) == [three]  # over the cap: #3 waits its turn
    assert store.get(two).waiting is None and queued(redis) == 2  # type: ignore[union-attr]
    assert store.get(three).waiting.place == 1  # type: ignore[union-attr]
    # A waiting loop with no job is not a lost worker, however long it waits.
    store.put(store.get(three).model_copy(update={"updated_at": 0.0}), touch=False)  # type: ignore[union-attr]
    assert resume_lapsed(rt) == []
    assert queued(redis) == 2


def test_github_down_does_not_hold_the_line(
    rt: Runtime, github: GitHubServer, redis: Redis
) -> None:
    iid = sample_repo(github)
    store = rt.store
    one, two = _create(rt, github, iid, 1), _create(rt, github, iid, 1)
    # GitHub refuses every comment edit: the waiter is admitted all the same.
    github.inject("PATCH", r"/issues/comments/\d+$", 422, times=1000)
    ended = lifecycle.finish(
        store,
        one,
        Status.FAILED,
        Reason.MAX_TURNS,
        gh=rt.github.installation(iid),
        best_effort=True,
    )
    assert ended is not None and ended.status is Status.FAILED
    admitted = store.get(two)
    assert admitted is not None and admitted.phase == "queued" and queued(redis) == 2
    assert "1st in line" in _status_body(github, 2)  # the edit that failed


def test_a_loop_the_reconciler_puts_back_in_line_keeps_its_priority(
    rt: Runtime, github: GitHubServer, redis: Redis
) -> None:
    from bot.core.record import Waiting

    iid = sample_repo(github)
    store, pace = rt.store, Pace(redis)
    _create(rt, github, iid, 1)  # holds the one slot
    plain = _create(rt, github, iid, 1)  # waits, first in line
    # A priority loop whose place in line a crash lost (its record says it waited, with
    # the priority label); the reconciler puts it back ahead of the plain one.
    template = store.get(plain)
    assert template is not None
    urgent = k(REPO, 7)
    place = Waiting(place=2, running=1, cap=1, scope="repository", priority=True)
    store.put(template.model_copy(update={"issue": 7, "waiting": place, "phase": "x"}))
    assert pace.waiter(urgent) is None
    assert urgent in keep_pace(rt)
    assert pace.waiter(urgent).priority  # type: ignore[union-attr]
    assert store.get(urgent).waiting.place == 1  # type: ignore[union-attr]
    assert store.get(plain).waiting.place == 2  # type: ignore[union-attr]


def test_the_cli_s_cancel_lets_the_next_loop_in_with_its_job(
    rt: Runtime, github: GitHubServer, redis: Redis, env: dict[str, str]
) -> None:
    """``loopbot cancel`` frees the slot, and the loop waiting for it gets its job at once.
    The CLI had not registered the job functions: the waiting loop was marked admitted
    with no job until the reconciler found it, minutes later (a red team's finding)."""
    iid = sample_repo(github)
    one, two = _create(rt, github, iid, 1), _create(rt, github, iid, 1)
    assert queued(redis) == 1
    out = subprocess.run(
        [str(Path(sys.executable).parent / "loopbot"), "cancel", one],
        env={**os.environ, "REDIS_URL": env["REDIS_URL"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "cancelled" in out.stdout, out.stdout + out.stderr
    assert "RefusedJob" not in out.stderr and "pace_failed" not in out.stderr, out.stderr
    after = rt.store.get(two)
    assert after is not None and after.waiting is None and Pace(redis).holds_slot(two)
    # The waiting loop's own job, enqueued by the CLI (the cancelled one's is gone).
    jobs = [j.decode() for j in redis.lrange(f"rq:queue:{LOOP_QUEUE}", 0, -1)]
    assert any(j.startswith(LoopId(REPO, 2).job_id) for j in jobs), jobs
