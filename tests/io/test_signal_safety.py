"""What a signal handler does in loopbot takes no lock: the handler runs on the thread it
interrupted, which may hold that very lock (the supervisor hung on structlog's writer
lock, tests/io/test_supervisor.py). In a process of its own, so the signals and the
logging set-up are the test's alone."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from redis import Redis

from bot.io.queues import SERIALIZER, make_worker
from jobs.drain import SCHEDULER_STOP_SECONDS, DrainingWorker, PromptScheduler
from tests.helpers import ROOT

SCRIPT = """
import json, os, signal, sys, time
import structlog
from bot.io.logs import log_from_signal_handler
from jobs.drain import DRAIN

# 1. A handler that logs, landing while a log line is being written.
class Out:
    def write(self, text):
        if "outer" in text:
            log_from_signal_handler("worker.draining", horse=42)  # as a handler would
        sys.stdout.write(text)
    def flush(self):
        sys.stdout.flush()

structlog.configure(logger_factory=structlog.WriteLoggerFactory(Out()))
structlog.get_logger("t").info("outer")
print("logged", flush=True)

# 2. DRAIN set by a handler while the main thread waits on it.
signal.signal(signal.SIGALRM, lambda s, f: DRAIN.set())
signal.setitimer(signal.ITIMER_REAL, 0.3)
t0 = time.monotonic()
woke = DRAIN.wait(20)
print("drain", woke, round(time.monotonic() - t0, 1), flush=True)
"""


def test_a_handler_s_log_line_and_drain_flag_take_no_lock() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert "logged" in proc.stdout
    line = next(ln for ln in proc.stderr.splitlines() if "worker.draining" in ln)
    assert '"horse": 42' in line
    drain = next(ln for ln in proc.stdout.splitlines() if ln.startswith("drain"))
    _, woke, took = drain.split()
    assert woke == "True" and float(took) < 5, drain


def test_drain_wait_times_out_when_nobody_sets_it() -> None:
    from jobs.drain import Flag

    flag = Flag()
    assert flag.wait(0.3) is False
    flag.set()
    assert flag.wait(0) is True and flag.is_set()


class DeafScheduler(PromptScheduler):
    """The scheduler as it is when the stop's SIGTERM lands an instant after its fork,
    before it installs its handlers: the signal is gone, and it sleeps round after round."""

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_scheduler_that_lost_the_stop_signal_does_not_hold_the_worker(redis: Redis) -> None:
    """A stopping worker waits a few seconds for its scheduler process, then kills it and
    frees its locks for the next worker's scheduler (CI hung here for good)."""
    worker = make_worker(["loopbot-test-stop"], redis, DrainingWorker)
    worker.scheduler = DeafScheduler(worker.queues, connection=redis, serializer=SERIALIZER)
    worker.scheduler.acquire_locks()
    assert worker.scheduler.acquired_locks == {"loopbot-test-stop"}
    worker.scheduler.start()
    process = worker.scheduler._process
    deadline = time.monotonic() + 10  # its handlers are in place once it is registered
    while not redis.exists(worker.scheduler.key) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    worker.stop_scheduler()
    assert not process.is_alive() and process.exitcode == -signal.SIGKILL
    assert SCHEDULER_STOP_SECONDS <= time.monotonic() - started < SCHEDULER_STOP_SECONDS + 3
    # The lock is free: the next worker's scheduler takes it at once.
    other = PromptScheduler(worker.queues, connection=redis, serializer=SERIALIZER)
    other.acquire_locks()
    assert other.acquired_locks == {"loopbot-test-stop"}
    other.release_locks()
