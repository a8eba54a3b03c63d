"""Redis Sentinel: the ``redis+sentinel://`` URL and ``REDIS_SENTINELS``, read, checked and
masked; and a client of a real Sentinel set (redis-server master and replica, three
``redis-server --sentinel`` processes) that rides out a failover without being rebuilt:
plain commands, RQ's scheduler (which rebuilds its connection from the client's parts),
a forking RQ worker with its pubsub, and the operator's CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from redis import ConnectionPool
from redis.sentinel import SentinelConnectionPool
from rq import Queue
from rq.command import PUBSUB_CHANNEL_TEMPLATE, send_shutdown_command
from rq.connections import parse_connection
from rq.job import JobStatus
from rq.registry import StartedJobRegistry
from rq.scheduler import RQScheduler

from bot.core.redis_url import (
    SentinelSpec,
    check_url,
    effective_url,
    mask_url,
    parse_sentinel_url,
    scrub,
    sentinel_url,
)
from bot.core.settings import SettingsError, load_settings
from bot.core.text.redact import settings_secrets, url_secrets
from bot.io.redis import RedisProblem, SentinelRedis, check, connect
from bot.standins.redis_server import SentinelSet
from tests.helpers import ROOT
from tests.io.test_operator import cli

PASSWORD = "m4ster-Pa55/w:rd@x"  # needs percent-encoding in a URL, on purpose
SENTINEL_PASSWORD = "s3ntinel&p@ss#1"
BASE = {
    "GITHUB_APP_ID": "12",
    "GITHUB_PRIVATE_KEY": "-----BEGIN KEY-----\nx\n-----END KEY-----\n",
    "GITHUB_WEBHOOK_SECRET": "s",
}


# -- the URL ------------------------------------------------------------------------------


def test_a_sentinel_url_is_read_whole() -> None:
    spec = parse_sentinel_url(
        "redis+sentinel://app:p%40ss@s1.example:26380,10.0.0.2,[::1]:5000/my-master/3"
        "?sentinel_password=sp%26w&sentinel_username=watch"
    )
    assert spec == SentinelSpec(
        sentinels=(("s1.example", 26380), ("10.0.0.2", 26379), ("::1", 5000)),
        master="my-master",
        db=3,
        username="app",
        password="p@ss",
        sentinel_username="watch",
        sentinel_password="sp&w",
    )
    bare = parse_sentinel_url("redis+sentinel://h:1/m")
    assert (bare.db, bare.password, bare.username, bare.sentinel_password) == (0, None, None, None)
    assert parse_sentinel_url("redis+sentinel://:pw@h:1/m/").password == "pw"
    # Written back, it reads the same.
    assert parse_sentinel_url(sentinel_url(spec)) == spec
    # A password written without percent-encoding is still the password.
    raw = parse_sentinel_url(f"redis+sentinel://:{PASSWORD}@h:1/m")
    assert raw.password == PASSWORD and raw.sentinels == (("h", 1),)


@pytest.mark.parametrize(
    "url, why",
    [
        ("redis+sentinel://:hunter2@/mymaster", "no sentinel host"),
        ("redis+sentinel://:hunter2@h:26379", "no master name"),
        ("redis+sentinel://:hunter2@h:26379/", "no master name"),
        ("redis+sentinel://:hunter2@h:port/mymaster", "bad port"),
        ("redis+sentinel://:hunter2@h:0/mymaster", "bad port"),
        ("redis+sentinel://:hunter2@h:70000/mymaster", "bad port"),
        ("redis+sentinel://:hunter2@h:1,,h:2/mymaster", "empty sentinel address"),
        ("redis+sentinel://:hunter2@:1/mymaster", "no host"),
        ("redis+sentinel://:hunter2@h:1/mymaster/x", "db 'x' is not a number"),
        ("redis+sentinel://:hunter2@h:1/mymaster/0/1", "too many path parts"),
        ("redis+sentinel://:hunter2@h:1/mymaster?ssl=true", "unknown parameter 'ssl'"),
        ("redis+sentinel://:hunter2@h:1/my%20master", "not a Sentinel master name"),
        ("redis://:hunter2@h:1/0?sentinel_password=x", "for Sentinel only"),
    ],
)
def test_a_bad_sentinel_url_is_named_without_its_password(url: str, why: str) -> None:
    with pytest.raises(ValueError) as exc:
        check_url(url)
    assert why in str(exc.value)
    assert "hunter2" not in str(exc.value)
    with pytest.raises(SettingsError) as settings_exc:
        load_settings({**BASE, "REDIS_URL": url})
    assert f"REDIS_URL: {why}" in str(settings_exc.value) or why in str(settings_exc.value)
    assert "hunter2" not in str(settings_exc.value)


def test_sentinel_secrets_are_masked_and_scrubbed() -> None:
    url = (
        f"redis+sentinel://app:{PASSWORD}@h1:26379,h2:26379/mymaster/0"
        f"?sentinel_password={SENTINEL_PASSWORD.replace('#', '%23')}"
    )
    # Written as an operator might, unescaped: the "&" splits the sentinel password in two
    # (redis-py would read it so too); both halves are masked all the same.
    shown = mask_url(url)
    assert shown == (
        "redis+sentinel://app:***@h1:26379,h2:26379/mymaster/0?sentinel_password=***&***"
    )
    with pytest.raises(ValueError) as exc:
        check_url(url)
    assert "percent-encode" in str(exc.value) and "p@ss" not in str(exc.value)
    encoded = SetUrl(PASSWORD, SENTINEL_PASSWORD).url
    assert mask_url(encoded) == (
        "redis+sentinel://:***@127.0.0.1:1,127.0.0.1:2/mymaster/0?sentinel_password=***"
    )
    for u in (url, encoded):
        # An error message may show the URL and a password as written or decoded.
        cleaned = scrub(f"failed: {u} {PASSWORD} {SENTINEL_PASSWORD}", u)
        assert "Pa55" not in cleaned and "s3ntinel" not in cleaned, cleaned
        # A log may show them percent-encoded too: the redactor looks for every form.
        forms = url_secrets(u)
        assert {SetUrl.quoted(PASSWORD), PASSWORD} <= set(forms), forms
    # And what the worker redacts from a loop's log (bot/core/text/redact.py).
    settings = load_settings({**BASE, "REDIS_URL": encoded})
    secrets = settings_secrets(settings)
    assert PASSWORD in secrets and SENTINEL_PASSWORD in secrets
    assert "Pa55" not in repr(settings) and "s3ntinel" not in repr(settings)


class SetUrl:
    """The URL ``SentinelSet`` builds, for two made-up sentinels."""

    def __init__(self, password: str, sentinel_password: str) -> None:
        self.url = (
            f"redis+sentinel://:{self.quoted(password)}@127.0.0.1:1,127.0.0.1:2/mymaster/0"
            f"?sentinel_password={self.quoted(sentinel_password)}"
        )

    @staticmethod
    def quoted(text: str) -> str:
        from urllib.parse import quote

        return quote(text, safe="")


# -- REDIS_SENTINELS ------------------------------------------------------------------------


def test_redis_sentinels_make_the_url_with_redis_url_s_password_and_db() -> None:
    env = {
        **BASE,
        "REDIS_SENTINELS": "s1:26379, s2:26380,s3",
        "REDIS_URL": f"redis://:{SetUrl.quoted(PASSWORD)}@ignored-host:6379/2",
    }
    settings = load_settings(env)
    assert parse_sentinel_url(settings.redis_url) == SentinelSpec(
        sentinels=(("s1", 26379), ("s2", 26380), ("s3", 26379)),
        master="mymaster",  # the default
        db=2,
        password=PASSWORD,
    )
    named = load_settings({**env, "REDIS_SENTINEL_MASTER": "cache-a"})
    assert parse_sentinel_url(named.redis_url).master == "cache-a"
    # Without REDIS_URL: no password, db 0. The sentinels' own password as a parameter.
    alone = effective_url({"REDIS_SENTINELS": "s1:1"})
    assert alone == "redis+sentinel://s1:1/mymaster/0"
    with_sentinel_auth = effective_url(
        {"REDIS_SENTINELS": "s1:1", "REDIS_URL": "redis://u:p@x/1?sentinel_password=sp"}
    )
    assert parse_sentinel_url(with_sentinel_auth) == SentinelSpec(
        (("s1", 1),), "mymaster", 1, "u", "p", None, "sp"
    )
    # A redis+sentinel:// REDIS_URL alone is used as it is.
    url = "redis+sentinel://:pw@a:1,b:2/m/1"
    assert load_settings({**BASE, "REDIS_URL": url}).redis_url == url
    assert load_settings({**BASE, "REDIS_URL": url, "REDIS_SENTINEL_MASTER": "m"}).redis_url == url


@pytest.mark.parametrize(
    "env, why",
    [
        (
            {"REDIS_SENTINELS": "s1:1", "REDIS_URL": "redis+sentinel://:hunter2@s2:2/m"},
            "name the sentinels in one of them only",
        ),
        ({"REDIS_SENTINEL_MASTER": "m"}, "REDIS_SENTINEL_MASTER is set but REDIS_SENTINELS is not"),
        (
            {"REDIS_SENTINEL_MASTER": "a", "REDIS_URL": "redis+sentinel://:hunter2@s:1/b"},
            "REDIS_SENTINEL_MASTER ('a') and the master name in REDIS_URL ('b') differ",
        ),
        (
            {"REDIS_SENTINELS": "s1:1", "REDIS_URL": "rediss://:hunter2@h:6380/0"},
            "REDIS_URL may only be redis://",
        ),
        (
            {"REDIS_SENTINELS": "s1:1", "REDIS_URL": "unix:///run/redis.sock"},
            "REDIS_URL may only be redis://",
        ),
        (
            {"REDIS_SENTINELS": "s1:1", "REDIS_URL": "redis://:hunter2@h/0?socket_timeout=3"},
            "socket_timeout are not used with REDIS_SENTINELS",
        ),
        ({"REDIS_SENTINELS": "s1:notaport"}, "REDIS_SENTINELS: sentinel address 's1:notaport'"),
        ({"REDIS_SENTINELS": "s1:1,"}, "REDIS_SENTINELS: an empty sentinel address"),
        ({"REDIS_SENTINELS": "s1:1", "REDIS_SENTINEL_MASTER": "a b"}, "not a Sentinel master"),
    ],
)
def test_contradicting_redis_settings_are_one_clear_error(env: dict[str, str], why: str) -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings({**BASE, **env})
    assert why in str(exc.value)
    assert "hunter2" not in str(exc.value)
    assert len(exc.value.problems) == 1, exc.value.problems


# -- a real Sentinel set --------------------------------------------------------------------


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    s = SentinelSet(password=PASSWORD, sentinel_password=SENTINEL_PASSWORD).start()
    yield s
    s.stop()


def failover(s: SentinelSet) -> tuple[int, int]:
    """SIGKILL the master once the replica has all it wrote; the old and new ports."""
    old = s.master_port()
    assert old is not None
    s.wait_in_sync(old)
    s.kill_master()
    return old, s.wait_failover(old)


def test_a_client_rides_out_a_failover(sentinels: SentinelSet) -> None:
    check(sentinels.url)
    client = connect(sentinels.url)
    assert isinstance(client, SentinelRedis)
    client.set("before", "1")
    old = sentinels.master_port()
    assert old is not None
    sentinels.wait_in_sync(old)
    sentinels.kill_master()
    started = time.monotonic()
    # The same object, not rebuilt: its next write waits for the promotion and lands on
    # the new master (well inside the ~30 s of retries).
    assert client.set("after", "2")
    took = time.monotonic() - started
    new = sentinels.master_port()
    assert new is not None and new != old
    assert took < 20, took
    with sentinels.client(new) as direct:
        assert direct.get("before") == b"1" and direct.get("after") == b"2"
        assert direct.execute_command("ROLE")[0] == b"master"
    # The killed master comes back as a replica of the new one; the client does not care.
    sentinels.restart_node(old)
    deadline = time.monotonic() + 30
    while sentinels.role(old) != "slave" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sentinels.role(old) == "slave"
    assert client.incr("n") == 1
    with sentinels.client(old) as rejoined:  # it took the new master's data
        wait(lambda: rejoined.get("n") == b"1", 10, "the old master to catch up")
        assert rejoined.get("after") == b"2"


def test_a_blocked_dequeue_follows_the_failover(sentinels: SentinelSet) -> None:
    """An RQ worker waits for jobs in BLMOVE. When the master dies under it, the retried
    command must reconnect to the new master, not to the dead address it had (redis-py
    8.1's own Sentinel connection does that: it came back after 35 s, with an error)."""
    client, other = connect(sentinels.url), connect(sentinels.url)
    got: list[object] = []
    waiter = threading.Thread(
        target=lambda: got.append(client.blmove("src", "dst", 60)), daemon=True
    )
    waiter.start()
    time.sleep(0.3)
    failover(sentinels)
    other.rpush("src", "job")
    pushed = time.monotonic()
    waiter.join(60)
    assert got == [b"job"]
    assert time.monotonic() - pushed < 5


class Interrupted(Exception):
    pass


def test_a_read_cut_short_leaves_no_reply_behind(sentinels: SentinelSet) -> None:
    """A signal handler that raises inside a read (RQ's warm shutdown under BLMOVE, its job
    timeout) must drop the connection, as redis-py does for plain ones; its Sentinel
    connection kept it, pending BLMOVE and all, and put it back in the pool."""
    client, other = connect(sentinels.url), connect(sentinels.url)

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            client.blmove("src", "dst", 30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    started = time.monotonic()
    assert client.set("k", "v") is True  # not the BLMOVE's reply, and no 30 s wait
    assert client.get("k") == b"v"
    assert time.monotonic() - started < 2
    # Nor does the abandoned BLMOVE take what is pushed next.
    other.rpush("src", "job")
    time.sleep(0.2)
    assert other.lrange("src", 0, -1) == [b"job"] and other.llen("dst") == 0


@pytest.mark.parametrize("min_replicas", [False, True], ids=["plain", "min-replicas-to-write"])
def test_what_a_manual_failover_loses(min_replicas: bool) -> None:
    """``SENTINEL FAILOVER`` promotes a replica while the old master lives on; Sentinel
    demotes the old master (and drops its clients) only some 10 s later. Writes that
    reach the old master meanwhile are acknowledged, then lost: Redis replication is
    asynchronous. The client never sees an error, and every write after the demotion
    lands on the new master. With ``min-replicas-to-write 1`` (and a second replica, so
    the new master keeps one) the old master refuses writes once its replicas are gone
    (NOREPLICAS), loopbot's client then asks the sentinels again, and the window shrinks
    to about ``min-replicas-max-lag``."""
    args = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"] if min_replicas else []
    s = SentinelSet(replicas=2 if min_replicas else 1, node_args=args).start()
    stop = threading.Event()
    try:
        client = connect(s.url)
        old = s.master_port()
        assert old is not None
        errors: list[BaseException] = []
        written: dict[int, float] = {}

        def write() -> None:
            n = 0
            while not stop.is_set():
                try:
                    client.rpush("seq", n)
                except Exception as exc:  # noqa: BLE001 - any error fails the test below
                    errors.append(exc)
                    return
                written[n] = time.monotonic()
                n += 1
                time.sleep(0.01)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(0.3)
        asked = time.monotonic()
        with s.sentinel(s.sentinel_ports[0]) as sentinel:
            sentinel.execute_command("SENTINEL", "FAILOVER", s.master_name)
        new = s.wait_failover(old)
        deadline = time.monotonic() + 30
        while s.role(old) != "slave" and time.monotonic() < deadline:
            time.sleep(0.05)
        demoted = time.monotonic()
        assert s.role(old) == "slave"
        time.sleep(1.0)  # writes after the demotion too
        stop.set()
        writer.join(30)
        assert not errors, errors
        with s.client(new) as direct:
            stored = [int(x) for x in direct.lrange("seq", 0, -1)]
    finally:
        stop.set()
        s.stop()
    lost = sorted(set(written) - set(stored))
    # What was kept is in order, and what was lost is one run of writes inside the
    # failover: none before it was asked for, none after the old master was demoted.
    assert stored == sorted(stored) and len(stored) == len(set(stored))
    if lost:
        assert lost == list(range(lost[0], lost[-1] + 1)), lost
        assert asked - 0.05 <= written[lost[0]] and written[lost[-1]] <= demoted
    assert any(written[n] > demoted for n in stored)
    window = written[lost[-1]] - written[lost[0]] if lost else 0.0
    if min_replicas:
        assert window < 3.0, window
    else:
        assert window > 3.0, window  # the whole time until Sentinel demoted the old master


def test_rq_s_rebuilt_connections_stay_sentinel_managed(sentinels: SentinelSet) -> None:
    """RQ's scheduler (and worker pool) rebuild the connection from its class, its pool's
    connection class and kwargs; it must stay a Sentinel client that follows failovers."""
    client = connect(sentinels.url)
    scheduler = RQScheduler(["q"], connection=client)
    rebuilt = scheduler.connection
    assert isinstance(rebuilt, SentinelRedis)
    assert isinstance(rebuilt.connection_pool, SentinelConnectionPool)
    cls, pool_cls, kwargs = parse_connection(client)
    again = cls(connection_pool=ConnectionPool(connection_class=pool_cls, **kwargs))
    assert isinstance(again.connection_pool, SentinelConnectionPool)
    assert rebuilt.ping() and again.ping()
    assert scheduler.acquire_locks() == {"q"}
    _, new = failover(sentinels)
    scheduler.heartbeat()  # refreshes its lock: on the new master
    again.set("k", "v")
    with sentinels.client(new) as direct:
        assert direct.get(RQScheduler.get_locking_key("q")) == scheduler.name.encode()
        assert direct.get("k") == b"v"
    rebuilt.close()
    again.close()


WORKER = textwrap.dedent(
    """
    import sys
    from rq import Queue, Worker
    from bot.io.redis import connect
    conn = connect(sys.argv[1])
    worker = Worker([Queue("q", connection=conn)], connection=conn, name=sys.argv[2])
    worker.work(with_scheduler=True, logging_level="WARNING")
    """
)


def test_a_forking_rq_worker_and_its_scheduler_ride_out_a_failover(
    sentinels: SentinelSet, tmp_path: Path
) -> None:
    """A real forking RQ worker (blocking dequeue, work horse, scheduler process, pubsub)
    on the Sentinel URL: after the master is killed, a job enqueued and a job scheduled
    before the failover both run, and a shutdown command sent over pubsub stops it."""
    client = connect(sentinels.url)
    queue = Queue("q", connection=client)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, sentinels.url, "w1"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its scheduler and work horse go with it, below
        )
    try:
        first = queue.enqueue("operator.add", 1, 2)
        wait(lambda: first.get_status(refresh=True) == JobStatus.FINISHED, 20, "first job")
        later = queue.enqueue_in(timedelta(seconds=6), "operator.mul", 6, 7)
        failover(sentinels)  # the worker sits in BLMOVE on the old master meanwhile
        now = queue.enqueue("operator.sub", 9, 4)
        # Within seconds: its blocked BLMOVE followed the failover (not after 35 s).
        wait(lambda: now.get_status(refresh=True) == JobStatus.FINISHED, 10, "job after")
        wait(lambda: later.get_status(refresh=True) == JobStatus.FINISHED, 40, "scheduled job")
        assert (first.return_value(), now.return_value(), later.return_value()) == (3, 5, 42)
        assert StartedJobRegistry("q", connection=client).count == 0
        # Its pubsub thread subscribed again on the new master: a command reaches it.
        channel = PUBSUB_CHANNEL_TEMPLATE % "w1"
        wait(lambda: client.pubsub_numsub(channel)[0][1] == 1, 20, "the worker's pubsub")
        send_shutdown_command(client, "w1")
        proc.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == 0, log.read_text()
    text = log.read_text()
    assert "Traceback" not in text, text


def test_a_write_refused_for_want_of_replicas_waits_for_them() -> None:
    """``min-replicas-to-write 1``: with its replica gone the master refuses writes
    (NOREPLICAS); loopbot's client waits, as for a restart, and the write lands once the
    replica is back."""
    s = SentinelSet(
        password=PASSWORD, node_args=["--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"]
    ).start()
    master = s.master_port()
    replica = next(p for p in s.nodes if p != master)
    back = threading.Timer(5.5, s.restart_node, args=(replica,))
    try:
        client = connect(s.url)
        client.set("a", "1")
        s.nodes[replica].kill()
        back.start()
        time.sleep(3.5)  # past min-replicas-max-lag: the master refuses writes now
        started = time.monotonic()
        assert client.set("b", "2")
        assert time.monotonic() - started > 1.0  # it did wait for the replica
        assert client.get("b") == b"2"
    finally:
        back.cancel()
        if back.ident is not None:
            back.join()
        s.stop()


def test_sentinel_problems_are_one_clear_line_without_secrets(sentinels: SentinelSet) -> None:
    hosts = sentinels.hosts
    good = sentinels.url

    def problem(url: str, wait: float = 0) -> RedisProblem:
        started = time.monotonic()
        with pytest.raises(RedisProblem) as exc:
            check(url, wait=wait)
        assert time.monotonic() - started < 10
        message = str(exc.value)
        assert "Pa55" not in message and "s3ntinel" not in message, message
        assert "REDIS_SENTINELS/REDIS_URL" in message and len(message.splitlines()) == 1
        return exc.value

    unknown = problem(good.replace("/mymaster/", "/nomaster/"), wait=30)
    assert unknown.permanent and "no sentinel monitors a master named 'nomaster'" in str(unknown)
    wrong_sentinel_pw = problem(good.replace("sentinel_password=", "sentinel_password=x"), 30)
    assert wrong_sentinel_pw.permanent and "sentinels refused the credentials" in str(
        wrong_sentinel_pw
    )
    wrong_pw = problem(good.replace("m4ster", "wrong"), wait=30)
    assert wrong_pw.permanent and "refused the credentials" in str(wrong_pw)
    # A Redis that is not a sentinel.
    master = sentinels.master_port()
    not_sentinel = problem(
        f"redis+sentinel://127.0.0.1:{master}/mymaster?sentinel_password=x", wait=30
    )
    assert not_sentinel.permanent
    # No sentinel up: not permanent (they may be starting), and every one is named.
    for proc in sentinels.sentinel_procs.values():
        proc.kill()
        proc.wait(5)
    down = problem(good)
    assert not down.permanent and "cannot reach Redis" in str(down)
    assert all(f"sentinel {h}" in str(down) for h in hosts.split(","))


def test_the_cli_reads_redis_sentinels(sentinels: SentinelSet) -> None:
    env = {
        "REDIS_SENTINELS": sentinels.hosts,
        "REDIS_SENTINEL_MASTER": "mymaster",
        "REDIS_URL": (
            f"redis://:{SetUrl.quoted(PASSWORD)}@unused:6379/0"
            f"?sentinel_password={SetUrl.quoted(SENTINEL_PASSWORD)}"
        ),
    }
    out = cli("status", env=env)
    assert out.returncode == 0 and "no loops yet" in out.stdout, out.stderr
    wrong = cli("status", env={**env, "REDIS_SENTINEL_MASTER": "other"}, timeout=60)
    assert wrong.returncode == 1 and "no sentinel monitors a master named 'other'" in wrong.stderr
    bad = cli("status", env={"REDIS_SENTINELS": "h:x"})
    assert bad.returncode == 2 and "REDIS_SENTINELS: sentinel address 'h:x'" in bad.stderr
    for o in (out, wrong, bad):
        assert "Pa55" not in o.stdout + o.stderr and "s3ntinel" not in o.stdout + o.stderr


def test_doctor_shows_the_sentinel_view(sentinels: SentinelSet, env: dict[str, str]) -> None:
    out = cli("doctor", env={**env, "REDIS_URL": sentinels.url})
    line = next(x for x in out.stdout.splitlines() if "] redis" in x)
    assert line.startswith("[ok  ] redis"), out.stdout
    assert f"master 127.0.0.1:{sentinels.master_port()}, 1 replica(s), 3 sentinel(s)" in line
    assert "append-only file on" in line
    # With no replica left, a failover would have nothing to promote: a warning.
    master = sentinels.master_port()
    replica = next(p for p in sentinels.nodes if p != master)
    sentinels.nodes[replica].kill()
    with sentinels.sentinel(sentinels.sentinel_ports[0]) as s:
        wait(
            lambda: "s_down" in s.sentinel_slaves(sentinels.master_name)[0]["flags"],
            10,
            "the sentinels to see the replica down",
        )
    warned = cli("doctor", env={**env, "REDIS_URL": sentinels.url})
    line = next(x for x in warned.stdout.splitlines() if "] redis" in x)
    assert line.startswith("[warn] redis") and "0 replica(s)" in line, warned.stdout
    assert "nothing to promote" in line
    for o in (out, warned):
        assert "Pa55" not in o.stdout + o.stderr and "s3ntinel" not in o.stdout + o.stderr


def wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
