"""Defence in depth for Redis: a write to Redis never becomes code execution, and
``REDIS_URL`` may carry a password and TLS.

Real redis-server processes and real RQ workers throughout. The attacks are planted the
way anyone with write access to Redis could plant them: with plain RQ (not loopbot's
helpers) or raw Redis commands.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
import uuid
import zlib
from base64 import b64decode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from rq import Callback, Queue, Retry, SimpleWorker
from rq.job import JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer, PickleSerializer

from bot.core.commands import ChecksCompleted
from bot.core.settings import Settings, SettingsError, load_settings
from bot.io.queues import (
    ALL_QUEUES,
    COMMAND_ENTRY,
    CONTROL_QUEUE,
    JOB_META,
    LOOP_QUEUE,
    JobKind,
    RefusedJob,
    control_queue,
    enqueue_command,
    fetch_job,
    func_name,
    job_functions,
    loop_queue,
)
from bot.io.redis import RedisProblem, check, connect, mask_url
from bot.ops.cli import _run_worker
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer, make_tls_files
from jobs import runtime as runtime_mod
from tests.conftest import make_env
from tests.helpers import ROOT
from tests.io.test_operator import cli

PASSWORD = "s3cr3t-Pa55/w:rd@x"  # characters that need quoting in a URL, on purpose


class Evil:
    """Unpickling this runs a shell command: the classic pickle payload."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (self.command,))


def work_like_loopbot(settings: Settings) -> None:
    """Drain the queues with the worker ``loopbot worker`` builds (forking, burst)."""
    try:
        _run_worker(settings, list(ALL_QUEUES), burst=True, scheduler=False)
    finally:
        runtime_mod._current = None


def refused(job_id: str, redis: Redis, queue: str = LOOP_QUEUE) -> str:
    """The job failed, sits in the failed registry, and says why it was refused."""
    job = fetch_job(job_id, redis)
    assert job.get_status(refresh=True) == JobStatus.FAILED
    assert job_id in FailedJobRegistry(queue, connection=redis, serializer=JSONSerializer)
    result = job.latest_result()
    assert result is not None and result.exc_string is not None
    assert f"job {job_id} refused: " in result.exc_string
    return result.exc_string


@pytest.fixture
def evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """An importable module that leaves a marker file as soon as it is imported."""
    name = f"loopbot_evil_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / f"{name}.imported"
    (tmp_path / f"{name}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n\n"
        "def run(*args, **kwargs):\n    return 'ran'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


# -- a planted job never runs code ------------------------------------------------------


def test_planted_jobs_run_no_code(
    settings: Settings, redis: Redis, tmp_path: Path, evil_module: tuple[str, Path]
) -> None:
    shell_marker = tmp_path / "os-system-ran"
    call_marker = tmp_path / "subprocess-call-ran"
    module, import_marker = evil_module
    # Plain RQ with JSON, as anyone who can write to Redis could enqueue.
    attacker = Queue(LOOP_QUEUE, connection=redis, serializer=JSONSerializer)
    shell = attacker.enqueue("os.system", f"touch {shell_marker}", retry=Retry(max=5))
    call = attacker.enqueue("subprocess.call", ["touch", str(call_marker)])
    imported = attacker.enqueue(f"{module}.run")
    # An allowed function, with a failure callback that would import the module.
    callback = Queue(CONTROL_QUEUE, connection=redis, serializer=JSONSerializer).enqueue(
        COMMAND_ENTRY, "not a command", on_failure=Callback(f"{module}.run")
    )

    work_like_loopbot(settings)

    assert not shell_marker.exists() and not call_marker.exists()
    assert not import_marker.exists(), "a job's function module was imported"
    assert "'os.system' is not one of loopbot's job functions" in refused(shell.id, redis)
    assert "'subprocess.call'" in refused(call.id, redis)
    assert f"'{module}.run'" in refused(imported.id, redis)
    assert "callbacks" in refused(callback.id, redis, CONTROL_QUEUE)
    assert len(fetch_job(shell.id, redis).results()) == 1, "a refused job is not retried"

    # Control: the same planted job on a plain RQ worker does run. The test above
    # would notice if the allowlist stopped working.
    control = Queue("attack-control", connection=redis, serializer=JSONSerializer)
    control.enqueue("os.system", f"touch {shell_marker}")
    SimpleWorker([control], connection=redis, serializer=JSONSerializer).work(burst=True)
    assert shell_marker.exists()


def test_a_pickle_payload_is_never_unpickled(
    settings: Settings, redis: Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(Evil(f"touch {marker}"))
    # The old format: RQ's pickle serializer, on loopbot's queue, for an allowed function,
    # with the payload in the job's data, meta and result.
    old = Queue(LOOP_QUEUE, connection=redis, serializer=PickleSerializer)
    job = old.enqueue(func_name(JobKind.LOOP), "acme/widgets", 1, job_id="planted-pickle")
    redis.hset(
        job.key,
        mapping={"data": zlib.compress(payload), "meta": payload, "result": payload},
    )
    # Raw: a job hash written by hand, uncompressed.
    redis.hset(
        "rq:job:planted-raw",
        mapping={"data": payload, "origin": LOOP_QUEUE, "status": "queued", "meta": payload},
    )
    redis.rpush(f"rq:queue:{LOOP_QUEUE}", "planted-raw")

    fetched = fetch_job("planted-pickle", redis)  # what dispatch and the reconciler do
    assert fetched.get_status(refresh=True) == JobStatus.QUEUED
    assert fetched.refusal() == "its data is not loopbot's JSON job format"
    work_like_loopbot(settings)

    assert not marker.exists(), "a pickle from Redis was unpickled"
    for job_id in ("planted-pickle", "planted-raw"):
        assert "not loopbot's JSON job format" in refused(job_id, redis)
    # Control: the payload is live; unpickling it is what must never happen.
    pickle.loads(payload)
    assert marker.exists()


def test_loopbot_cannot_enqueue_what_its_workers_refuse(redis: Redis) -> None:
    with pytest.raises(RefusedJob, match=r"os\.system"):
        loop_queue(redis).enqueue("os.system", "true")
    with pytest.raises(RefusedJob, match="callbacks"):
        loop_queue(redis).enqueue(
            func_name(JobKind.LOOP), "a/b", 1, on_success=Callback("os.system")
        )
    assert not redis.llen(f"rq:queue:{LOOP_QUEUE}")
    # The allowlist is every kind's wire name, and each runs a registered function.
    assert len(job_functions()) == len(JobKind)
    for kind in JobKind:
        job = loop_queue(redis).create_job(func_name(kind), args=("a/b", 1), meta=dict(JOB_META))
        assert job.refusal() is None and callable(job.func), kind


def test_jobs_are_json_end_to_end(settings: Settings, redis: Redis) -> None:
    cmd = ChecksCompleted(
        installation_id=1, repo="acme/widgets", issue=7, actor="alice", delivery="d-1", head_sha="a"
    )
    job_id = enqueue_command(control_queue(redis), cmd)
    raw = redis.hget(f"rq:job:{job_id}", "data")
    assert raw is not None
    func, instance, args, kwargs = json.loads(zlib.decompress(raw))
    assert (func, instance, kwargs) == (COMMAND_ENTRY, None, {})
    assert json.loads(args[0])["kind"] == "checks_completed"

    work_like_loopbot(settings)

    job = fetch_job(job_id, redis)
    assert job.get_status(refresh=True) == JobStatus.FINISHED
    assert job.return_value() == "no loop waiting for checks"
    # The stored result is JSON too (RQ keeps results in a stream per job).
    entries = redis.xrange(f"rq:results:{job_id}")
    stored = b64decode(entries[-1][1][b"return_value"])
    assert json.loads(stored) == "no loop waiting for checks"


def test_every_queue_job_and_worker_is_built_in_bot_queues() -> None:
    """RQ defaults to pickle and to running any function: nothing may build its own."""
    raw = re.compile(
        r"(?<![\w.])(Queue|Worker|SimpleWorker|SpawnWorker)\(|\bJob\.(fetch|fetch_many|create)\("
        r"|JobRegistry\("
    )
    offenders = []
    for path in sorted([*ROOT.glob("bot/**/*.py"), *ROOT.glob("jobs/**/*.py")]):
        if path == ROOT / "bot" / "io" / "queues.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if raw.search(line) and "queue.Queue(" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "build these with bot.io.queues:\n" + "\n".join(offenders)


# -- REDIS_URL with a password ------------------------------------------------------------


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    server = RedisServer(password=PASSWORD, persist=True).start()  # doctor wants AOF
    yield server
    server.stop()


def test_password_in_redis_url(locked_redis: RedisServer, env: dict[str, str]) -> None:
    url = locked_redis.url
    assert "s3cr3t" in url
    check(url)
    assert connect(url).ping()
    settings = load_settings({**env, "REDIS_URL": url}, role="worker")
    assert PASSWORD not in repr(settings) and "s3cr3t" not in repr(settings)
    assert mask_url(url) == f"redis://:***@127.0.0.1:{locked_redis.port}/0"
    # The operator tools work with it.
    seeded = connect(url)
    seeded.flushdb()  # our own server, started above
    out = cli("status", env={"REDIS_URL": url})
    assert out.returncode == 0 and "no loops yet" in out.stdout, out.stderr


@pytest.mark.parametrize(
    "password", ["wrong-password", None], ids=["wrong password", "no password"]
)
def test_wrong_password_is_one_clear_line(
    locked_redis: RedisServer, env: dict[str, str], password: str | None
) -> None:
    url = locked_redis.url_with(password)
    with pytest.raises(RedisProblem) as exc:
        check(url, wait=30)  # refused credentials do not wait
    message = str(exc.value)
    assert exc.value.permanent and "REDIS_URL" in message and "credentials" in message
    if password:
        assert password not in message and "***" in message

    # Each process stops at start-up, at once; status needs only REDIS_URL.
    for args in (("worker", "--burst"), ("web", "--port", "1"), ("status",)):
        run_env = {"REDIS_URL": url} if args[0] == "status" else {**env, "REDIS_URL": url}
        out = cli(*args, env=run_env, timeout=30)
        assert out.returncode in (1, 2), out
        assert "REDIS_URL" in out.stderr and "credentials" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        if password:
            assert password not in out.stderr + out.stdout


def test_settings_accept_only_redis_urls() -> None:
    base = {
        "GITHUB_APP_ID": "12",
        "GITHUB_PRIVATE_KEY": "-----BEGIN KEY-----\nx\n-----END KEY-----\n",
        "GITHUB_WEBHOOK_SECRET": "s",
    }
    for good in (
        "redis://localhost:6379/0",
        "redis://:pw@localhost/0",
        "redis://user:pw@localhost:6380/1",
        "rediss://redis.example.com:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=required",
        "unix:///run/redis/redis.sock?db=0",
    ):
        assert load_settings({**base, "REDIS_URL": good}).redis_url == good
    for bad, why in (
        ("http://:hunter2@localhost:6379/0", "scheme must be redis://, rediss:// or unix://"),
        ("localhost:6379", "scheme must be"),
        ("redis://:hunter2@localhost:port/0", "not a valid URL"),
        ("redis://:hunter2@/0", "no host"),
    ):
        with pytest.raises(SettingsError) as exc:
            load_settings({**base, "REDIS_URL": bad})
        assert f"REDIS_URL: {why}" in str(exc.value)
        assert "hunter2" not in str(exc.value)


def test_mask_url() -> None:
    assert mask_url("redis://u:p%40ss@h:1/0") == "redis://u:***@h:1/0"
    assert mask_url("redis://:pw@h/0") == "redis://:***@h/0"
    assert mask_url("redis://h/0?password=pw&db=1") == "redis://h/0?password=***&db=1"
    assert mask_url("rediss://h/0?ssl_ca_certs=/a/b.pem") == "rediss://h/0?ssl_ca_certs=/a/b.pem"
    assert mask_url("unix:///run/redis.sock") == "unix:///run/redis.sock"
    assert mask_url("redis://token@h/0") == "redis://***@h/0"
    # A password written without percent-encoding is still masked whole.
    unescaped = f"redis://:{PASSWORD}@127.0.0.1:6379/0"
    assert mask_url(unescaped) == "redis://:***@127.0.0.1:6379/0"
    with pytest.raises(RedisProblem) as exc:
        check(unescaped)
    assert "s3cr3t" not in str(exc.value) and "percent-encoded" in str(exc.value)


def test_doctor_never_prints_the_password(locked_redis: RedisServer, env: dict[str, str]) -> None:
    ok = cli("doctor", env={**env, "REDIS_URL": locked_redis.url})
    assert "[ok  ] redis" in ok.stdout, ok.stdout
    bad = cli("doctor", env={**env, "REDIS_URL": locked_redis.url_with("wrong-password")})
    assert "[FAIL] redis" in bad.stdout
    for out in (ok, bad):
        assert "s3cr3t" not in out.stdout + out.stderr
        assert "wrong-password" not in out.stdout + out.stderr


# -- REDIS_URL over TLS -------------------------------------------------------------------


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(password=PASSWORD, tls=make_tls_files(tmp_path / "tls"))
    try:
        server.start()
    except RuntimeError as exc:  # a redis-server built without TLS exits at once
        server.stop()
        pytest.skip(f"redis-server has no TLS support: {exc}")
    yield server
    server.stop()


def test_a_job_runs_over_tls(
    tls_redis: RedisServer,
    github: GitHubServer,
    model: AnthropicServer,
    tmp_path: Path,
) -> None:
    url = tls_redis.url
    assert url.startswith("rediss://") and "ssl_ca_certs=" in url
    check(url)
    settings = load_settings(make_env(url, github, model.url, tmp_path / "data"), role="worker")
    conn = connect(settings.redis_url)
    assert conn.connection_pool.connection_class.__name__ == "SSLConnection"
    cmd = ChecksCompleted(
        installation_id=1, repo="acme/widgets", issue=3, actor="alice", delivery="tls", head_sha="a"
    )
    job_id = enqueue_command(control_queue(conn), cmd)

    work_like_loopbot(settings)

    assert fetch_job(job_id, conn).return_value() == "no loop waiting for checks"


def test_tls_failures_are_one_clear_line(tls_redis: RedisServer, tmp_path: Path) -> None:
    assert tls_redis.tls is not None
    stranger = make_tls_files(tmp_path / "other")
    wrong_ca = tls_redis.url.replace(str(tls_redis.tls.ca), str(stranger.ca))
    with pytest.raises(RedisProblem) as exc:
        check(wrong_ca, wait=30)  # a TLS failure does not wait
    message = str(exc.value)
    assert exc.value.permanent and message.startswith("REDIS_URL (rediss://:***@127.0.0.1")
    assert "TLS handshake failed" in message and "CERTIFICATE_VERIFY_FAILED" in message
    assert "s3cr3t" not in message
    missing_ca = tls_redis.url.replace(str(tls_redis.tls.ca), str(tmp_path / "nope.pem"))
    with pytest.raises(RedisProblem) as exc:
        check(missing_ca, wait=30)
    assert exc.value.permanent and "cannot read a TLS file" in str(exc.value)
    # Plain redis:// to a TLS-only port: a hint, not a mystery.
    plain = tls_redis.url.replace("rediss://", "redis://").partition("?")[0]
    with pytest.raises(RedisProblem) as exc:
        check(plain)
    assert "rediss://" in str(exc.value) and "s3cr3t" not in str(exc.value)
