"""A worker that lost its lease stops writing; public comments carry no internal error text.

Real Redis, real RQ-less job entry (``run_loop``), real git and sandbox, local GitHub and
model servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from bot.core.record import Status
from bot.io.github import failures
from bot.io.store import LeaseLost, Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer
from jobs import status_comment
from tests.conftest import Web
from tests.helpers import REPO, ROOT, started_loop

KEY = f"{REPO}#1"
YML = """\
verify: python3 -m unittest -q
max_turns: 3
critic:
  enabled: true
"""
FIX = m.replace("calc.py", "return a - b", "return a + b")
FAKE_TOKEN = "ghs_FAKEtoken0123456789abcdefABCDEF0123"


def _unreachable() -> Redis:
    """A client for a port where nothing listens: every call raises ConnectionError."""
    return Redis(
        host="127.0.0.1",
        port=1,
        socket_connect_timeout=0.2,
        socket_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )


# -- the lease on its own ------------------------------------------------------------------------


def test_a_lease_whose_renewals_fail_is_lost_after_the_ttl(redis: Redis) -> None:
    from jobs.loop.job import Lease

    lease = Lease(Store(redis), KEY, ttl=1.5)
    assert lease.acquire()
    lease.check()  # held: no exception
    lease.store = Store(_unreachable())  # Redis goes away (a partition, say)
    time.sleep(0.6)
    assert not lease.is_lost()  # within the TTL: still ours (Redis' TTL has not run out)
    lease.check()  # Redis cannot answer; the clock says it is still ours
    time.sleep(1.1)
    assert lease.is_lost()
    with pytest.raises(LeaseLost):
        lease.check()
    # The renewal thread notices too (within a renewal period), not only the callers.
    assert lease.lost.wait(1.0)
    lease.release()


def test_a_lease_whose_job_stops_making_progress_is_given_back(redis: Redis) -> None:
    """Renewals alone do not keep a lease: a job whose own thread is stuck (a wait with no
    deadline) gives it back after ``max_silence``, and the reconciler can resume the loop
    (issue 37, item 9). Before, its renewal thread kept the lease for ever."""
    from jobs.loop.job import Lease

    store = Store(redis)
    lease = Lease(store, KEY, ttl=1.5, max_silence=5.0)
    assert lease.acquire()
    started = time.monotonic()
    while time.monotonic() - started < 7:  # a job writing often: held past max_silence
        lease.check()
        time.sleep(0.2)
    assert store.lease_holder(KEY) == lease.owner
    last = time.monotonic()
    lease.check()  # then its thread is stuck: nothing more
    assert lease.lost.wait(60), "the lease is kept by a job that makes no progress"
    assert time.monotonic() - last >= 5.0  # never before max_silence
    assert store.lease_holder(KEY) is None  # given back at once, not a TTL later
    with pytest.raises(LeaseLost):
        lease.check()
    lease.release()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own, to stop with SIGSTOP (a stalled disk, a paused VM)
    without stopping anything another test uses."""
    server = RedisServer().start()
    yield server
    server.stop()


@contextlib.contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """Redis takes commands but answers none until the block ends."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def _lease_on(server: RedisServer, ttl: float) -> Any:
    from jobs.loop.job import Lease

    redis = Redis.from_url(server.url, socket_timeout=30)  # a stopped Redis is waited for
    redis.ping()
    return Lease(Store(redis), KEY, ttl=ttl)


def test_a_lease_whose_redis_stops_answering_says_a_renewal_waits_for_redis(
    own_redis: RedisServer,
) -> None:
    """Redis stops answering: the renewal waits in its call; the lease is lost by the
    clock and says a renewal is unanswered."""
    lease = _lease_on(own_redis, ttl=1.5)
    assert lease.acquire()
    with stopped(own_redis):
        assert lease.lost.wait(0.1) is False
        time.sleep(1.8)
        assert lease.is_lost()
        assert re.fullmatch(
            r"no successful renewal for 1\.5s \(a renewal sent \d+s ago is still "
            r"unanswered: most likely Redis\)",
            lease._why,
        ), lease._why
    lease.release()


def test_a_redis_stalled_past_the_ttl_is_not_taken_for_another_worker(
    own_redis: RedisServer,
) -> None:
    """Redis stops answering for longer than the TTL while a renewal waits on it, and no
    one else asks: when it answers, the key has expired. The lease is lost by the clock,
    saying the renewal took long, not that another worker holds it (none does)."""
    lease = _lease_on(own_redis, ttl=1.5)
    assert lease.acquire()
    with stopped(own_redis):
        time.sleep(2.5)
    assert lease.lost.wait(2)
    assert re.fullmatch(
        r"no successful renewal for 1\.5s \(the last renewal took \d+s: most likely Redis\)",
        lease._why,
    ), lease._why
    assert Store(Redis.from_url(own_redis.url)).lease_holder(KEY) is None
    lease.release()


def test_a_slow_take_does_not_lose_the_lease_or_blame_the_process(
    own_redis: RedisServer,
) -> None:
    """Redis takes 2 s to answer the take (ttl 3): its TTL began when it answered, so the
    lease is renewed and held, not lost at the first renewal for a late thread."""
    lease = _lease_on(own_redis, ttl=3)
    with stopped(own_redis):
        taking = threading.Thread(target=lease.acquire)
        taking.start()
        time.sleep(2.0)
    taking.join(10)
    assert lease._thread is not None  # taken
    assert not lease.lost.wait(3.5), lease._why  # three renewals' worth
    lease.check()
    lease.release()


class _SlowRenewals(Store):
    """Renewals that take 0.3 s to reach Redis (a slow network)."""

    def renew_lease(self, key: Any, owner: str, ttl: float) -> bool:
        time.sleep(0.3)
        return bool(super().renew_lease(key, owner, ttl))


def test_a_release_during_a_renewal_is_not_a_lost_lease(redis: Redis) -> None:
    """A clean release while a renewal is on its way: Redis refuses the renewal (the key is
    gone by our own hand); nothing says the lease was lost."""
    from jobs.loop.job import Lease

    lease = Lease(_SlowRenewals(redis), KEY, ttl=3)
    assert lease.acquire()
    time.sleep(1.1)  # the first renewal, due at 1 s, is on its way
    assert lease._in_flight is not None
    lease.release()
    time.sleep(0.5)
    assert not lease.lost.is_set(), lease._why


STALLED = """
import os, signal, sys, time
from redis import Redis
from bot.io.store import Store
from jobs.loop.job import Lease

lease = Lease(Store(Redis.from_url(sys.argv[1])), "acme/widgets#1", ttl=1.5)
assert lease.acquire()
seen = []
signal.signal(signal.SIGCONT, lambda *_: seen.append(lease.is_lost() and lease._why))
print("held", flush=True)
while not seen:
    pass  # busy: the main thread holds the interpreter when the process is stopped
open(sys.argv[2], "w").write(seen[0])  # not stdout: the lease's log line goes there
"""


def test_a_lease_of_a_stalled_process_says_the_process_stalled(
    redis_server: Any, tmp_path: Path
) -> None:
    """The worker itself stops running (SIGSTOP, as a paused VM or a starved machine):
    no renewal is even tried; the lease, lost by the clock, says so."""
    child = subprocess.Popen(
        [sys.executable, "-c", STALLED, redis_server.url, str(tmp_path / "said")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "held"
        child.send_signal(signal.SIGSTOP)
        time.sleep(3)  # past the TTL
        child.send_signal(signal.SIGCONT)
        child.communicate(timeout=10)
        assert child.returncode == 0
        said = (tmp_path / "said").read_text()
    finally:
        child.kill()
    assert re.fullmatch(
        r"no successful renewal for 1\.5s \(this process stalled: its renewals ran \d+s late\)",
        said,
    ), said


def test_a_lease_taken_over_is_lost_at_the_next_check(redis: Redis) -> None:
    from jobs.loop.job import Lease

    lease = Lease(Store(redis), KEY, ttl=30)
    assert lease.acquire()
    Store(redis).force_release_lease(KEY)
    Store(redis).take_lease(KEY, "other-worker", 30)
    with pytest.raises(LeaseLost):  # at once, not at the next renewal
        lease.check()
    lease.release()
    assert Store(redis).lease_holder(KEY) == "other-worker"  # release left it alone


def test_a_fenced_record_write_needs_the_lease_in_redis(redis: Redis) -> None:
    from bot.core.record import LoopRecord
    from bot.io.store import FencedStore

    store = Store(redis)
    store.put(LoopRecord(key=KEY, repo=REPO, issue=1, installation_id=1, branch="loop/issue-1"))
    store.take_lease(KEY, "me", 30)
    fenced = FencedStore(redis, KEY, "me", lambda: None)  # the local guard lets all through
    fenced.set_fields(KEY, phase="coding")
    store.force_release_lease(KEY)
    store.take_lease(KEY, "other-worker", 30)
    with pytest.raises(LeaseLost):
        fenced.set_fields(KEY, phase="verifying")
    record = store.get(KEY)
    assert record is not None and record.phase == "coding"


# -- a loop whose lease lapses mid-turn ----------------------------------------------------------


def _start(github: GitHubServer, redis: Redis, env: dict[str, str], **extra: str) -> int:
    return started_loop(github, redis, env, YML, **{"LOOPBOT_LEASE_TTL": "2", **extra})


def _snapshot(redis: Redis, github: GitHubServer) -> dict[str, Any]:
    repo = github.repo(REPO)
    return {
        "record": redis.get(f"loopbot:loop:{KEY}"),
        "events": redis.xlen(f"loopbot:events:{KEY}"),
        "conversation": redis.get(f"loopbot:conv:{KEY}"),
        "pulls": len(repo.pulls),
        "comments": json.dumps(
            sorted((c["id"], c["body"]) for c in repo.comments.values()), default=str
        ),
        "check_runs": len(repo.check_runs),
        "branch": github.file_at(REPO, "loop/issue-1", "calc.py"),
        "queued": sorted(
            (k.decode(), redis.llen(k)) for k in redis.scan_iter("rq:queue:*") if redis.llen(k)
        ),
    }


@pytest.mark.parametrize("how", ["renewals_fail", "taken_over"])
def test_a_loop_that_lost_its_lease_mid_turn_writes_nothing_more(
    how: str,
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs.loop.job import LEASE_LOST, run_loop

    n = _start(github, redis, env)
    before: dict[str, Any] = {}
    partitioned = threading.Event()
    real_renew, real_holder = Store.renew_lease, Store.lease_holder

    def renew(self: Store, key: str, owner: str, ttl: float) -> bool:
        if partitioned.is_set():
            raise RedisConnectionError("partitioned")
        return real_renew(self, key, owner, ttl)

    def holder(self: Store, key: str) -> str | None:
        if partitioned.is_set():
            raise RedisConnectionError("partitioned")
        return real_holder(self, key)

    monkeypatch.setattr(Store, "renew_lease", renew)
    monkeypatch.setattr(Store, "lease_holder", holder)
    replies = iter([FIX])

    def respond(body: dict[str, Any]) -> m.Item:
        reply = next(replies, None)
        if reply is not None:
            return reply
        # The fix is made in the worktree; the turn's last answer comes late. The status
        # edits the loop asked for while it held the lease have gone out first (they are
        # sent by this process's publisher thread, jobs/status_comment.py).
        assert status_comment._PUBLISHER is not None and status_comment._PUBLISHER.flush(10)
        if how == "renewals_fail":
            partitioned.set()  # this worker can no longer reach Redis for its lease...
            time.sleep(2.6)  # ...for longer than the TTL (2s): Redis lets the lease lapse
            Store(redis).take_lease(KEY, "other-worker", 30)
        else:
            Store(redis).force_release_lease(KEY)
            Store(redis).take_lease(KEY, "other-worker", 30)  # and no sleep: the fence acts
        before.update(_snapshot(redis, github))
        return m.text("Fixed add to use +.")

    model.responder = respond
    assert run_loop(REPO, n) == LEASE_LOST
    partitioned.clear()
    after = _snapshot(redis, github)
    assert after == before  # no record, event, push, PR, comment, check run or job
    assert before["pulls"] == 0 and "a + b" not in (before["branch"] or "")
    assert not any("critic" in q for q, _ in after["queued"])
    record = Store(redis).get(KEY)
    assert record is not None and record.status == Status.RUNNING and record.reason == ""
    assert real_holder(Store(redis), KEY) == "other-worker"


# -- public comments carry no internal error text ------------------------------------------------


def test_an_error_posts_a_short_reason_and_an_id_not_paths_or_tokens(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    from jobs.loop.job import run_loop

    n = _start(github, redis, env)
    data_dir = env["LOOPBOT_DATA_DIR"]
    Store(redis).set_fields(KEY, error_count=2)  # this failure is the last one allowed
    leak = f"cannot open {data_dir}/worktrees/x/.git/config with token {FAKE_TOKEN}"
    model.play(m.Fail(400, message=leak, error_type="invalid_request_error"))
    result = run_loop(REPO, n)
    assert result.startswith("failed:"), result

    record = Store(redis).get(KEY)
    assert record is not None and record.status == Status.FAILED
    found = re.search(r"error id ([0-9a-f]{8})", record.detail)
    assert found, record.detail
    error_id = found.group(1)
    # The operator finds the whole error under that id in the loop's events.
    errors = [e for e in Store(redis).events(KEY) if e["kind"] == "error"]
    assert errors[-1]["data"]["error_id"] == error_id
    assert data_dir in errors[-1]["data"]["error"]

    repo = github.repo(REPO)
    public = [c["body"] for c in repo.comments.values()]
    public += [json.dumps(r, default=str) for r in repo.check_runs.values()]
    assert any(error_id in body for body in public), public
    for body in public:
        assert data_dir not in body and FAKE_TOKEN not in body and "worktrees/" not in body
        assert str(tmp_path) not in body


def test_a_merge_gate_that_gives_up_posts_a_reason_and_an_id(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobs.review import gate
    from tests.e2e.review import test_review_merge as rm

    monkeypatch.setattr(failures, "_backoff", lambda attempt: 0.0)
    monkeypatch.setattr(gate, "ERROR_BACKOFF", (0.0,))
    github.inject("PUT", r"/pulls/\d+/merge$", 502, times=1000)
    model.play(rm.FIX, m.text("Fixed."), rm.report())
    rm.run(github, drain)
    r = rm.record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "gate_error"), r
    ids = [e["data"]["error_id"] for e in Store(redis).events(KEY) if e["kind"] == "gate_error"]
    assert ids and all(re.fullmatch(r"[0-9a-f]{8}", i) for i in ids)
    pr_comments = [
        c["body"] for c in github.repo(REPO).comments.values() if c["_issue"] == r.pr_number
    ]
    gave_up = [b for b in pr_comments if "stopped trying to merge" in b]
    assert gave_up and f"error id {ids[-1]}" in gave_up[0], gave_up
    assert "a GitHub API call failed (HTTP 502)" in gave_up[0]
    for body in [c["body"] for c in github.repo(REPO).comments.values()]:
        assert "/merge" not in body and "GitHubError" not in body and "Unavailable:" not in body
