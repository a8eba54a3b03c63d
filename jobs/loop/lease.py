"""The loop's Redis lease: held by one worker, renewed on a wall-clock timer, and known
lost within its TTL whatever the reason renewals fail."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

from bot.io.logs import get_logger
from bot.io.store import LeaseLost, Store
from jobs import status_comment
from jobs.tree.git import GIT_TIMEOUT

log = get_logger("loopbot.loop")


LEASE_TTL = 60.0


def silence_bound(step_timeout: float, stall_timeout: float, ttl: float) -> float:
    """How long the job that holds a lease may go without a single write before it is
    presumed stuck. Between two writes a loop runs at most a few steps each bounded by its
    own timeout (a sandboxed command's ``step_timeout``, git's 600 s and its lock's, a
    model call's ``stall_timeout``): three times the longest, and the lease's TTL."""
    return 3 * max(step_timeout, GIT_TIMEOUT, stall_timeout) + ttl


class Lease:
    """Holds the loop's lease and renews it every ``ttl / 3`` seconds on its own thread.

    Renewal does not depend on the agent producing output: a long model call or a slow
    verify keeps the lease; a dead process loses it within ``ttl``.

    The lease also counts itself lost once ``ttl`` has passed (monotonic clock) since the
    last renewal that succeeded, whatever the reason renewals failed (Redis unreachable, a
    network partition, a paused VM): by then Redis may have let another worker take it.
    ``check()`` raises ``LeaseLost`` then, and every write the loop makes calls it first.

    ``max_silence``: renewals alone do not prove the job alive. A job whose own thread is
    stuck (a wait with no deadline) would keep its lease for ever, renewed by this thread,
    and the reconciler would never resume the loop. So each ``check()`` by the thread that
    took the lease counts as progress; after ``max_silence`` seconds without one, the
    lease is given back and counted lost, and the reconciler resumes the loop elsewhere.
    """

    def __init__(
        self, store: Store, key: str, ttl: float = LEASE_TTL, max_silence: float | None = None
    ) -> None:
        self.store, self.key, self.ttl = store, key, ttl
        self.max_silence = max_silence
        self._holder: threading.Thread | None = None  # the job's thread (``acquire``)
        self._progress_at = time.monotonic()  # the holder's last ``check()``
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed_at = time.monotonic()  # when the last successful renewal was *sent*
        # A lost lease says what held the renewals up, Redis or this process: when the
        # renewal now waiting on Redis was sent (None: none is), when the last one ended,
        # and how much later than due the thread has woken since the last success.
        self._in_flight: float | None = None
        self._done_at = self._renewed_at
        self._late = 0.0
        self._failed = 0  # renewals that raised since the last success
        self._took = 0.0  # how long the last renewal took to answer
        self._why = ""

    def acquire(self) -> bool:
        sent = time.monotonic()
        if not self.store.take_lease(self.key, self.owner, self.ttl):
            return False
        # The thread's first wake-up is due ttl/3 from now, not from before a slow take.
        self._renewed_at, self._done_at = sent, time.monotonic()
        self._holder, self._progress_at = threading.current_thread(), sent
        self._thread = threading.Thread(target=self._renew, daemon=True, name="lease")
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            sent = time.monotonic()  # measured before the call: Redis' TTL starts later
            silent = sent - self._progress_at
            if self.max_silence is not None and silent > self.max_silence:
                try:  # at once, not a TTL later: the reconciler resumes the loop now
                    self.store.release_lease(self.key, self.owner)
                except Exception:  # noqa: BLE001 - the TTL frees it anyway
                    log.warning("lease.release_failed", loop=self.key)
                # Lost once given back, not before: whoever waits on ``lost`` finds the
                # lease free (the test of this saw it still held, in CI).
                self._mark_lost(f"the job wrote nothing for {silent:.0f}s: presumed stuck")
                return
            self._late = max(self._late, sent - self._done_at - self.ttl / 3)
            self._in_flight = sent
            renewed: bool | None = None  # None: the call failed
            try:
                renewed = bool(self.store.renew_lease(self.key, self.owner, self.ttl))
            except Exception:  # noqa: BLE001 - Redis blips: keep trying until the TTL says lost
                log.warning("lease.renew_failed", loop=self.key)
                self._failed += 1
            finally:
                self._answered(sent)
            if renewed:
                self._renewed_at, self._late, self._failed = sent, 0.0, 0
            elif renewed is False:
                # Released meanwhile (the key is gone by our own hand), or past the TTL
                # (the key expired while Redis or this process stalled): the clock says
                # why then. Only else did another worker take it.
                if not self._stop.is_set() and not self.is_lost():
                    self._mark_lost("another worker holds the lease")
                return
            elif self.is_lost():
                return

    def _answered(self, sent: float) -> None:
        """The renewal sent at ``sent`` is over. ``_done_at`` first: a reader on another
        thread never sees "none in flight" beside the end of the renewal before."""
        self._done_at = time.monotonic()
        self._took = self._done_at - sent
        self._in_flight = None

    def _mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            self._why = why
            self.lost.set()
            log.warning("lease.lost", loop=self.key, owner=self.owner, why=why)

    def is_lost(self) -> bool:
        now = time.monotonic()
        if not self.lost.is_set() and now - self._renewed_at >= self.ttl:
            self._mark_lost(f"no successful renewal for {self.ttl:g}s{self._stalled(now)}")
        return self.lost.is_set()

    def _stalled(self, now: float) -> str:
        """What held the renewals up, for the operator: this process (its renewal thread
        woke far later than due: a paused VM, a starved machine), a renewal not answered
        (most often Redis; a process paused while it waited looks the same), or renewals
        that failed (each logged as ``lease.renew_failed``)."""
        sent = self._in_flight
        late = (
            self._late if sent is not None else max(self._late, now - self._done_at - self.ttl / 3)
        )
        if self._thread is not None and late > max(1.0, self.ttl / 3):
            return f" (this process stalled: its renewals ran {late:.0f}s late)"
        if sent is not None:
            waited = max(0.0, now - sent)
            return f" (a renewal sent {waited:.0f}s ago is still unanswered: most likely Redis)"
        if self._took > self.ttl / 3:
            return f" (the last renewal took {self._took:.0f}s: most likely Redis)"
        if self._failed:
            return f" ({self._failed} renewals failed: Redis unreachable)"
        return ""

    def check(self) -> None:
        """Raise ``LeaseLost`` if this worker may no longer hold the lease: call before a write.

        Asks Redis who holds the lease (one GET); when Redis cannot answer, the clock since
        the last successful renewal decides. Called by the job's own thread, it is also the
        job's sign of progress (``max_silence``).
        """
        if threading.current_thread() is self._holder:
            self._progress_at = time.monotonic()
        if not self.is_lost():
            try:
                holder: str | None = self.store.lease_holder(self.key)
            except Exception:  # noqa: BLE001 - Redis unreachable: is_lost() above decides
                holder = self.owner
            if holder != self.owner:
                self._mark_lost("another worker holds the lease" if holder else "it expired")
        if self.lost.is_set():
            raise LeaseLost(f"{self.key}: {self._why}")

    def release(self) -> None:
        status_comment.flush()  # its status edits go out while it still holds the lease
        self._stop.set()
        try:
            self.store.release_lease(self.key, self.owner)
        except Exception:  # noqa: BLE001 - the TTL frees it anyway
            log.warning("lease.release_failed", loop=self.key)
