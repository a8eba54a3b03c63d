"""A repository's merge slot (jobs/merge_slot.py) in a real Redis: one holder at a time,
kept by its holder, lapsing if the holder stalls, let go only by its holder, and the
gates of the loops that waited for it queued when it is let go (a loop's end does so);
through the real gate: a loop that ended while its gate read GitHub holds no slot, and
a holder waiting for its new head's checks keeps it."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Reason, Status
from bot.io.queues import LOOP_QUEUE
from bot.io.store import Store
from bot.standins import gitrepo
from bot.standins.github import GitHubServer
from jobs import lifecycle, merge_slot
from jobs.review import gate as merge_gate
from jobs.runtime import Runtime
from tests.helpers import REPO, merge_facts, open_issue, sample_repo

A, B, C = LoopId("acme/widgets", 1), LoopId("acme/widgets", 2), LoopId("acme/widgets", 3)
OTHER_REPO = LoopId("acme/gadgets", 1)


def gates_queued(redis: Redis) -> list[str]:
    ids = [i.decode() for i in redis.lrange(f"rq:queue:{LOOP_QUEUE}", 0, -1)]
    return sorted(
        redis.hget(f"rq:job:{i}", "description").decode()  # type: ignore[union-attr]
        for i in ids
    )


def test_one_holder_per_repository_kept_by_it_and_lapsing_if_it_stalls(redis: Redis) -> None:
    assert merge_slot.take(redis, A, seconds=0.5) is None
    assert merge_slot.take(redis, A, seconds=0.5) is None  # its holder keeps it
    assert merge_slot.take(redis, B) == A.key  # another loop of the repository waits
    assert merge_slot.take(redis, OTHER_REPO) is None  # another repository has its own
    merge_slot.release(redis, B)  # not B's to let go
    assert merge_slot.holder(redis, A.repo) == A.key
    time.sleep(0.7)  # A stalled past its time: the slot lapses
    assert merge_slot.take(redis, B) is None
    assert merge_slot.holder(redis, A.repo) == B.key


def test_a_loop_s_end_lets_go_and_wakes_the_gates_that_waited(redis: Redis) -> None:
    assert merge_slot.take(redis, A) is None
    assert merge_slot.take(redis, B) == A.key
    assert merge_slot.take(redis, C) == A.key
    assert gates_queued(redis) == []
    assert merge_slot.take(redis, B) == A.key  # asked again: keeps its place in line
    lifecycle.release(Store(redis), A.key)  # how every loop's end ends (lifecycle.finish)
    assert merge_slot.holder(redis, A.repo) is None
    # The first in line only: the others would only find the slot taken again.
    assert gates_queued(redis) == [f"merge gate {B.key}"]
    lifecycle.release(Store(redis), A.key)  # again: nothing held, no one woken twice
    assert len(gates_queued(redis)) == 1
    merge_slot.pass_on(redis, B.repo)  # B's gate ran and did not take it: C's turn
    assert gates_queued(redis) == [f"merge gate {B.key}", f"merge gate {C.key}"]
    merge_slot.pass_on(redis, B.repo)  # the line is empty: nobody else
    assert len(gates_queued(redis)) == 2


def test_a_woken_gate_that_takes_the_slot_wakes_nobody_and_a_loop_that_ends_leaves_the_line(
    redis: Redis,
) -> None:
    assert merge_slot.take(redis, A) is None
    assert merge_slot.take(redis, B) == A.key
    assert merge_slot.take(redis, C) == A.key
    lifecycle.release(Store(redis), C.key)  # C ended while it waited: out of the line
    lifecycle.release(Store(redis), A.key)
    assert merge_slot.take(redis, B) is None  # B, woken, takes it
    merge_slot.pass_on(redis, B.repo)  # held: nobody is woken
    assert gates_queued(redis) == [f"merge gate {B.key}"]
    lifecycle.release(Store(redis), B.key)  # C left the line: nobody to wake
    assert gates_queued(redis) == [f"merge gate {B.key}"]
    assert merge_slot.holder(redis, B.repo) is None


# The gate and the slot, the facts chosen (a red team's reproductions).


def merging_loop(github: GitHubServer, redis: Redis, rt: Runtime) -> LoopId:
    iid = sample_repo(github)
    n = open_issue(github)
    loop = LoopId(REPO, n)
    bare = github.repo(REPO).path
    gitrepo.git(bare, "branch", loop.branch, "main")
    gitrepo.seed(bare, loop.branch, {"NOTES.md": "x\n"}, "turn 1")
    pull = rt.github.installation(iid).open_pull(REPO, loop.branch, "main", "t", "b", closes=n)
    store = Store(redis)
    lifecycle.create(store, loop, installation_id=iid, actor="writer", max_turns=3)
    store.set_fields(loop.key, status=Status.MERGING, pr_number=pull.number)
    return loop


def test_a_loop_that_ends_while_its_gate_reads_github_keeps_no_slot(
    github: GitHubServer, redis: Redis, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate checks ``status == MERGING`` first, reads GitHub (seconds: the pace's
    line), and takes the slot only then. A cancel landing meanwhile has already run
    lifecycle.release (nothing held yet); the gate then takes the slot for a loop that
    has ended, and FixConflicts' requeue (None: moved on, unchecked) leaves it held.
    Nobody releases it: every other loop of the repository waits SLOT_SECONDS (20 min)."""
    loop = merging_loop(github, redis, rt)

    def facts(self: Any, *a: Any, **k: Any) -> Any:
        lifecycle.cancel(redis, loop.key, Reason.CANCELLED, "writer")  # lands mid-read
        return replace(merge_facts(), base_included=False)  # -> FixConflicts

    monkeypatch.setattr(merge_gate.Gate, "_facts", facts)
    merge_gate.Gate(rt, REPO, loop.issue)._run_once()
    record = Store(redis).get(loop.key)
    assert record is not None and record.status == Status.CANCELLED
    assert merge_slot.holder(redis, REPO) is None, "an ended loop holds the merge slot"


def test_a_holder_still_catching_up_keeps_its_slot_while_its_gate_waits_for_checks(
    github: GitHubServer, redis: Redis, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder took the slot sending its loop back to merge main in (FixConflicts);
    the catch-up (a turn, verify, a review) used most of SLOT_SECONDS; now its gate waits
    for the new head's checks (merge.wait_checks_minutes defaults to 60, > 20 min). Wait
    does not keep the slot: it lapses under the holder, another loop merges, and the
    holder's catch-up is wasted (check_fixes counts it: refused after max_fix_turns)."""
    loop = merging_loop(github, redis, rt)
    chosen = {"facts": replace(merge_facts(), base_included=False)}  # -> FixConflicts
    monkeypatch.setattr(merge_gate.Gate, "_facts", lambda self, *a, **k: chosen["facts"])
    merge_gate.Gate(rt, REPO, loop.issue)._run_once()
    assert merge_slot.holder(redis, REPO) == loop.key
    # The catch-up ran (a turn, verify, the critic): 19 of the slot's 20 minutes are gone.
    Store(redis).set_fields(loop.key, status=Status.MERGING)
    redis.pexpire(f"loopbot:merge-slot:{REPO}", 60_000)
    chosen["facts"] = replace(merge_facts(), checks="pending")  # the new head's CI runs
    assert merge_gate.Gate(rt, REPO, loop.issue)._run_once().startswith("waiting")
    assert redis.pttl(f"loopbot:merge-slot:{REPO}") > 60_000, "the holder's slot lapses"


def test_a_merge_is_decided_again_on_the_base_read_under_the_slot(
    github: GitHubServer, redis: Redis, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facts said the head contains main; the slot's last holder merged right after
    they were read. Under the slot, the base is read again: the gate catches up first
    instead of squashing a combination verify never ran on."""
    loop = merging_loop(github, redis, rt)
    bare = github.repo(REPO).path

    squashed: list[str] = []

    def facts(self: Any, *a: Any, **k: Any) -> Any:
        squashed.append(gitrepo.seed(bare, "main", {"OTHER.md": "x\n"}, "another loop's"))
        return replace(merge_facts(), base_included=True)  # -> Merge, on stale facts

    monkeypatch.setattr(merge_gate.Gate, "_facts", facts)
    assert merge_gate.Gate(rt, REPO, loop.issue)._run_once() == "resolving conflicts"
    decisions = [
        e["data"]["decision"] for e in Store(redis).events(loop.key) if e["kind"] == "gate"
    ]
    assert decisions == ["FixConflicts"]
    assert gitrepo.git(bare, "rev-parse", "main").strip() == squashed[0]  # nothing squashed
    assert merge_slot.holder(redis, REPO) == loop.key  # it catches up holding the slot


def test_the_reconciler_lets_go_of_a_slot_whose_holder_ended_or_is_gone(
    github: GitHubServer, redis: Redis, rt: Runtime
) -> None:
    """An end that never let go (the record deleted, Redis unreachable at the end): the
    reconciler's pass frees the slot and the waiting gates run; an active holder keeps it."""
    from jobs import reconciler

    loop = merging_loop(github, redis, rt)
    assert merge_slot.take(redis, loop) is None
    assert merge_slot.take(redis, OTHER_REPO) is None  # its record is gone (never made)
    waiter = LoopId(REPO, loop.issue + 1)
    assert merge_slot.take(redis, waiter) == loop.key
    assert reconciler.free_merge_slots(rt) == [f"{OTHER_REPO.repo}: {OTHER_REPO.key}"]
    assert merge_slot.holder(redis, REPO) == loop.key  # merging: still its
    Store(redis).set_fields(loop.key, status=Status.FAILED)  # ended without letting go
    assert reconciler.free_merge_slots(rt) == [f"{REPO}: {loop.key}"]
    assert merge_slot.holder(redis, REPO) is None
    assert f"merge gate {waiter.key}" in gates_queued(redis)
