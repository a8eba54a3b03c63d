"""Graceful shutdown: a loop hands itself over instead of dying with its worker.

A deploy stops workers with SIGTERM. RQ's warm shutdown waits for the running job, but
a loop can run for an hour, so the platform's SIGKILL would follow and the loop would
come back only as a lapsed lease, counted against ``LOOPBOT_MAX_AUTO_RESUMES``. Instead:

- the worker, asked to stop, passes SIGTERM on to its work horse (only the horse: the
  sandboxed commands have their own sessions and finish or time out as usual);
- every loopbot job turns SIGTERM into the ``DRAIN`` flag for as long as it runs, so a
  short job (dispatch, critic, gate) finishes, and a loop stops at its next step, commits
  and pushes what it has, saves the conversation and is queued, marked ``handed_over``
  (``jobs.lifecycle.requeue`` with ``Requeue.HANDOFF``);
- the reconciler of any live worker resumes a handed-over loop at once, without
  counting it as a lost worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from redis.exceptions import RedisError
from rq import Worker
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.scheduler import RQScheduler

from bot.io.logs import get_logger, log_from_signal_handler
from bot.io.queues import SERIALIZER, LoopbotJob

log = get_logger("loopbot.drain")


class Flag:
    """A flag a signal handler may set: no lock anywhere (``threading.Event.set`` takes
    one, and a handler runs on the very thread that may be holding it, inside ``wait``:
    a deadlock). ``wait`` sleeps in short steps instead of on a condition."""

    STEP = 0.2

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._set:
            left = self.STEP if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self.STEP, left))
        return self._set


DRAIN = Flag()


@contextlib.contextmanager
def sigterm_drains() -> Iterator[None]:
    """While the body runs, SIGTERM sets ``DRAIN`` instead of killing the process."""
    DRAIN.clear()  # a fresh job; in a forked horse nothing could have set it yet
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers live on the main thread; in-thread runs keep the default
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _on_sigterm(signum: int, frame: Any) -> None:
    DRAIN.set()


SCHEDULER_LOOK_SECONDS = 5  # how long a scheduler slot goes without a lock it could hold
# How long a stopping worker waits for its scheduler process (RQ's sleeps 1 s a round).
SCHEDULER_STOP_SECONDS = 5


class PromptScheduler(RQScheduler):
    """RQ's scheduler, trying again for a queue's lock it lacks every few seconds.

    RQ's tries again after 120 s (``DEFAULT_SCHEDULER_FALLBACK_PERIOD``): a worker started
    while the old worker's scheduler lock still stood (61 s) held the control queue's lock
    and not the loop queue's, so a handed-over loop's retry sat scheduled for two minutes
    (seen in CI: issue 37, item 9)."""

    @property
    def should_reacquire_locks(self) -> bool:
        if self._queue_names == self.acquired_locks:
            return False
        if not self.lock_acquisition_time:
            return True
        waited = (datetime.now() - self.lock_acquisition_time).total_seconds()
        return waited > SCHEDULER_LOOK_SECONDS


class DrainingWorker(Worker):
    """RQ's forking worker, passing a warm shutdown on to the job it is running.

    Always JSON and ``LoopbotJob`` (see ``bot.io.queues``), however it is constructed: a
    job planted in Redis is never unpickled and never runs a function of its choosing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(job_class=LoopbotJob, serializer=SERIALIZER)
        super().__init__(*args, **kwargs)

    # RQ's worker tries the scheduler's lock at start and then only at its maintenance,
    # every 10 minutes, looking between blocking waits of 405 s: a scheduler slot started
    # while a dead scheduler's lock still stood (61 s), or whose scheduler process died,
    # left every scheduled job (a retry after a hand-over, the gate's timer) waiting that
    # long. The scheduler slot wakes every few seconds and, with no live scheduler,
    # tries the lock again (tests/e2e/test_worker_loops.py).
    @property
    def dequeue_timeout(self) -> int:
        base = int(super().dequeue_timeout)  # also read by __init__, before the scheduler
        return min(base, SCHEDULER_LOOK_SECONDS) if self._scheduler() is not None else base

    @property
    def should_run_maintenance_tasks(self) -> bool:
        if super().should_run_maintenance_tasks:
            return True
        scheduler = self._scheduler()
        if scheduler is None:
            return False
        process = scheduler._process
        return process is None or not process.is_alive()

    def _scheduler(self) -> Any:
        return getattr(self, "scheduler", None)  # RQ sets it once the worker starts

    def _start_scheduler(
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        """RQ's own (rq 2.12 ``Worker._start_scheduler``), with ``PromptScheduler``."""
        self.scheduler = PromptScheduler(
            self.queues,
            connection=self.connection,
            logging_level=logging_level if logging_level is not None else self.log.level,
            date_format=date_format,
            log_format=log_format,
            serializer=self.serializer,
        )
        self.scheduler.acquire_locks()  # type: ignore[no-untyped-call]
        if self.scheduler.acquired_locks:
            if burst:
                try:
                    self.scheduler.register_birth()
                    self.scheduler.enqueue_scheduled_jobs()  # type: ignore[no-untyped-call]
                finally:
                    self.scheduler.release_locks()  # type: ignore[no-untyped-call]
                    self.scheduler.register_death()
            else:
                self.scheduler.start()  # type: ignore[no-untyped-call]

    def stop_scheduler(self) -> None:
        """RQ's (SIGTERM to the scheduler process, then join), bounded. A scheduler forked
        an instant before the stop runs the worker's inherited SIGTERM handler until it
        installs its own, and that swallows the signal: RQ then joined it for ever, and the
        supervisor with it (CI, reproduced with faulthandler's stacks: the slot in
        ``stop_scheduler``, its scheduler asleep in its loop). After a few seconds it is
        killed, and its locks are released here for the next worker's scheduler."""
        scheduler = self._scheduler()
        process = getattr(scheduler, "_process", None)
        if process is None or not process.pid:
            return
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGTERM)
        process.join(SCHEDULER_STOP_SECONDS)
        if process.is_alive():
            with contextlib.suppress(OSError):
                os.kill(process.pid, signal.SIGKILL)
            process.join()
            log.warning("worker.scheduler_killed", pid=process.pid)
        if process.exitcode != 0:
            # It did not stop on its own (killed here, or by the signal's default action
            # before it had handlers): its locks and its entry, released by its name (the
            # same in this process as in the fork; a lock another scheduler holds stays).
            with contextlib.suppress(RedisError):
                scheduler.release_locks()
                scheduler.register_death()

    def handle_warm_shutdown_request(self) -> None:
        super().handle_warm_shutdown_request()  # type: ignore[no-untyped-call]
        if self.horse_pid:
            # A signal handler: structlog's writer holds a lock the interrupted code may
            # be holding too (the supervisor hung on exactly that), so the line is
            # written in one system call instead.
            log_from_signal_handler("worker.draining", horse=self.horse_pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.horse_pid, signal.SIGTERM)
