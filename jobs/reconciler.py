"""Periodic repair: resume loops whose worker died, pick up missed labels, reap worktrees.

Runs on a timer in every ``loopbot worker``; a Redis lock lets one of them act per
interval. Nothing runs at start-up: the first pass comes one interval after the worker
starts, so starting a process changes no loop.

- **Lapsed leases.** A loop that should be running (queued, running) but whose lease
  expired lost its worker (SIGKILL, a machine gone). It is resumed on any worker, at
  most ``max_auto_resumes`` times; after that it is ``stalled``.
- **Handovers.** A loop whose worker shut down cleanly (see ``jobs.drain``) is resumed
  at once, and not counted as a lost worker.
- **Stranded reviews and merges.** A loop in ``reviewing`` or ``merging`` whose critic or
  gate job is gone (lost enqueue, deleted, killed past its retries) gets its job again, at
  most ``max_auto_resumes`` times; after that it ends with ``critic_error``/``gate_error``.
- **Sweep.** GitHub never redelivers a failed webhook. Each installation's open issues
  with the ready label and no loop are started, if the person who added the label can
  write to the repository.
- **Reaping.** Worktrees on this machine whose loop completed, or that no loop owns,
  are removed.
"""

from __future__ import annotations

import threading
import time

from rq.job import JobStatus
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Reason, Status
from bot.core.text import messages
from bot.io.github.failures import GitHubError
from bot.io.logs import get_logger
from bot.io.queues import (
    CRITIC_JOB,
    GATE_JOB,
    LOOP_QUEUE,
    enqueue_critic,
    enqueue_gate,
    fetch_job,
    loop_queue,
)
from jobs.dispatch import enqueue_loop, start_loop
from jobs.drain import HANDOFF_PHASE
from jobs.runtime import Runtime
from jobs.worktree import Worktrees

log = get_logger("loopbot.reconciler")
# A queued loop whose job nobody has taken for this long is looked at too (a lost enqueue).
QUEUED_GRACE_SECONDS = 120
# A reviewing or merging loop whose job is gone is looked at after this long unchanged.
STRANDED_GRACE_SECONDS = 300


def _job_state(rt: Runtime, record: LoopRecord) -> JobStatus | None:
    try:
        job = fetch_job(record.id.job_id, rt.redis)
        return job.get_status(refresh=True)
    except Exception:  # noqa: BLE001 - a missing or unreadable job is a lost job
        return None


def resume_lapsed(rt: Runtime) -> list[str]:
    """Resume loops that should run but nobody runs; returns the keys acted on."""
    store = rt.store
    acted = []
    now = time.time()
    # Summaries pick the candidates; only those records are read whole.
    wanted = {Status.RUNNING.value, Status.QUEUED.value}
    for summary in store.summaries():
        if summary["status"] not in wanted:
            continue
        record = store.get(summary["key"])
        if record is None or record.status not in (Status.RUNNING, Status.QUEUED):
            continue
        if store.lease_holder(record.key) is not None:
            continue
        state = _job_state(rt, record)
        handoff = record.status == Status.QUEUED and record.phase == HANDOFF_PHASE
        if handoff:
            if state in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.STARTED):
                continue  # queued already, or the handing-over job is still wrapping up
        elif record.status == Status.QUEUED and (
            state in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED)
            or now - record.updated_at < QUEUED_GRACE_SECONDS
        ):
            continue  # waiting its turn in the queue
        if record.status == Status.RUNNING and state in (JobStatus.SCHEDULED, JobStatus.QUEUED):
            continue  # between RQ retries after an error: the retry will take the lease
        if record.status == Status.RUNNING and now - record.updated_at < rt.settings.lease_ttl:
            continue  # just started; the lease may not be taken yet
        with store.lock(record.key):
            fresh = store.get(record.key)
            if fresh is None or fresh.status not in (Status.RUNNING, Status.QUEUED):
                continue
            if store.lease_holder(record.key) is not None:
                continue
            if fresh.phase == HANDOFF_PHASE:
                # Handed over by a worker that shut down cleanly: not a lost worker.
                store.set_fields(record.key, phase="queued")
                store.event(record.key, "loop_resumed", reason="handoff")
                enqueue_loop(rt, record.repo, record.issue, replace=True)
                log.info("reconciler.resumed_handoff", loop=record.key)
                acted.append(record.key)
                continue
            if fresh.auto_resumes >= rt.settings.max_auto_resumes:
                _stall(rt, fresh)
                acted.append(record.key)
                continue

            def resume(r: LoopRecord) -> None:
                r.auto_resumes += 1
                r.status = Status.QUEUED
                r.phase = "queued"
                r.resume_note = (
                    f"The worker running turn {r.turn} stopped; you are continuing "
                    "on another worker from the last pushed commit."
                )

            store.update(record.key, resume)
            store.event(
                record.key, "loop_resumed", reason="lease_lapsed", attempt=fresh.auto_resumes + 1
            )
            enqueue_loop(rt, record.repo, record.issue, replace=True)
            log.warning("reconciler.resumed", loop=record.key, attempt=fresh.auto_resumes + 1)
            acted.append(record.key)
    return acted


def _stall(rt: Runtime, record: LoopRecord) -> None:
    def apply(r: LoopRecord) -> None:
        r.status, r.reason, r.phase = Status.STALLED, Reason.STALL_TIMEOUT.value, "stalled"
        r.detail = f"the worker was lost {r.auto_resumes + 1} times"

    rt.store.update(record.key, apply)
    rt.store.event(record.key, "loop_finished", status="stalled", reason="stall_timeout")


def _pending_jobs(rt: Runtime) -> set[tuple[str, str, int]]:
    """(function, repo, issue) of every critic and gate job queued, running, scheduled
    (the gate's timer, an RQ retry) or deferred on the loop queue."""
    queue = loop_queue(rt.redis)
    ids = set(queue.get_job_ids())
    for registry in (StartedJobRegistry, ScheduledJobRegistry, DeferredJobRegistry):
        ids.update(registry(LOOP_QUEUE, connection=rt.redis).get_job_ids())
    found = set()
    for job_id in ids:
        try:
            job = fetch_job(job_id, rt.redis)
            name, args = job.func_name, job.args
        except Exception:  # noqa: BLE001 - gone meanwhile, or not ours: not a pending job
            continue
        if name in (CRITIC_JOB, GATE_JOB) and len(args) == 2:
            found.add((str(name), str(args[0]), int(args[1])))
    return found


def revive_stranded(rt: Runtime) -> list[str]:
    """Give a reviewing or merging loop whose job is gone its job again, or end it."""
    store = rt.store
    now = time.time()
    wanted = {Status.REVIEWING.value, Status.MERGING.value}
    candidates = [
        s["key"]
        for s in store.summaries()
        if s["status"] in wanted and now - float(s["updated_at"]) >= STRANDED_GRACE_SECONDS
    ]
    if not candidates:
        return []
    pending = _pending_jobs(rt)
    acted = []
    for key in candidates:
        record = store.get(key)
        if record is None or record.status not in (Status.REVIEWING, Status.MERGING):
            continue
        reviewing = record.status == Status.REVIEWING
        func = CRITIC_JOB if reviewing else GATE_JOB
        if (func, record.repo, record.issue) in pending:
            continue
        with store.lock(f"gate:{key}", timeout=120):
            fresh = store.get(key)
            if fresh is None or fresh.status != record.status:
                continue
            if fresh.auto_resumes >= rt.settings.max_auto_resumes:
                _end_stranded(rt, fresh)
                acted.append(key)
                continue
            store.update(key, _count_resume)
            store.event(key, "job_requeued", job="critic" if reviewing else "gate")
            if reviewing:
                enqueue_critic(rt.redis, record.repo, record.issue)
            else:
                enqueue_gate(rt.redis, record.repo, record.issue)
            log.warning("reconciler.requeued", loop=key, status=record.status.value)
            acted.append(key)
    return acted


def _count_resume(r: LoopRecord) -> None:
    r.auto_resumes += 1


def _end_stranded(rt: Runtime, record: LoopRecord) -> None:
    reviewing = record.status == Status.REVIEWING
    reason = Reason.CRITIC_ERROR if reviewing else Reason.GATE_ERROR
    what = "review" if reviewing else "merge gate"
    detail = messages.gave_up(what, "its job was lost each time", record.auto_resumes + 1)

    def apply(r: LoopRecord) -> None:
        r.status, r.reason, r.phase, r.detail = Status.FAILED, reason.value, "failed", detail

    updated = rt.store.update(record.key, apply)
    rt.store.event(record.key, "loop_finished", status="failed", reason=reason.value, detail=detail)
    try:
        gh = rt.github.installation(record.installation_id)
        gh.upsert_comment(record.repo, record.issue, "status", messages.status_comment(updated))
    except Exception as exc:  # noqa: BLE001 - the record is terminal whatever GitHub says
        log.warning("reconciler.comment_failed", loop=record.key, error=str(exc)[:300])


def sweep(rt: Runtime) -> list[str]:
    """Start loops for labelled issues whose webhook never arrived."""
    started = []
    for iid in rt.github.installation_ids():
        gh = rt.github.installation(iid)
        for repo in gh.repositories():
            try:
                text = gh.file(repo, repo_config.CONFIG_PATH)
                if text is None:
                    continue
                label = repo_config.ready_label(text)
                for issue in gh.open_issues_with_label(repo, label):
                    key = LoopId(repo, issue.number).key
                    if rt.store.get(key) is not None:
                        continue
                    actor = gh.last_labeler(repo, issue.number, label)
                    if actor is None or not gh.can_write(repo, actor):
                        continue
                    config = repo_config.parse(text, repo_config.Ceilings.of(rt.settings))
                    result = start_loop(rt, repo, issue.number, iid, actor, config, approved=issue)
                    rt.store.event(key, "swept", actor=actor, result=result)
                    started.append(key)
            except (GitHubError, repo_config.ConfigError) as exc:
                log.warning("reconciler.sweep_failed", repo=repo, error=str(exc))
    return started


def reap(rt: Runtime) -> list[str]:
    """Recycle (or remove) worktrees on this machine that no unfinished loop needs."""
    wt = Worktrees(rt.settings.data_dir)
    removed = []
    for repo, issue, path in wt.owned_worktrees():
        record = rt.store.get(LoopId(repo, issue))
        if record is None or record.status == Status.COMPLETED:
            wt.release(repo, issue)
            removed.append(str(path))
    return removed


class Reconciler(threading.Thread):
    """The timer that runs the passes above; one worker acts per interval (Redis lock)."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__(daemon=True, name="loopbot-reconciler")
        self.rt = rt
        self.stop = threading.Event()
        self._last_sweep = time.time()

    def run(self) -> None:
        interval = self.rt.settings.reconcile_interval
        while not self.stop.wait(interval):
            try:
                self.tick()
            except Exception:
                log.exception("reconciler.failed")

    def tick(self) -> None:
        log.debug("reconciler.tick")
        reap(self.rt)  # worktrees are on this machine: every worker reaps its own
        redis = self.rt.redis
        if not redis.set(
            "loopbot:reconciler", "1", nx=True, px=int(self.rt.settings.reconcile_interval * 900)
        ):
            return
        resume_lapsed(self.rt)
        revive_stranded(self.rt)
        if time.time() - self._last_sweep >= self.rt.settings.sweep_interval:
            self._last_sweep = time.time()
            sweep(self.rt)
