"""Redis fails over in the middle of a loop: real redis-server master and replica, three
real sentinels (``redis-server --sentinel``), the web app and a real ``loopbot worker``
configured with ``REDIS_SENTINELS``. The master is killed with SIGKILL while the worker
waits for turn 2's model answer; the sentinels promote the replica; the web and the worker
(its work horse, control lane, scheduler and reconciler) carry on without a restart; the
loop merges with one pull request, nothing is left queued, started or leased, and a
webhook delivered after the failover starts a second loop that merges too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from redis import Redis
from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from bot.core.ids import LoopId
from bot.core.record import TERMINAL, Status
from bot.core.settings import Settings
from bot.io.queues import ALL_QUEUES
from bot.io.redis import SentinelRedis, connect
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import SentinelSet
from bot.web.app import create_app
from tests.conftest import Web, make_env, serve_web, wait_for
from tests.helpers import CALC, TEST_CALC, reply_between_turns

PASSWORD = "fail/over:P@ss"
SENTINEL_PASSWORD = "watch&ers"
YML = "verify: python3 -m unittest -q\nmax_turns: 3\ntriage:\n  enabled: false\n"
FIRST, SECOND = "acme/widgets", "acme/gadgets"
LEASE_TTL = 12.0


@pytest.fixture
def sentinels(request: pytest.FixtureRequest) -> Iterator[SentinelSet]:
    options = getattr(request, "param", {})
    s = SentinelSet(password=PASSWORD, sentinel_password=SENTINEL_PASSWORD, **options).start()
    yield s
    s.stop()


@pytest.fixture
def env(
    sentinels: SentinelSet, github: GitHubServer, model: AnthropicServer, tmp_path: Path
) -> dict[str, str]:
    """As an operator would write it: the sentinels and the master's name in their own
    variables, REDIS_URL for the passwords (its host is not used)."""
    url = (
        f"redis://:{quote(PASSWORD, safe='')}@not-used:6379/0"
        f"?sentinel_password={quote(SENTINEL_PASSWORD, safe='')}"
    )
    return make_env(url, github, model.url, tmp_path / "data") | {
        "REDIS_SENTINELS": sentinels.hosts,
        "REDIS_SENTINEL_MASTER": sentinels.master_name,
        # The lease renewed every 4 s and the reconciler every 2 s: both run into the
        # failover (a few seconds), and the lease must survive it.
        "LOOPBOT_LEASE_TTL": str(int(LEASE_TTL)),
        "LOOPBOT_RECONCILE_INTERVAL": "2",
    }


@pytest.fixture
def redis(settings: Settings) -> Iterator[Redis]:
    """The test's own client, through the sentinels too (it follows the failover)."""
    conn = connect(settings.redis_url)
    assert isinstance(conn, SentinelRedis)
    yield conn
    conn.close()


@pytest.fixture
def web(settings: Settings, github: GitHubServer) -> Iterator[Web]:
    """The Flask app on a real port, connecting by itself as ``loopbot web`` does."""
    with serve_web(create_app(settings), github) as w:
        yield w


class Model:
    """The scripted model: in the first repository a wrong fix first (verify fails), then,
    when turn 2's first request arrives, the master is killed and the answer waits for
    the failover; in the second repository the fix at once. The critic approves."""

    def __init__(self, sentinels: SentinelSet) -> None:
        self.sentinels = sentinels
        self.turns: dict[str, int] = {}
        self.failover: tuple[int, int, float] | None = None  # old, new port; seconds

    def respond(self, body: dict[str, Any]) -> m.Item:
        if (answer := reply_between_turns(body)) is not None:
            return answer
        first = str(body["messages"][0]["content"])
        repo = SECOND if "gadgets" in first else FIRST
        turn = self.turns[repo] = self.turns.get(repo, 0) + 1
        if repo == SECOND:
            return m.replace("calc.py", "a - b", "a + b")
        if turn == 1:
            return m.replace("calc.py", "a - b", "a * b")  # add(2, 3) == 6: verify fails
        if turn == 2 and self.failover is None:
            self.kill_master()
        return m.replace("calc.py", "a * b", "a + b")

    def kill_master(self) -> None:
        old = self.sentinels.master_port()
        assert old is not None
        # What loopbot wrote so far is on the replica (a failover can lose writes that
        # are not: tests/io/test_redis_sentinel.py shows what and when).
        self.sentinels.wait_in_sync(old)
        started = time.monotonic()
        self.sentinels.kill_master()
        new = self.sentinels.wait_failover(old)
        self.failover = (old, new, time.monotonic() - started)


def idle(redis: Redis) -> bool:
    """No job of loopbot's queues is queued, started or scheduled."""
    return not any(
        redis.llen(f"rq:queue:{q}")
        or StartedJobRegistry(q, connection=redis).count
        or ScheduledJobRegistry(q, connection=redis).count
        for q in ALL_QUEUES
    )


def add_repo(github: GitHubServer, repo: str, iid: int, title: str) -> int:
    files = {"calc.py": CALC, "test_calc.py": TEST_CALC, ".github/loop.yml": YML}
    github.add_repo(repo, files, installation_id=iid, collaborators={"writer": "write"})
    with github.as_user("writer") as u:
        r = u.post(f"/repos/{repo}/issues", json={"title": title, "body": "Fix calc.add."})
        return int(r.json()["number"])


def label(github: GitHubServer, repo: str, n: int) -> None:
    with github.as_user("writer") as u:
        u.post(f"/repos/{repo}/issues/{n}/labels", json={"labels": ["loop:ready"]})


def test_the_master_dies_mid_loop_and_everything_carries_on(
    sentinels: SentinelSet,
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    workers: Any,
) -> None:
    script = Model(sentinels)
    model.responder = script.respond
    iid = github.add_installation("acme")
    first = add_repo(github, FIRST, iid, "widgets: add() subtracts")
    second = add_repo(github, SECOND, iid, "gadgets: add() subtracts")
    worker = workers("a")
    label(github, FIRST, first)
    store = Store(redis)
    key = LoopId(FIRST, first).key

    def ended(k: str) -> bool:
        r = store.get(k)
        return r is not None and r.status in TERMINAL

    wait_for(lambda: ended(key), 60, "the first loop to end")
    assert script.failover is not None, "the master was never killed"
    old, new, took = script.failover
    assert new != old and sentinels.master_port() == new
    record = store.get(key)
    assert record is not None
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), [
        (e["kind"], e["data"]) for e in store.events(key)
    ]
    assert record.turn == 2
    assert len(github.repo(FIRST).pulls) == 1
    assert github.file_at(FIRST, "main", "calc.py") == CALC.replace("a - b", "a + b")

    # The web answers and takes a webhook after the failover: a second loop merges.
    assert httpx.get(web.url + "/healthz").status_code == 200
    label(github, SECOND, second)
    key2 = LoopId(SECOND, second).key
    wait_for(lambda: ended(key2), 45, "the second loop to end")
    record2 = store.get(key2)
    assert record2 is not None and (record2.status, record2.reason) == (Status.COMPLETED, "merged")
    assert len(github.repo(SECOND).pulls) == 1

    # Nothing stuck: no lease, no job queued, running, scheduled or failed.
    wait_for(lambda: idle(redis), 20, "the queues to be idle")
    for q in ALL_QUEUES:
        assert FailedJobRegistry(q, connection=redis).count == 0, q
    assert store.lease_holder(key) is None and store.lease_holder(key2) is None
    # The same worker process all along (its control lane and scheduler included).
    assert worker.proc is not None and worker.proc.poll() is None, worker.output()[-3000:]
    output = worker.output()
    assert "quitting" not in output and "lease.lost" not in output, output[-3000:]
    # All of it happened on the new master; the old one is gone.
    with sentinels.client(new) as direct:
        assert direct.execute_command("ROLE")[0] == b"master"
        assert direct.exists(f"loopbot:loop:{key}")
    assert sentinels.nodes[old].proc is None
    assert took < 20, took
    # And it still stops promptly when told (a deploy's SIGTERM): its processes wait in
    # BLMOVE on the new master, and a warm shutdown there leaves no reply pending.
    stopping = time.monotonic()
    assert worker.terminate(timeout=30) == 0, worker.output()[-3000:]
    assert time.monotonic() - stopping < 15


class LossyModel(Model):
    """As ``Model``, but when turn 2's first request arrives the replica stops receiving
    the master's writes (its link cut, as a partition would cut it); the master goes on
    acknowledging them, the worker's lease renewals among them, for longer than the
    lease lasts; then the master dies and the stale replica is promoted. What it lacks
    is what a failover loses: here, every lease renewal since the cut."""

    def __init__(self, sentinels: SentinelSet) -> None:
        super().__init__(sentinels)
        self.lost_lease = False

    def kill_master(self) -> None:
        old = self.sentinels.master_port()
        assert old is not None
        self.sentinels.wait_in_sync(old)
        replica = next(p for p in self.sentinels.nodes if p != old)
        with self.sentinels.client(replica) as r:
            r.config_set("masterauth", "not-the-password")  # it cannot sync again
        with self.sentinels.client(old) as master:
            master.execute_command("CLIENT", "KILL", "TYPE", "replica")
        time.sleep(LEASE_TTL + 2)  # the worker renews its lease on the old master alone
        with self.sentinels.client(old) as master:
            key = LoopId(FIRST, 1).key
            self.lost_lease = master.exists(f"loopbot:lease:{key}") == 1
        started = time.monotonic()
        self.sentinels.kill_master()
        with self.sentinels.client(replica) as r:
            r.config_set("masterauth", PASSWORD)
        new = self.sentinels.wait_failover(old)
        with self.sentinels.client(new) as promoted:
            # The promoted replica never saw the renewals: the lease lapsed there.
            self.lost_lease &= promoted.exists(f"loopbot:lease:{key}") == 0
        self.failover = (old, new, time.monotonic() - started)


@pytest.mark.parametrize("sentinels", [{"down_after_ms": 2000}], indirect=True)
def test_a_failover_that_loses_the_last_writes_is_repaired(
    sentinels: SentinelSet,
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    workers: Any,
) -> None:
    """The worker finds its lease gone on the new master and stops writing (its turn 2
    is lost); the reconciler sees a running loop nobody leases and resumes it; turn 2 is
    done again from the pushed branch, and the loop merges with one pull request."""
    script = LossyModel(sentinels)
    model.responder = script.respond
    iid = github.add_installation("acme")
    first = add_repo(github, FIRST, iid, "widgets: add() subtracts")
    assert first == 1  # the issue LossyModel looks at
    worker = workers("a")
    label(github, FIRST, first)
    store = Store(redis)
    key = LoopId(FIRST, first).key

    def ended() -> bool:
        r = store.get(key)
        return r is not None and r.status in TERMINAL

    wait_for(ended, 90, "the loop to end")
    assert script.failover is not None and script.lost_lease
    record = store.get(key)
    assert record is not None
    kinds = [e["kind"] for e in store.events(key)]
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), kinds
    assert len(github.repo(FIRST).pulls) == 1
    assert github.file_at(FIRST, "main", "calc.py") == CALC.replace("a - b", "a + b")
    # Repaired by the reconciler, as a loop whose worker was lost: resumed once.
    assert record.auto_resumes == 1, kinds
    assert "lease.lost" in worker.output()
    assert script.turns[FIRST] == 3  # turn 2 asked again after the resume
    assert worker.proc is not None and worker.proc.poll() is None
    # Nothing stuck: no lease, no job queued, running, scheduled or failed.
    wait_for(lambda: idle(redis), 20, "the queues to be idle")
    for q in ALL_QUEUES:
        assert FailedJobRegistry(q, connection=redis).count == 0, q
    assert store.lease_holder(key) is None
