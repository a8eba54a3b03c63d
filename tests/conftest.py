"""Shared fixtures: a private redis-server, the local GitHub and Anthropic servers, the web
app on a real port, settings pointing at all of them, and real RQ workers.

Tests never talk to a Redis they did not start: the session's own redis-server is
flushed before each test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from redis import Redis
from rq import SimpleWorker, Worker

from bot.core.settings import Settings, load_settings
from bot.io.logs import configure
from bot.io.queues import ALL_QUEUES, CONTROL_QUEUE, make_worker
from bot.standins import serving
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.github.auth import new_app_key
from bot.standins.redis_server import RedisServer
from bot.web.app import create_app
from jobs import entry as _entry  # noqa: F401 - registers the job functions tests run
from jobs import runtime as runtime_mod
from jobs.runtime import Runtime

configure("console")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(persist=True).start()  # persistent, for the restart test
    yield server
    server.stop()


@pytest.fixture
def redis(redis_server: RedisServer) -> Iterator[Redis]:
    conn = Redis.from_url(redis_server.url)
    conn.flushdb()  # our own server, started above
    yield conn
    conn.close()


@pytest.fixture(scope="session")
def app_key() -> tuple[str, rsa.RSAPublicKey]:
    """One App key per test process: every test's local GitHub is a new App with it."""
    return new_app_key()


@pytest.fixture
def github(tmp_path: Path, app_key: tuple[str, rsa.RSAPublicKey]) -> Iterator[GitHubServer]:
    server = GitHubServer(tmp_path / "github", app_key=app_key).start()
    yield server
    server.stop()


@pytest.fixture
def model() -> Iterator[AnthropicServer]:
    server = AnthropicServer().start()
    yield server
    server.stop()


def make_env(redis_url: str, gh: GitHubServer, model_url: str, data_dir: Path) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "GITHUB_APP_ID": str(gh.app_id),
        "GITHUB_PRIVATE_KEY": gh.private_key_pem,
        "GITHUB_WEBHOOK_SECRET": gh.webhook_secret,
        "GITHUB_API_URL": gh.url,
        "ANTHROPIC_API_KEY": "sk-ant-local-test",
        "ANTHROPIC_BASE_URL": model_url,
        "LOOPBOT_DATA_DIR": str(data_dir),
        "LOOPBOT_MODEL": "claude-test",
        "LOOPBOT_CRITIC_MODEL": "claude-test",
        "LOOPBOT_GITHUB_MAX_RETRY_WAIT": "5",
        # No gap between writes (the pace is tested on its own: tests/e2e/test_github_limits.py).
        "LOOPBOT_GITHUB_WRITE_GAP": "0",
        "LOOPBOT_LOG_FORMAT": "console",
    }


@pytest.fixture
def env_extra() -> dict[str, str]:
    """Settings a test module or case adds to ``env`` (override the fixture, or
    ``pytest.mark.parametrize("env_extra", ...)``)."""
    return {}


@pytest.fixture
def env(
    redis_server: RedisServer,
    redis: Redis,
    github: GitHubServer,
    model: AnthropicServer,
    tmp_path: Path,
    env_extra: dict[str, str],
) -> dict[str, str]:
    return make_env(redis_server.url, github, model.url, tmp_path / "data") | env_extra


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:
    return load_settings(env, role="worker")


@pytest.fixture
def rt(settings: Settings, redis: Redis) -> Iterator[Runtime]:
    runtime = runtime_mod.install(Runtime(settings, redis))
    yield runtime
    runtime_mod._current = None


@dataclass
class Web:
    url: str

    @property
    def webhook_url(self) -> str:
        return self.url + "/webhook"


@contextlib.contextmanager
def serve_web(app: Any, github: GitHubServer) -> Iterator[Web]:
    """``app`` on a real port, the local GitHub sending its webhooks there."""
    server, url = serving.serve(app, "127.0.0.1", 0, "web")
    w = Web(url)
    github.webhook_url = w.webhook_url
    try:
        yield w
    finally:
        serving.stop(server)


@pytest.fixture
def web(settings: Settings, redis: Redis, github: GitHubServer) -> Iterator[Web]:
    """The real Flask app on a real port; the local GitHub sends its webhooks here."""
    with serve_web(create_app(settings, redis), github) as w:
        yield w


def run_worker(redis: Redis, *, fork: bool = False) -> None:
    """Drain loopbot's queues with a real RQ worker in burst mode."""
    cls = Worker if fork else SimpleWorker
    worker = make_worker(ALL_QUEUES, redis, cls)
    worker.work(burst=True, with_scheduler=False, logging_level="WARNING")


def run_control_jobs(redis: Redis) -> None:
    """Run only the control queue: dispatch decisions, without running the loops."""
    make_worker([CONTROL_QUEUE], redis, SimpleWorker).work(burst=True)


@pytest.fixture
def drain(redis: Redis, rt: Runtime, github: GitHubServer):  # type: ignore[no-untyped-def]
    """Deliver pending webhooks, then run every queued job, until nothing is left."""

    def _drain(rounds: int = 10) -> None:
        for _ in range(rounds):
            github.wait_for_webhooks()
            if not any(redis.llen(f"rq:queue:{q}") for q in ALL_QUEUES):
                return
            run_worker(redis)

    return _drain


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class WorkerProcess:
    """``loopbot worker`` as a real process (forking RQ worker, control lane, reconciler)."""

    def __init__(self, env: dict[str, str], data_dir: Path, exe: Path | None = None) -> None:
        # PYTHONFAULTHANDLER: a hung worker's stacks on SIGABRT (``exited``).
        self.env = {
            **os.environ,
            "PYTHONFAULTHANDLER": "1",
            **env,
            "LOOPBOT_DATA_DIR": str(data_dir),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"worker-{data_dir.name}.log"
        # Another release's `loopbot` (tests/e2e/test_release_upgrade.py), or this one's.
        self.exe = exe or Path(sys.executable).parent / "loopbot"

    def start(self) -> WorkerProcess:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.exe), "worker"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def kill(self) -> None:
        """SIGKILL the worker and every descendant, as when its machine goes away.

        RQ's work horse calls setsid(), so killing the process group is not enough.
        """
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM the worker process alone, as ``docker stop`` or a deploy does."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def exited(self, timeout: float) -> int:
        """The worker's exit code once it has exited; when it has not within ``timeout``,
        every thread's stack of it and its descendants (faulthandler, on SIGABRT) is in
        the failure, so a hang says where it hangs."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
            time.sleep(2)
            raise AssertionError(
                f"the worker did not exit within {timeout} s:\n{self.output()[-20000:]}"
            ) from None


@pytest.fixture
def workers(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(name: str = "a", exe: Path | None = None, **extra: str) -> WorkerProcess:
        w = WorkerProcess({**env, **extra}, tmp_path / f"data-{name}", exe).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# Hypothesis's per-example deadline (200 ms) and its too-slow check are timings: under
# CI's load an example of the enqueue format test once took longer and failed. Speed is
# measured by the benchmarks (bench/), never asserted by a test.
hypothesis.settings.register_profile(
    "loopbot", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("loopbot")


def pytest_configure(config: pytest.Config) -> None:
    # Git in tests must not read the developer's ~/.gitconfig.
    os.environ.setdefault("GIT_CONFIG_NOSYSTEM", "1")


# The longest tests start first, one at the head of each xdist worker's share: pytest-
# xdist (``--dist worksteal``) hands worker k the k-th run of the collection, in order,
# and a worker with nothing left steals from the end of another's. A three-minute test
# that starts last runs alone at the end (CI's wall time); two at the head of one share
# run one after the other. Measured with ``pytest -n 4 --dist worksteal --durations=60``
# (2026-11-28); a test named here that is renamed only loses its place, nothing fails.
LONG_FIRST = (
    "tests/io/test_bench_smoke.py::test_benchmark_runs_in_smoke_mode[chaos.py]",
    "tests/io/test_bench_smoke.py::test_benchmark_runs_in_smoke_mode[loop_overhead.py",
    "tests/e2e/test_redis_failover.py::test_a_failover_that_loses_the_last_writes_is_repaired",
    "tests/e2e/agents/test_claude_code.py::test_a_killed_worker_s_loop_resumes_the_same_session_on_another_worker",
    "tests/e2e/agents/test_opencode.py::test_a_killed_worker_s_opencode_session_resumes_on_another_worker",
    "tests/e2e/test_app_create.py::test_app_create_writes_an_env_file_that_web_and_worker_run_to_a_merge",
    "tests/e2e/sandbox/test_containment.py::test_the_same_attacks_fail_for_a_non_root_worker",
    "tests/e2e/test_github_limits.py::test_two_workers_pause_together_at_the_installation_s_limit",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next(
            (i for i, name in enumerate(LONG_FIRST) if item.nodeid.startswith(name)),
            len(LONG_FIRST),
        )

    long = sorted((it for it in items if rank(it) < len(LONG_FIRST)), key=rank)
    rest = [it for it in items if rank(it) == len(LONG_FIRST)]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    # The shares as xdist's first hand-out cuts them (each idle worker in turn gets the
    # pending tests divided by the workers left); the long tests dealt round to them.
    sizes, left = [], len(items)
    for k in range(workers):
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for j, item in enumerate(long):
        heads[j % workers].append(item)
    ordered: list[pytest.Item] = []
    for k in range(workers):
        take = max(sizes[k] - len(heads[k]), 0)
        ordered += heads[k] + rest[:take]
        del rest[:take]
    items[:] = ordered + rest
