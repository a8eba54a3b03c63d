"""Every change of a loop's status, in one place.

A status change is four things that must not drift apart:

- the record: the status, and the fields that go with it, as the pure rules in
  ``bot/core/rules/lifecycle.py`` decide them, in one atomic update;
- the event the dashboard, the demo and the tests read (``loop_created``,
  ``loop_restarted``, ``back_to_coding``, ``loop_resumed``, ``handoff``, ``loop_started``,
  ``loop_finished``, ``loop_cancelled``, ``job_requeued``);
- the job the new status needs: queued -> the loop job, reviewing -> the critic,
  merging -> the merge gate;
- the issue's status comment, when the caller has a GitHub installation client: the
  state on top and the timeline of what the loop did, read from its events.

Callers pass the store they write through: the loop passes its lease-fenced store
(``bot.io.store.FencedStore``), so a worker that lost its lease changes nothing here,
not even a comment or an enqueue. This module sits below every job module (it imports
only ``bot.core`` and ``bot.io``), so any of them may use it without an import cycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, assert_never

from redis import Redis
from rq import get_current_job
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import JobStatus

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Reason, Status, approve
from bot.core.rules import lifecycle as rules
from bot.core.rules.lifecycle import Guard, Requeue
from bot.core.text import messages, sessionlog
from bot.io import queues
from bot.io.github.client import Installation, IssueInfo
from bot.io.logs import get_logger
from bot.io.queues import JobKind, enqueue_critic, enqueue_gate, enqueue_loop_job, fetch_job
from bot.io.store import FencedStore, LeaseLost, LoopKey, Store

log = get_logger("loopbot.lifecycle")

PENDING = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED)


_STAGE_JOB = {Status.REVIEWING: JobKind.CRITIC, Status.MERGING: JobKind.GATE}


class _MovedOn(Exception):
    """Raised inside an update to write nothing: the change no longer applies."""


# -- starting, and back to the queue -----------------------------------------------------------


def create(
    store: Store,
    loop: LoopId,
    *,
    installation_id: int,
    actor: str,
    max_turns: int,
    approved: IssueInfo | None = None,
) -> LoopRecord:
    """The issue's first loop: a new record, queued, and its job.

    ``approved``: the issue as ``actor``, a writer, approved it (frozen intake).
    """
    record = LoopRecord(
        repo=loop.repo,
        issue=loop.issue,
        installation_id=installation_id,
        branch=loop.branch,
        started_by=actor,
        max_turns=max_turns,
    )
    if approved is not None:
        approve(record, approved.title, approved.body, actor)
    queues.func_name(JobKind.LOOP)  # no job function to enqueue: fail before any write
    store.put(record)
    store.event(loop, "loop_created", actor=actor)
    store.clear_cancel(loop)
    enqueue_loop(store.redis, loop)
    return record


def requeue(
    store: Store,
    key: LoopKey,
    why: Requeue,
    *,
    note: str = "",
    by: str = "",
    also: Callable[[LoopRecord], None] | None = None,
    gh: Installation | None = None,
    tail: str = "",
) -> LoopRecord | None:
    """Send the loop (back) to the queue for coding turns, for ``why``; None (and nothing
    written) when it moved on meanwhile (``bot.core.rules.lifecycle.requeue_applies``).

    ``note`` is the first thing the agent's next prompt says; ``by`` is the person who
    restarted it, or the worker that hands it over; ``also`` sets what else comes with
    this change (a restart's new limits and approved text), in the same update.
    """

    if rules.needs_job(why):
        queues.func_name(JobKind.LOOP)  # no job function to enqueue: fail before any write

    def apply(r: LoopRecord) -> None:
        if not rules.requeue_applies(r.status, why):
            raise _MovedOn
        _apply(r, rules.requeue(r, why, note=note, actor=by))
        if also is not None:
            also(r)

    try:
        record = store.update(key, apply)
    except _MovedOn:
        return None
    kind, fields = _requeue_event(why, record, by)
    store.event(key, kind, **fields)
    if rules.clears_cancel(why):
        store.clear_cancel(key)
    if rules.needs_job(why):
        _fence(store)
        enqueue_loop(store.redis, record.id, replace=rules.replaces_job(why))
    if gh is not None:
        record = post_status(store, gh, record, tail)
    return record


def _requeue_event(why: Requeue, record: LoopRecord, by: str) -> tuple[str, dict[str, Any]]:
    match why:
        case Requeue.RESTART:
            return "loop_restarted", {"actor": by}
        case Requeue.FINDINGS | Requeue.CHECKS | Requeue.CONFLICTS:
            return "back_to_coding", {"reason": why.value}
        case Requeue.WORKER_LOST:
            return "loop_resumed", {"reason": "lease_lapsed", "attempt": record.auto_resumes}
        case Requeue.HANDOFF:
            return "handoff", {"worker": by}
        case Requeue.TAKE_OVER:
            return "loop_resumed", {"reason": "handoff"}
        case _:
            assert_never(why)


def running(store: Store, key: LoopKey, worker: str) -> LoopRecord:
    """``worker`` holds the loop's lease and prepares its turns."""
    record = store.update(key, lambda r: _apply(r, rules.running()))
    store.event(key, "loop_started", worker=worker)
    return record


# -- on to the critic or the gate --------------------------------------------------------------


def advance(
    store: Store,
    key: LoopKey,
    stage: Status,
    *,
    came_from: frozenset[Status],
    gh: Installation | None = None,
    tail: str = "",
    **fields: Any,
) -> LoopRecord | None:
    """On to the critic (``reviewing``) or the merge gate (``merging``), and its job;
    None (and nothing written) when the loop is no longer in ``came_from``.

    ``fields``: what else the caller records with it (the gate's reason to review again).
    """
    queues.func_name(_STAGE_JOB[stage])  # no job function to enqueue: fail before any write

    def apply(r: LoopRecord) -> None:
        changes = rules.advance(r.status, stage, came_from)
        if changes is None:
            raise _MovedOn
        _apply(r, changes | fields)

    try:
        record = store.update(key, apply)
    except _MovedOn:
        return None
    if gh is not None:
        record = post_status(store, gh, record, tail)
    _fence(store)
    enqueue_stage(store.redis, record)
    return record


def enqueue_stage(redis: Redis, record: LoopRecord) -> None:
    """Enqueue the job that a reviewing or merging loop waits for."""
    match record.status:
        case Status.REVIEWING:
            enqueue_critic(redis, record.repo, record.issue)
        case Status.MERGING:
            enqueue_gate(redis, record.repo, record.issue)
        case _:
            raise ValueError(f"a {record.status} loop waits for no critic or gate")


def revive(store: Store, key: LoopKey) -> LoopRecord:
    """A reviewing or merging loop whose job was lost gets it again, counted as a resume."""
    for kind in _STAGE_JOB.values():
        queues.func_name(kind)  # no job function to enqueue: fail before any write
    record = store.update(key, lambda r: _apply(r, rules.revive(r)))
    job = "critic" if record.status is Status.REVIEWING else "gate"
    store.event(key, "job_requeued", job=job)
    enqueue_stage(store.redis, record)
    return record


# -- ending --------------------------------------------------------------------------------------


def finish(
    store: Store,
    key: LoopKey,
    status: Status,
    reason: Reason,
    detail: str = "",
    *,
    guard: Guard = Guard.CANCEL_WINS,
    gh: Installation | None = None,
    tail: str = "",
    best_effort: bool = False,
    **fields: Any,
) -> LoopRecord | None:
    """End the loop with ``status`` for ``reason``; None (and nothing written) when
    ``guard`` says it moved on meanwhile (see ``bot.core.rules.lifecycle.Guard``).

    ``fields``: what else is recorded with the end (the merge commit). With ``gh`` the
    status comment is updated; ``best_effort``: a failure to do so is logged, not raised
    (GitHub may be what is failing; the record says it all already).
    """

    def apply(r: LoopRecord) -> None:
        changes = rules.finish(r, status, reason, detail, guard)
        if changes is None:
            raise _MovedOn
        _apply(r, changes | fields)

    try:
        record = store.update(key, apply)
    except _MovedOn:
        return None
    store.event(
        key,
        "loop_finished",
        status=record.status.value,
        reason=record.reason,
        detail=record.detail,
        turn=record.turn,
    )
    if gh is None:
        return record
    try:
        return post_status(store, gh, record, tail)
    except LeaseLost:
        raise
    except Exception as exc:
        if not best_effort:
            raise
        log.warning("lifecycle.comment_failed", loop=record.key, error=str(exc)[:300])
        return record


def cancel(redis: Redis, key: LoopKey, reason: Reason, actor: str) -> str:
    """Stop a loop within seconds: flag it, mark it, stop its job, drop it from the queue.

    The branch, worktree, conversation and findings are kept for ``/loop-restart``.
    Needs only Redis, so ``loopbot cancel`` works without GitHub credentials.
    """
    store = Store(redis)
    record = store.get(key)
    if record is None:
        return "no loop"
    if not record.active:
        return f"already {record.status.value}"
    store.request_cancel(key, reason.value)

    def apply(r: LoopRecord) -> None:
        changes = rules.cancel(r, reason, actor)
        if changes is None:
            raise _MovedOn
        _apply(r, changes)

    try:
        store.update(key, apply)
    except _MovedOn:
        ended = store.get(key)
        return f"already {ended.status.value if ended else 'gone'}"
    store.event(key, "loop_cancelled", reason=reason.value, actor=actor)
    _stop_job(store, record.id)
    return "cancelled"


def _stop_job(store: Store, loop: LoopId) -> None:
    try:
        job = fetch_job(loop.job_id, store.redis)
        status = job.get_status(refresh=True)
        if status == JobStatus.STARTED:
            send_stop_job_command(store.redis, loop.job_id)
            # The stopped work horse cannot release its lease; a restart must not wait
            # for it to lapse. A holder that is somehow still alive sees the cancel flag.
            store.force_release_lease(loop)
        elif status in PENDING:
            job.cancel()
    except (NoSuchJobError, InvalidJobOperation):
        pass


# -- the status comment --------------------------------------------------------------------------


def post_status(store: Store, gh: Installation, record: LoopRecord, tail: str = "") -> LoopRecord:
    """Edit the issue's one status comment to show ``record`` and the timeline of its
    events. The only writer of that comment: every status change and turn comes here.

    ``tail``: the last verify output, shown while the last verify failed.
    """
    _fence(store)
    timeline = sessionlog.timeline(
        _all_events(store, record.key), limit=messages.TIMELINE_LIMIT, redact=gh.redact
    )
    body = messages.status_comment(
        record, "" if record.last_verify.get("passed") else tail, timeline_lines=timeline
    )
    comment = gh.upsert_comment(
        record.repo, record.issue, "status", body, known_id=record.status_comment_id
    )
    if comment.id != record.status_comment_id:
        return store.set_fields(record.key, status_comment_id=comment.id)
    return record


EVENTS_PAGE = 1000


def _all_events(store: Store, key: LoopKey) -> list[dict[str, Any]]:
    """The loop's whole event stream, oldest first, page by page: one page from the start
    would miss the newest events of a long loop (each agent step is an event). The
    stream is capped (``bot.io.store.LOOP_EVENTS_MAXLEN``), and so is this."""
    found: list[dict[str, Any]] = []
    after = "-"
    while True:
        page = store.events(key, after=after, count=EVENTS_PAGE)
        found += page
        if len(page) < EVENTS_PAGE:
            return found
        after = page[-1]["id"]


# -- the loop job --------------------------------------------------------------------------------


def enqueue_loop(redis: Redis, loop: LoopId, *, replace: bool = False) -> None:
    """Enqueue the loop's one job. ``replace``: the old job's worker is known dead."""
    if not replace and job_pending(redis, loop.job_id):
        return
    with contextlib.suppress(NoSuchJobError):
        fetch_job(loop.job_id, redis).delete()  # finished, failed or dead: make room
    enqueue_loop_job(redis, loop)


def job_pending(redis: Redis, job_id: str) -> bool:
    """Whether the job waits in a queue or runs (the job asking does not count)."""
    try:
        job = fetch_job(job_id, redis)
    except NoSuchJobError:
        return False
    this = get_current_job()
    if this is not None and this.id == job_id:
        return False
    return job.get_status(refresh=True) in PENDING


# -- helpers -------------------------------------------------------------------------------------


def _apply(record: LoopRecord, changes: rules.Changes) -> None:
    for name, value in changes.items():
        setattr(record, name, value)


def _fence(store: Store) -> None:
    """A lease holder checks its lease before every write, GitHub and RQ included."""
    if isinstance(store, FencedStore):
        store.guard()
