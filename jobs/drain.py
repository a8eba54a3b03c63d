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
from collections.abc import Iterator
from typing import Any

from rq import Worker

from bot.io.logs import get_logger
from bot.io.queues import SERIALIZER, LoopbotJob

log = get_logger("loopbot.drain")

DRAIN = threading.Event()


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


class DrainingWorker(Worker):
    """RQ's forking worker, passing a warm shutdown on to the job it is running.

    Always JSON and ``LoopbotJob`` (see ``bot.io.queues``), however it is constructed: a
    job planted in Redis is never unpickled and never runs a function of its choosing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(job_class=LoopbotJob, serializer=SERIALIZER)
        super().__init__(*args, **kwargs)

    def handle_warm_shutdown_request(self) -> None:
        super().handle_warm_shutdown_request()  # type: ignore[no-untyped-call]
        if self.horse_pid:
            log.info("worker.draining", horse=self.horse_pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.horse_pid, signal.SIGTERM)
