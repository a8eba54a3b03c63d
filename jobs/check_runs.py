"""A loop job's check run ("loopbot") on each head it pushes, written beside the turns.

A turn's push moves the pull request's head, and the new head gets its own check run,
``in_progress``. With many loops in one installation that write waits in GitHub's line
(bot/io/github/pace.py) for as long as the line is: a turn used to wait there too. Now
such an update is handed to a thread of the job and the turn goes on. While it waits,
a newer update replaces it (the latest state wins; a head pushed over before its check
run was written needs none). What the loop ends on, and what a reviewer or the gate
reads (a ``completed`` conclusion), is sent at once, after what was handed over: so no
update lands out of order, and a check run is never made twice for one head.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bot.io.github import tally
from bot.io.github.client import Installation
from bot.io.logs import get_logger
from bot.io.store import LeaseLost

log = get_logger("loopbot.checks")

IDLE = 10.0  # seconds the thread waits for an update before it ends


@dataclass(frozen=True)
class Update:
    """One write of the check run named ``name`` on ``head_sha``."""

    head_sha: str
    status: str
    title: str
    summary: str
    conclusion: str | None = None
    new_head: bool = False  # just pushed: no check run of ours can be there yet
    # Seconds the update waits for a newer one before it takes its place in line: an
    # ``in_progress`` whose completion follows within seconds (a verified head's pull
    # request, a short review) is then never written, the completion alone is (issue 43).
    hold: float = 0.0
    annotations: tuple[dict[str, Any], ...] = ()
    text: str | None = None
    # The job's phase that asked for it (a turn, the pull request...): its write counts
    # there, whenever the thread sends it (bot/io/github/tally.py).
    phase: str = field(default_factory=tally.phase)


class CheckRuns:
    """The check runs of one loop job: their ids by head, and the update waiting."""

    def __init__(
        self, gh: Installation, repo: str, name: str, fence: Callable[[], None], loop: str
    ) -> None:
        self._gh, self._repo, self._name, self._fence = gh, repo, name, fence
        self._log = log.bind(loop=loop)
        self._ids: dict[str, int] = {}  # head sha -> our check run there
        self._pending: Update | None = None
        self._due = 0.0  # when the update waiting may take its place in line (``hold``)
        self._failed: Update | None = None  # the last update handed over, if it failed
        self._writing = False  # the thread is sending one (not: waiting for its slot)
        self._urgent = False  # a flush waits: nothing is held
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, update: Update) -> None:
        """Hand ``update`` to the job's thread and return: it replaces one still waiting."""
        with self._cond:
            self._pending, self._failed = _newest(self._pending, update), None
            self._due = time.monotonic() + update.hold
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="loopbot-check-runs"
                )
                self._thread.start()
            self._cond.notify_all()

    def send(self, update: Update) -> None:
        """Write ``update`` now; GitHub's errors raise here. An update still waiting for
        its slot is dropped (this one is newer); one being written is waited for."""
        with self._cond:
            update = _newest(self._pending, update)
            self._pending = None
            while self._writing:
                self._cond.wait()
            # After the wait: the write in flight may have failed meanwhile, and would be
            # sent again over this one at the job's end (red team).
            self._failed = None
        self._write(update)

    def discard(self, head_sha: str) -> bool:
        """Drop the update waiting for ``head_sha``. True when this job has no check run
        on that head (none made, none being made, none whose answer was lost), so there
        is none to complete; False when there may be one."""
        with self._cond:
            while self._writing:
                self._cond.wait()
            if self._failed is not None and self._failed.head_sha == head_sha:
                return False  # GitHub may have made it though its answer was lost
            if head_sha in self._ids:
                return False
            if self._pending is not None and self._pending.head_sha == head_sha:
                self._pending = None
            return True

    def flush(self, timeout: float = 300.0) -> bool:
        """Wait until the update handed over is written (or failed); then write a failed
        one once more (logged if it fails again). False when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._urgent = True  # an update held for a newer one goes now
            self._cond.notify_all()
            while self._pending is not None or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._log.warning("checks.flush_timed_out", timeout=timeout)
                    self._urgent = False
                    return False
                self._cond.wait(left)
            failed, self._failed = self._failed, None
            self._urgent = False
        if failed is not None:
            try:
                self._write(failed)
            except LeaseLost:
                pass
            except Exception as exc:  # noqa: BLE001 - logged; the loop's next write says more
                self._log.warning("checks.update_lost", error=str(exc)[:300])
        return True

    def _held_back(self) -> bool:
        """The update waiting is still held for a newer one (``Update.hold``)."""
        return self._due > time.monotonic() and not self._urgent

    def _run(self) -> None:
        pace = self._gh.pace
        while True:
            with self._cond:
                while self._pending is None or (
                    (left := self._due - time.monotonic()) > 0 and not self._urgent
                ):
                    if self._pending is not None:  # held: a newer update may replace it
                        self._cond.wait(left)
                        continue
                    # Idle a while: the thread ends (the next update starts another).
                    if not self._cond.wait(IDLE) and self._pending is None:
                        self._thread = None
                        return
            update: Update | None = None
            try:
                # The write slot first, then the newest update: the one that came while
                # this waited is what goes (``send`` may have taken it: then none).
                with pace.ahead() if pace is not None else contextlib.nullcontext():
                    with self._cond:
                        update = self._pending
                        if update is not None and self._held_back():
                            # It came (replacing the one that joined the line) while this
                            # waited, and is held for its completion: the slot goes
                            # unused, a write is saved (a fleet's line is long).
                            update = None
                        else:
                            self._pending = None
                        self._writing = update is not None
                    if update is not None:
                        self._write(update)
            except LeaseLost:
                self._log.info("checks.update_dropped", why="lease lost")
                with self._cond:
                    self._pending = None  # nothing more of this job's goes out
            except Exception as exc:  # noqa: BLE001 - kept: a newer update, or the flush, retries
                self._log.warning("checks.update_failed", error=str(exc)[:300])
                with self._cond:
                    if update is None:  # no slot came (a long pause): the one waiting failed
                        update, self._pending = self._pending, None
                    if self._pending is None and update is not None:
                        # Sent again at the job's end, searching first: GitHub may have
                        # made the run though its answer was lost (red team).
                        self._failed = replace(update, new_head=False)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, update: Update) -> None:
        pace = self._gh.pace
        # The lease here, so one already lost raises LeaseLost itself (inside a request
        # githubkit wraps it); then again right before the request is sent, after the
        # pace's waits: an update may go long after it was asked for.
        self._fence()
        with (
            pace.guarded(self._fence) if pace is not None else contextlib.nullcontext(),
            tally.as_phase(update.phase),
        ):
            run = self._gh.upsert_check_run(
                self._repo,
                self._name,
                update.head_sha,
                status=update.status,
                conclusion=update.conclusion,
                title=update.title,
                summary=update.summary,
                known_id=self._ids.get(update.head_sha),
                new_head=update.new_head and update.head_sha not in self._ids,
                annotations=list(update.annotations) or None,
                text=update.text,
            )
        self._ids[update.head_sha] = run.id


def _newest(waiting: Update | None, update: Update) -> Update:
    """``update`` in place of ``waiting``: on the same head, it makes the check run if
    ``waiting`` was to (a head just pushed has none yet)."""
    if waiting is not None and waiting.head_sha == update.head_sha and waiting.new_head:
        return replace(update, new_head=True)
    return update
