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
  state on top and the timeline of what the loop did, read from its events; and while
  the loop waits for people (the gate's ``awaiting_approval``), the same words on the
  check run of its head, taken back when the wait ends (``post_status``).

And the pace (``bot/core/rules/pace.py``, ``bot/io/pace.py``): a loop asking to start
(``create``, a restart's ``requeue`` with ``pacing``) takes a slot and gets its job, or
waits in line, ``queued``, its job not enqueued, its place on the issue (events
``waiting`` and ``admitted``). Every end (``finish``, ``cancel``) gives the slot to the
next in line; the reconciler runs ``keep_pace`` on each pass, so a crash between the
two strands nobody.

Callers pass the store they write through: the loop passes its lease-fenced store
(``bot.io.store.FencedStore``), so a worker that lost its lease changes nothing here,
not even a comment or an enqueue. This module sits below every job module (it imports
only ``bot.core`` and ``bot.io``), so any of them may use it without an import cycle.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, assert_never

from redis import Redis
from rq import get_current_job
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import JobStatus

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Reason, Status, Waiting, approve, people_wait
from bot.core.rules import lifecycle as rules
from bot.core.rules import pace as pace_rules
from bot.core.rules.lifecycle import Guard, Requeue
from bot.core.rules.pace import Place, Waiter
from bot.core.text import messages
from bot.io import queues
from bot.io.github.client import GitHubApp, Installation
from bot.io.github.failures import GitHubError
from bot.io.github.issues import IssueInfo
from bot.io.logs import get_logger
from bot.io.pace import Outcome, Pace
from bot.io.queues import (
    JobKind,
    enqueue_critic,
    enqueue_gate,
    enqueue_loop_job,
    fetch_job,
    kind_of,
    loop_queue,
)
from bot.io.store import LeaseLost, LoopKey, Store
from jobs import merge_slot
from jobs.status_comment import _fence
from jobs.status_comment import post_status as _post_comment

log = get_logger("loopbot.lifecycle")

PENDING = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED)


_STAGE_JOB = {Status.REVIEWING: JobKind.CRITIC, Status.MERGING: JobKind.GATE}


class _MovedOn(Exception):
    """Raised inside an update to write nothing: the change no longer applies."""


# -- starting, and back to the queue -----------------------------------------------------------


@dataclass(frozen=True)
class Pacing:
    """What the line (``bot/core/rules/pace.py``) needs of a loop that asks to start."""

    priority: bool  # its issue carries the priority label (labels.priority)
    max_parallel: int | None  # its repository's loop.yml now; None: as last known
    operator_max: int  # LOOPBOT_MAX_PARALLEL
    gh: Installation | None = None  # to say on the issue that it waits, and where


def create(
    store: Store,
    loop: LoopId,
    *,
    installation_id: int,
    actor: str,
    max_turns: int,
    approved: IssueInfo | None = None,
    pacing: Pacing | None = None,
    kind: str = "code",
    also: Callable[[LoopRecord], None] | None = None,
) -> LoopRecord:
    """The issue's first loop: a new record, queued, and its job.

    ``approved``: the issue as ``actor``, a writer, approved it (frozen intake).
    ``pacing``: the job waits for a slot (``Pacing``); None enqueues it at once.
    ``kind``: "code" (the ready label) or "metric" (the optimize label: jobs/loop/metric.py).
    ``also``: what else the new record holds (a scheduled run's approving commit), set
    before it is written, so its job never reads it without.
    """
    record = LoopRecord(
        repo=loop.repo,
        issue=loop.issue,
        installation_id=installation_id,
        branch=loop.branch,
        started_by=actor,
        max_turns=max_turns,
        kind=kind,
    )
    if approved is not None:
        approve(record, approved.title, approved.body, actor, approved.labels)
    if also is not None:
        also(record)
    queues.func_name(JobKind.LOOP)  # no job function to enqueue: fail before any write
    store.put(record)
    store.event(loop, "loop_created", actor=actor)
    store.clear_cancel(loop)
    if pacing is None:
        enqueue_loop(store.redis, loop)
        return record
    return _start(store, record, pacing)


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
    pacing: Pacing | None = None,
) -> LoopRecord | None:
    """Send the loop (back) to the queue for coding turns, for ``why``; None (and nothing
    written) when it moved on meanwhile (``bot.core.rules.lifecycle.requeue_applies``).

    ``note`` is the first thing the agent's next prompt says; ``by`` is the person who
    restarted it, or the worker that hands it over; ``also`` sets what else comes with
    this change (a restart's new limits and approved text), in the same update.
    ``pacing``: a loop without a slot (a restart of an ended loop) waits for one.
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
        if pacing is not None:
            record = _start(store, record, pacing, replace=rules.replaces_job(why))
        else:
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
        case Requeue.POST_ACTION:
            return "post_action_queued", {"base": record.post_action.get("base", "")}
        case Requeue.DISMISSED:
            return "loop_resumed", {"reason": "dismissed", "actor": by}
        case _:
            assert_never(why)


def running(store: Store, key: LoopKey, worker: str) -> LoopRecord:
    """``worker`` holds the loop's lease and prepares its turns."""
    record = store.update(key, lambda r: _apply(r, rules.running()))
    store.event(key, "loop_started", worker=worker)
    return record


def hold_for_spend(
    store: Store, key: LoopKey, words: str, need_usd: float, *, gh: Installation | None = None
) -> LoopRecord | None:
    """A loop that would start finds a spend cap full (``words`` name it): it waits,
    queued, its slot given to the next in line, the cap said on the issue; None (and
    nothing written) when it moved on meanwhile. ``/loop-restart`` starts it again."""

    def apply(r: LoopRecord) -> None:
        changes = rules.held_for_spend(r.status, words, need_usd)
        if changes is None:
            raise _MovedOn
        _apply(r, changes)

    try:
        record = store.update(key, apply)
    except _MovedOn:
        return None
    store.event(key, "spend_held", detail=words)
    release(store, key, gh.app if gh is not None else None)
    if gh is not None:
        record = post_status(store, gh, record, now=True)
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
    quiet: bool = False,
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
        record = post_status(store, gh, record, tail, quiet=quiet)
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


def pending_stage_jobs(redis: Redis) -> set[tuple[JobKind, str, int]]:
    """(kind, repo, issue) of every critic and gate job queued, running, scheduled
    (the gate's timer, an RQ retry) or deferred on the loop queue."""
    queue = loop_queue(redis)
    ids = set(queue.get_job_ids())
    # The queue's own registries, which read and write loopbot's JSON jobs: reading one
    # cleans it up, and the clean-up saves an abandoned job again to retry it. A registry
    # built bare would do that with pickle, and the RQ scheduler dies on what it wrote
    # (found by bench/chaos.py; tests/io/test_abandoned_jobs.py).
    registries = (
        queue.started_job_registry,
        queue.scheduled_job_registry,
        queue.deferred_job_registry,
    )
    for registry in registries:
        ids.update(registry.get_job_ids())
    found: set[tuple[JobKind, str, int]] = set()
    for job_id in ids:
        try:
            job = fetch_job(job_id, redis)
            name, args = job.func_name, job.args
        except Exception:  # noqa: BLE001 - gone meanwhile, or not ours: not a pending job
            continue
        kind = kind_of(name)
        if kind in (JobKind.CRITIC, JobKind.GATE) and len(args) == 2:
            found.add((kind, str(args[0]), int(args[1])))
    return found


def stage_job_pending(redis: Redis, record: LoopRecord) -> bool:
    """Whether a reviewing loop's critic job, or a merging loop's gate job, is queued,
    scheduled or running."""
    return (_STAGE_JOB[record.status], record.repo, record.issue) in pending_stage_jobs(redis)


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
    release(store, key, gh.app if gh is not None else None)  # its slot, to the next
    if gh is None:
        return record
    try:
        # At once, not through the job's publisher: the loop's last state must reach the
        # comment or fail this job as before (a publisher's failure is only logged).
        return post_status(store, gh, record, tail, now=True)
    except LeaseLost:
        raise
    except Exception as exc:
        if not best_effort:
            raise
        log.warning("lifecycle.comment_failed", loop=record.key, error=str(exc)[:300])
        return record


def cancel(
    redis: Redis, key: LoopKey, reason: Reason, actor: str, *, gh: Installation | None = None
) -> str:
    """Stop a loop within seconds: flag it, mark it, stop its job, drop it from the queue.

    The branch, worktree, conversation and findings are kept for ``/loop-restart``.
    Needs only Redis, so ``loopbot cancel`` works without GitHub credentials; with
    ``gh``, the loops its slot lets in say so on their issues at once (else the
    reconciler's next pass does).
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
    release(store, key, gh.app if gh is not None else None)  # its slot or place in line
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


# -- the pace: slots and the line -----------------------------------------------------------------


def _start(
    store: Store, record: LoopRecord, pacing: Pacing, *, replace: bool = False
) -> LoopRecord:
    """Take a slot and enqueue the loop's job, or wait in line and say so on the issue."""
    outcome = Pace(store.redis).enter(
        record.key,
        record.repo,
        priority=pacing.priority,
        since=time.time(),
        max_parallel=pacing.max_parallel,
        operator=pacing.operator_max,
    )
    if outcome.held:  # a restart of a loop that never gave its slot back (a dead worker)
        enqueue_loop(store.redis, record.id, replace=replace)
        return record
    place = outcome.places.get(record.key)
    if place is not None:
        record = store.update(record.key, lambda r: _apply(r, pace_rules.waiting(place)))
        store.event(
            record.key,
            "waiting",
            place=place.place,
            running=place.running,
            cap=place.cap,
            scope=place.scope.value,
            priority=place.priority,
        )
    _settle(store, outcome, pacing.gh.app if pacing.gh is not None else None)
    return store.get(record.key) or record


def release(store: Store, key: LoopKey, app: GitHubApp | None = None) -> None:
    """``key`` ended: its slot (or its place in line) goes to the next loop in line.

    Never raises: the loop has ended whatever happens here, and the reconciler's next
    pass (``keep_pace``) admits whoever this could not.
    """
    try:
        _settle(store, Pace(store.redis).release(str(key)), app)
    except Exception:  # see above: the reconciler repairs it
        log.exception("lifecycle.pace_failed", loop=str(key))
    try:  # the repository's merge slot too, if it held it: the gates waiting for it run
        merge_slot.release(store.redis, LoopId.parse(str(key)))
    except Exception:  # the slot lapses on its own (merge_slot.SLOT_SECONDS)
        log.exception("lifecycle.merge_slot_failed", loop=str(key))


def keep_pace(
    store: Store,
    app: GitHubApp | None,
    *,
    operator_max: int,
    shown_waiting: Iterable[str] = (),
) -> Outcome:
    """The reconciler's pass: admit whoever may start (after a crash between an end and
    its admissions, or a raised ``LOOPBOT_MAX_PARALLEL``), and record each waiting loop's
    place (on its issue too, with ``app``; else ``show_waiting`` posts it).

    ``shown_waiting``: the loops whose records say they wait; one that holds a slot
    (a slower process showed its old place after it was admitted) stops saying so.
    """
    outcome = Pace(store.redis).admit(operator=operator_max)
    _settle(store, outcome, app)
    for key in shown_waiting:
        if key in outcome.slots:
            with contextlib.suppress(_MovedOn, KeyError):
                store.update(key, _unwait)
    return outcome


def _unwait(r: LoopRecord) -> None:
    if r.status is not Status.QUEUED or r.waiting is None:
        raise _MovedOn
    _apply(r, pace_rules.admitted())


def rejoin(store: Store, record: LoopRecord, pacing: Pacing) -> LoopRecord:
    """A queued loop that neither holds a slot nor waits in line (a crash between its
    record and its place, or a loop queued before loopbot had a pace) asks again."""
    return _start(store, record, pacing)


def show_waiting(store: Store, app: GitHubApp) -> int:
    """Post the status comment of every waiting loop whose issue does not show its place
    yet (placed by a process without GitHub: ``loopbot cancel``, a merge); the number
    posted. Stops at the first failure: GitHub is likely down, and the next pass tries
    again."""
    comments = _Comments(Store(store.redis), app)
    posted = 0
    for key in sorted(Pace(store.redis).state().line):
        record = comments.store.get(key)
        if record is None or record.status is not Status.QUEUED or record.waiting is None:
            continue
        if not record.waiting.posted:
            if not comments.post_waiting(record):
                break
            posted += 1
    return posted


class _Comments:
    """The status comments of loops in line, best effort: after one failure no more are
    tried in this pass (GitHub is likely down; each try would wait out its retries), and
    the reconciler's next pass posts what is left (``show_waiting``)."""

    def __init__(self, store: Store, app: GitHubApp | None) -> None:
        self.store, self.app = store, app

    def post(self, record: LoopRecord) -> LoopRecord | None:
        if self.app is None:
            return None
        try:
            # At once: ``post_waiting`` marks the place posted when this returns.
            return post_status(
                self.store, self.app.installation(record.installation_id), record, now=True
            )
        except Exception as exc:  # noqa: BLE001 - see above
            log.warning("lifecycle.comment_failed", loop=record.key, error=str(exc)[:300])
            self.app = None
            return None

    def post_waiting(self, record: LoopRecord) -> bool:
        """Post a waiting loop's place, and note that its issue shows it."""
        shown = record.waiting
        if self.post(record) is None:
            return False

        def mark(r: LoopRecord) -> None:
            if shown is not None and r.waiting == shown:
                r.waiting = shown.model_copy(update={"posted": True})

        with contextlib.suppress(KeyError):
            self.store.update(record.key, mark)
        return True


def _settle(store: Store, outcome: Outcome, app: GitHubApp | None) -> None:
    """Act on what the line decided: the admitted loops get their jobs, and each waiting
    loop whose place changed is told (only those: GitHub writes stay bounded, and places
    past ``PLACES_SHOWN`` do not change what is shown). Another process's loops are
    written through a plain store: a lease holder's fence is about its own loop."""
    comments = _Comments(Store(store.redis), app)
    for w in outcome.admitted:
        _admit(comments, w)
    for key, place in sorted(outcome.places.items(), key=lambda kv: kv[1].place):
        _move(comments, key, place)


def _admit(comments: _Comments, w: Waiter) -> None:
    store = comments.store
    was: list[Waiting | None] = []

    def apply(r: LoopRecord) -> None:
        if r.status is not Status.QUEUED:
            raise _MovedOn
        was.append(r.waiting)
        _apply(r, pace_rules.admitted())

    try:
        record = store.update(w.key, apply)
    except (_MovedOn, KeyError):
        return  # it ended meanwhile: its end gives the slot back (or the reconciler does)
    store.event(
        w.key, "admitted", priority=w.priority, waited=round(max(0.0, time.time() - w.since), 3)
    )
    enqueue_loop(store.redis, record.id)
    if was and was[0] is not None:  # its issue said it was waiting; its job says more soon
        comments.post(record)


def _move(comments: _Comments, key: str, place: Place) -> None:
    """Show a waiting loop's new place: in its record at once, on its issue when GitHub
    is at hand (else ``show_waiting``, in the reconciler's pass, does)."""
    store = comments.store
    record = store.get(key)
    if record is None or record.status is not Status.QUEUED:
        return
    if not pace_rules.same(record.waiting, pace_rules.shown(place)):

        def apply(r: LoopRecord) -> None:
            # Admitted meanwhile by another process: a stale place must not come back.
            if r.status is not Status.QUEUED or Pace(store.redis).waiter(key) is None:
                raise _MovedOn
            _apply(r, pace_rules.waiting(place))

        try:
            record = store.update(key, apply)
        except (_MovedOn, KeyError):
            return
    if record.waiting is not None and not record.waiting.posted:
        comments.post_waiting(record)


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


# -- what GitHub shows -----------------------------------------------------------------------------

LOOP_CHECK = "loopbot"  # the loop's own check run on its head (jobs/loop/runner.py)


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
    """The issue's status comment (``jobs.status_comment.post_status``), and the wait
    for people on the head's check run: a person looking at the pull request's checks
    sees what the loop waits for, in the status comment's words."""
    posted = _post_comment(store, gh, record, tail, now=now, hold=hold, quiet=quiet)
    return _show_wait(store, gh, _loop_check_left(store, gh, posted))


def _loop_check_left(store: Store, gh: Installation, record: LoopRecord) -> LoopRecord:
    """A loop that ended (cancelled, failed, refused) while its ``loopbot`` run on a
    clean catch-up's head was left to the critic (``LoopRecord.loop_check_waiting``),
    before the critic wrote it or carried the approval: written now, so the head keeps
    what the loop found there (verify passed), as it would have before issue 43. Best
    effort: a failure is logged and the next status change tries again."""
    if record.active or not record.loop_check_waiting:
        return record
    try:
        return write_left_check(store, gh, record, record.head_sha, by="end")
    except GitHubError as exc:
        log.warning("status.left_check_failed", loop=record.key, error=str(exc)[:300])
        return record


def write_left_check(
    store: Store, gh: Installation, record: LoopRecord, sha: str, *, by: str = "critic"
) -> LoopRecord:
    """The ``loopbot`` run the loop left on a clean catch-up's head
    (``LoopRecord.loop_check_waiting``), written on ``sha`` if that is the head it was
    left on; either way nothing waits after. Raises what GitHub raised (nothing cleared)."""
    waiting = record.loop_check_waiting
    if not waiting:
        return record
    if waiting.get("sha") == sha:
        gh.upsert_check_run(
            record.repo,
            LOOP_CHECK,
            sha,
            status="completed",
            conclusion="success",
            title=waiting.get("title", "verify passed"),
            summary=waiting.get("summary", ""),
        )
        store.event(record.key, "loop_check_written", sha=sha, by=by)
    return store.set_fields(record.key, loop_check_waiting={})


def _show_wait(store: Store, gh: Installation, record: LoopRecord) -> LoopRecord:
    """Show the wait for people on the check run of the head, or take it back when the
    wait is over; written only when it changes (``LoopRecord.wait_shown``), so a loop
    that never waits for people costs no call. Best effort: a failure is logged and the
    next status change tries again."""
    wait = people_wait(record)
    shown = f"{record.head_sha} {wait}" if wait and record.head_sha else ""
    if shown == record.wait_shown:
        return record
    if shown:
        head, title, summary = record.head_sha, wait, f"{messages.status_line(record)}\n\n{wait}"
        conclusion = "success"  # verify passed on this head: the gate waits on no other
    else:
        head = record.wait_shown.split(" ", 1)[0]
        ended = not record.active
        title = f"{record.status.value}: {record.reason}" if ended else record.phase
        summary = messages.status_line(record)
        conclusion = {Status.CANCELLED: "cancelled", Status.COMPLETED: "success"}.get(
            record.status, "failure" if ended else "success"
        )
    try:
        gh.upsert_check_run(
            record.repo,
            LOOP_CHECK,
            head,
            status="completed",
            conclusion=conclusion,
            title=title,
            summary=summary,
        )
    except GitHubError as exc:
        log.warning("status.wait_check_failed", loop=record.key, error=str(exc)[:300])
        return record
    return store.set_fields(record.key, wait_shown=shown)


# -- helpers -------------------------------------------------------------------------------------


def _apply(record: LoopRecord, changes: rules.Changes) -> None:
    for name, value in changes.items():
        setattr(record, name, value)


__all__ = ["post_status"]  # where the jobs have always found it
