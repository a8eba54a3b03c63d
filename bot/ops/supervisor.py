"""``loopbot worker --loops N``: N loop slots and one control lane under one supervisor.

Each slot is an RQ worker process (``DrainingWorker``) that runs one loop at a time in
its forked work horse; the control lane is one more worker, only for control commands,
so ``/loop-cancel`` is handled however busy the slots are. Slot 0 also runs RQ's
scheduler and the reconciler: one of each per machine is enough (both take a Redis lock
anyway), and each scheduler is a process of its own.

The children are forked from a supervisor that has already imported the job code, so
the interpreter and the libraries are shared copy-on-write instead of loaded N times
(``bench/fleet.py`` measures what a slot costs). The supervisor holds no Redis
connection and no thread when it forks.

- SIGTERM or SIGINT: passed on, once, to every child (a second would be RQ's cold
  shutdown: the loop killed, not handed over; a repeated signal is only logged). Each
  drains as a lone worker does (its loop hands itself over, ``jobs.drain``); the
  supervisor exits when all have. A stop during start-up starts no more children.
- A child that dies while the supervisor is not stopping is started again, after a pause
  that doubles while it keeps dying young (``restart_delay``), so a broken Redis or a
  bad setting is retried, not spun on.
- ``--burst``: every slot drains the queues and exits; nothing is restarted.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from bot.io.logs import get_logger

log = get_logger("loopbot.supervisor")

# A child that lived this long before dying was not crash-looping: its next start is
# immediate again.
HEALTHY_AFTER = 60.0
FIRST_DELAY, MAX_DELAY = 1.0, 60.0
_STOPS = {signal.SIGTERM, signal.SIGINT}


def restart_delay(previous: float, lived: float) -> float:
    """How long to wait before starting again a child that died after ``lived`` seconds,
    when the delay before its last start was ``previous``."""
    if lived >= HEALTHY_AFTER:
        return 0.0
    return min(MAX_DELAY, max(FIRST_DELAY, previous * 2))


@dataclass
class Child:
    """One supervised process: a loop slot or the control lane."""

    name: str
    target: Callable[[], None]
    process: BaseProcess | None = None
    started: float = 0.0
    delay: float = 0.0
    due: float = 0.0  # when a dead child is started again
    signalled: bool = False  # told to stop (once: a second signal is RQ's cold shutdown)
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(self, children: list[Child], *, restart: bool) -> None:
        self.children = children
        self.restart = restart
        self.stopping = False
        self._signals: list[int] = []  # noted by the handler, acted on by run()
        self._told_stop = False
        self._ctx = multiprocessing.get_context("fork")

    def _start(self, child: Child) -> None:
        # No signal handler runs while the child is forked and recorded: one landing in
        # between would miss it (its Process not yet known alive).
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            child.process = self._ctx.Process(
                target=_child_main, args=(child.target, os.getpid()), name=child.name
            )
            child.process.start()
            child.started = time.monotonic()
            child.signalled = False
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        log.info("supervisor.started", child=child.name, pid=child.process.pid)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: the handler runs between two bytecodes of the main thread, which
        # may be holding the logger's lock (a log line in the middle of being written)
        # or be inside a child's poll; logging or polling here deadlocked start-up.
        self._signals.append(signum)
        self.stopping = True

    def _take_signals(self) -> None:
        """Act on the signals noted since the last look: the first stops (every child is
        told, once); any later one is only logged."""
        while self._signals:
            signum = self._signals.pop(0)
            name = signal.Signals(signum).name
            if self._told_stop:
                log.warning(
                    "supervisor.already_stopping",
                    signal=name,
                    hint="the slots are draining; to force, SIGKILL the supervisor's group",
                )
                continue
            log.info("supervisor.stopping", signal=name)
            self._told_stop = True
        if self.stopping:
            self._tell_children()  # those started since the signal too

    def _tell_children(self) -> None:
        """SIGTERM, once, to every child alive and not yet told."""
        for child in self.children:
            p = child.process
            if p is not None and p.pid is not None and not child.signalled and p.is_alive():
                child.signalled = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)

    def run(self) -> int:
        """Start every child and watch them until all have exited; the exit status is the
        worst of the children's last ones (0 when all drained cleanly)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for child in self.children:
                if self.stopping:
                    break  # a stop came during start-up: start no more
                self._start(child)
                self._take_signals()
            while True:
                self._take_signals()
                alive = self._watch()
                if not alive and (self.stopping or not self.restart):
                    break
                time.sleep(0.2)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        # A child that died of the stop it was sent (before it could drain: it was
        # starting) stopped cleanly.
        codes = [
            0 if c.signalled and c.exit_codes[-1] == -signal.SIGTERM else c.exit_codes[-1]
            for c in self.children
            if c.exit_codes
        ]
        return max((abs(c) for c in codes), default=0)

    def _watch(self) -> int:
        """Reap the children that exited, start again those that are due; how many run."""
        now = time.monotonic()
        alive = 0
        for child in self.children:
            p = child.process
            if p is not None and p.is_alive():
                alive += 1
                continue
            if p is not None:  # exited since the last look
                p.join()
                code = p.exitcode if p.exitcode is not None else 1
                child.exit_codes.append(code)
                child.process = None
                lived = now - child.started
                if self.stopping or not self.restart:
                    log.info("supervisor.exited", child=child.name, code=code)
                    continue
                child.delay = restart_delay(child.delay, lived)
                child.due = now + child.delay
                log.warning(
                    "supervisor.child_died",
                    child=child.name,
                    code=code,
                    lived=round(lived, 1),
                    restart_in=child.delay,
                )
            if self.restart and not self.stopping and now >= child.due:
                try:
                    self._start(child)
                except OSError as exc:  # fork failed (memory, pids): try again later
                    child.delay = restart_delay(child.delay, 0.0)
                    child.due = now + child.delay
                    log.warning("supervisor.start_failed", child=child.name, error=str(exc))
                    continue
                alive += 1
        return alive


_PR_SET_PDEATHSIG = 1


def _child_main(target: Callable[[], None], parent: int) -> None:
    # The supervisor's handlers are not the child's: RQ installs its own for SIGTERM and
    # SIGINT in ``work()``; until then the default (die) is right.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # blocked by the fork in _start
    # A group of its own: a Ctrl-C in the terminal reaches the supervisor only, which
    # passes it on once. A second signal would be RQ's cold shutdown (the horse killed,
    # its loop lost to a lapsed lease instead of handed over).
    os.setpgid(0, 0)
    # And if the supervisor itself is killed, the child drains rather than runs on alone.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        return
    target()
