"""The issue's one status comment: the loop's state on top, then the timeline of what
happened, kept event by event (``bot.core.text.timeline.Timeline``) so an update reads
and redacts only what happened since the last one."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from bot.core.record import LoopRecord
from bot.core.text import messages
from bot.core.text.timeline import Timeline
from bot.io.github import tally
from bot.io.github.client import Installation
from bot.io.logs import get_logger
from bot.io.store import FencedStore, LeaseLost, LoopKey, Store

log = get_logger("loopbot.status")


def post_status(
    store: Store,
    gh: Installation,
    record: LoopRecord,
    tail: str = "",
    *,
    now: bool = False,
    hold: float | None = None,
    quiet: bool = False,
) -> LoopRecord:
    """Edit the issue's one status comment to show ``record`` and the timeline of its
    events. The only writer of that comment: every status change and turn comes here.

    ``tail``: the last verify output, shown while the last verify failed.

    Inside a job (``publishing``), an edit (or the comment's creation) is handed to this
    process's publisher and the loop goes on: the edit waits for its slot in the
    installation's pace there, and a newer one for the same comment replaces it while it
    waits (the latest state wins). The job's end waits until its edits are sent.
    ``now``: sent before this returns (raising as it fails), superseding any edit of the
    comment still waiting: a loop's last state, another loop's place in line.
    ``hold``: seconds the edit waits for a newer one (``HOLD`` unless said): a state
    that is about to be followed by the one a maintainer acts on (verify passed, the
    pull request opens next) waits longer, so one edit shows both.
    ``quiet``: a step inside a sequence whose end the next job in line shows anyway (a
    clean catch-up with the base branch: merged in, verified, the approval carried, then
    merged): sent only if its hold runs out inside the job; dropped, not flushed, when
    the job ends (issue 43: each such edit is a second of the installation's pace).
    Outside a job (no publisher) both are sent at once, as any edit.
    """
    _fence(store)
    publisher = _PUBLISHER if _ACTIVE else None
    # The comment's creation is held too: a loop's first seconds (its start, then its
    # first turn's) are one write, not two.
    if publisher is not None and not now:
        # A comment not made yet is never a quiet step: it would never be made.
        quiet = quiet and record.status_comment_id is not None
        if hold is None:
            hold = QUIET_HOLD if quiet else HOLD
        publisher.submit(_Edit(store, gh, record, tail, hold, quiet))
        return record
    if publisher is not None:
        publisher.discard(record.key)
        # The comment the thread may have made meanwhile (its held creation): edited,
        # not made again.
        if record.status_comment_id is None and (made := store.get(record.key)) is not None:
            record = record.model_copy(update={"status_comment_id": made.status_comment_id})
    return _send(store, gh, record, tail)


def _send(store: Store, gh: Installation, record: LoopRecord, tail: str) -> LoopRecord:
    timeline = _timeline(store, record.key, gh.redact).render(messages.TIMELINE_LIMIT)
    body = messages.status_comment(
        record, "" if record.last_verify.get("passed") else tail, timeline_lines=timeline
    )
    # Never two edits with the same text: a state change a maintainer cannot see (a
    # phase inside a job) costs no write, which a fleet waits a second for (issue 43).
    digest = hashlib.sha256(body.encode()).hexdigest()
    if record.status_comment_id is not None and store.status_sent(record.key) == (
        f"{record.status_comment_id} {digest}"
    ):
        return record
    # The lease again, right before each request is sent (after the pace's waits): an
    # edit may go long after it was asked for.
    guard = gh.pace.guarded(lambda: _fence(store)) if gh.pace else contextlib.nullcontext()
    with guard:
        comment = gh.upsert_comment(
            record.repo, record.issue, "status", body, known_id=record.status_comment_id
        )
    store.save_status_sent(record.key, f"{comment.id} {digest}")
    if comment.id != record.status_comment_id:
        return store.set_fields(record.key, status_comment_id=comment.id)
    return record


@dataclass
class _Edit:
    store: Store
    gh: Installation
    record: LoopRecord
    tail: str
    hold: float = 0.0
    quiet: bool = False
    # The job's phase that asked for it: the edit counts there when the thread sends it
    # (the newest of a burst: the state it shows).
    phase: str = field(default_factory=tally.phase)

    @property
    def key(self) -> LoopKey:
        return self.record.key


class Publisher:
    """This process's status-comment edits, sent one at a time by a thread.

    An edit waits for its slot in the installation's pace as a yielding write: the loops'
    own writes go first (``SharedPace.before``). While it waits, newer edits of the same
    comment are merged into it; when its slot comes, it is built from the newest of them
    and from what the loop's store says then, so one write carries the latest state.
    """

    def __init__(self) -> None:
        self._pending: OrderedDict[LoopKey, _Edit] = OrderedDict()
        self._due: dict[LoopKey, float] = {}  # when a loop's pending edit may go (HOLD)
        self._failed: dict[LoopKey, _Edit] = {}  # the last edit of a loop, if it failed
        self._busy = False
        self._sending: LoopKey | None = None  # the loop whose edit the thread sends now
        self._urgent = threading.Event()  # a flush is waiting: edits stop giving way
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def discard(self, key: LoopKey, timeout: float = 60.0) -> None:
        """Drop the edits of ``key`` still waiting (one sent at once supersedes them), and
        wait for one of them on its way: sent after it, the edit sent at once could be
        overwritten by an older state, or (the comment's held creation) make a second
        comment (red team, issue 43)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._pending.pop(key, None)
            self._due.pop(key, None)
            self._failed.pop(key, None)
            while self._sending == key and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    def submit(self, edit: _Edit) -> None:
        with self._cond:
            self._failed.pop(edit.key, None)
            older = self._pending.pop(edit.key, None)
            if older is not None and not older.quiet and edit.quiet:
                # Replaced by a newer state, but what was waiting was not a quiet step:
                # the edit stays one to send (the newest state, at the job's end too).
                edit = replace(edit, quiet=False)
            self._pending[edit.key] = edit
            # The first edit of a burst waits its hold for the rest: one write carries
            # them. A later edit may bring that forward (its hold is shorter), never back.
            due = time.monotonic() + edit.hold
            self._due[edit.key] = min(self._due.get(edit.key, due), due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="loopbot-status-publisher"
                )
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._pending:
                        self._busy = False
                        self._cond.notify_all()
                        self._cond.wait()
                        continue
                    key = min(self._pending, key=lambda k: self._due.get(k, 0.0))
                    left = self._due.get(key, 0.0) - time.monotonic()
                    if left <= 0 or self._urgent.is_set():
                        break
                    self._cond.wait(left)  # held: newer edits of it merge meanwhile
                edit = self._pending.pop(key)
                self._due.pop(key, None)
                self._busy = True
                self._sending = key
            try:
                self._send(edit)
            except LeaseLost:
                log.info("status.edit_dropped", loop=key, why="lease lost")
            except Exception as exc:  # noqa: BLE001 - kept: a newer edit, or the flush, retries
                log.warning("status.edit_failed", loop=key, error=str(exc)[:300])
                with self._cond:
                    if key not in self._pending:
                        self._failed[key] = edit
            finally:
                with self._cond:
                    self._sending = None
                    self._cond.notify_all()

    def _send(self, edit: _Edit) -> None:
        pace = edit.gh.pace
        # Giving way until someone waits for the edits (a job's end, a lease given back).
        with (
            pace.ahead(yielding=lambda: not self._urgent.is_set())
            if pace is not None
            else contextlib.nullcontext()
        ):
            with self._cond:  # edits submitted while this one waited: the newest wins
                newer = self._pending.pop(edit.key, None)
                if newer is not None:
                    if newer.record.status_comment_id == edit.record.status_comment_id:
                        edit = newer
                    else:  # another comment (made again meanwhile): its own turn
                        self._pending[newer.key] = newer
            _fence(edit.store)
            record = edit.store.get(edit.key)
            if record is None or record.status_comment_id != edit.record.status_comment_id:
                record = edit.record
            with tally.as_phase(edit.phase):
                _send(edit.store, edit.gh, record, edit.tail)

    def flush(self, timeout: float) -> bool:
        """Wait until every edit submitted is sent (or failed); False on a timeout."""
        deadline = time.monotonic() + timeout
        self._urgent.set()
        try:
            with self._cond:
                # A quiet step is not sent at the job's end: the next job shows its end.
                for key in [k for k, e in self._pending.items() if e.quiet]:
                    self._pending.pop(key)
                    self._due.pop(key, None)
                    log.info("status.quiet_edit_dropped", loop=key)
                self._cond.notify_all()  # an edit held for a newer one goes now
                while self._pending or self._busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                failed, self._failed = self._failed, {}
            for key, edit in failed.items():  # once more, in line: the state it lost
                try:
                    self._send(edit)
                except Exception as exc:  # noqa: BLE001 - logged; the next job posts again
                    log.warning("status.edit_lost", loop=key, error=str(exc)[:300])
            return True
        finally:
            self._urgent.clear()


# Seconds the first of a burst of edits waits for the rest (a turn's outcome, then its
# pull request; a verdict, then the merge): one edit shows them all, a few seconds late.
HOLD = 5.0
# A quiet step's hold: a catch-up's merge, verify and hand-over take seconds; one that
# takes longer than this shows where it is.
QUIET_HOLD = 60.0

_PUBLISHER: Publisher | None = None
_ACTIVE = 0  # jobs running in this process inside ``publishing``


def flush(timeout: float = 300.0) -> None:
    """Wait (up to ``timeout``) until this process's status edits are sent: a loop does
    so before it gives its lease back, since an edit sent after that is fenced off."""
    if _PUBLISHER is not None and not _PUBLISHER.flush(timeout):
        log.warning("status.flush_timed_out", timeout=timeout)


@contextlib.contextmanager
def publishing(timeout: float = 300.0) -> Iterator[None]:
    """For the body (a job), status edits go through this process's publisher; at its
    end, wait (up to ``timeout``) until they are sent."""
    global _PUBLISHER, _ACTIVE
    if _PUBLISHER is None:
        _PUBLISHER = Publisher()
    _ACTIVE += 1
    try:
        yield
    finally:
        _ACTIVE -= 1
        if not _PUBLISHER.flush(timeout):
            log.warning("status.flush_timed_out", timeout=timeout)


EVENTS_PAGE = 1000


# The timelines this process built last, by loop, with their token: an update then reads
# only the token and the events written since. Any process's saved state is consistent
# (its lines with the event they reach), so a copy held here stays right when another
# process updated the comment meanwhile: the events it added are read again, after ours.
# A token that differs (Redis lost the state, or it was built again) drops the copy.
_TIMELINES: OrderedDict[LoopKey, tuple[str, Timeline]] = OrderedDict()
_TIMELINES_HELD = 64
_TIMELINES_LOCK = threading.Lock()


def _timeline(store: Store, key: LoopKey, redact: Callable[[str], str]) -> Timeline:
    """The loop's timeline brought up to date with the events written since it was last
    built (read page by page, redacted as they are added) and saved: the work of a status
    update is what happened since the last one, however long the loop has run."""
    with _TIMELINES_LOCK:
        held = _TIMELINES.pop(key, None)
    built: Timeline | None = None
    if held is not None and store.timeline_token(key) == held[0]:
        token, built = held
    else:
        saved = store.timeline_state(key)
        if saved is not None:
            token, built = saved[0], Timeline.from_json(saved[1])
    if built is None:
        token, built = uuid.uuid4().hex, Timeline()
    while True:
        page = store.events(key, after=built.last_id, count=EVENTS_PAGE)
        built.add(page, redact)
        if len(page) < EVENTS_PAGE:
            break
    store.save_timeline_state(key, token, built.to_json())
    with _TIMELINES_LOCK:
        _TIMELINES[key] = (token, built)
        while len(_TIMELINES) > _TIMELINES_HELD:
            _TIMELINES.popitem(last=False)
    return built


def _fence(store: Store) -> None:
    """A lease holder checks its lease before every write, GitHub and RQ included."""
    if isinstance(store, FencedStore):
        store.guard()
