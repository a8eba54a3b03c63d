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

What to do with a lapsed or stranded loop is decided by the pure rules in
``bot/core/rules/recovery.py``; this module reads the facts and acts through
``jobs/lifecycle.py``.
"""

from __future__ import annotations

import threading
import time
from typing import assert_never

from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Reason, Status
from bot.core.rules import recovery
from bot.core.rules.lifecycle import Guard, Requeue
from bot.io.github.failures import GitHubError
from bot.io.logs import get_logger
from bot.io.queues import LOOP_QUEUE, JobKind, fetch_job, kind_of, loop_queue
from jobs import lifecycle
from jobs.dispatch import start_loop
from jobs.runtime import Runtime
from jobs.worktree import Worktrees

log = get_logger("loopbot.reconciler")
# A queued loop whose job nobody has taken for this long is looked at too (a lost enqueue).
QUEUED_GRACE_SECONDS = 120
# A reviewing or merging loop whose job is gone is looked at after this long unchanged.
STRANDED_GRACE_SECONDS = 300


def _job_state(rt: Runtime, record: LoopRecord) -> recovery.JobState:
    try:
        job = fetch_job(record.id.job_id, rt.redis)
        return str(job.get_status(refresh=True).value)
    except Exception:  # noqa: BLE001 - a missing or unreadable job is a lost job
        return None


def _lapsed(rt: Runtime, record: LoopRecord, now: float) -> recovery.Lapsed:
    leased = rt.store.lease_holder(record.key) is not None
    return recovery.lapsed(
        record,
        leased=leased,
        job=None if leased else _job_state(rt, record),
        now=now,
        lease_ttl=rt.settings.lease_ttl,
        queued_grace=QUEUED_GRACE_SECONDS,
        max_auto_resumes=rt.settings.max_auto_resumes,
    )


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
        if record is None or isinstance(_lapsed(rt, record, now), recovery.Skip):
            continue
        with store.lock(record.key):  # against a start or restart deciding meanwhile
            fresh = store.get(record.key)
            if fresh is None:
                continue
            decision = _lapsed(rt, fresh, now)
            match decision:
                case recovery.Skip():
                    continue
                case recovery.TakeOver():
                    lifecycle.requeue(store, fresh.key, Requeue.TAKE_OVER)
                    log.info("reconciler.resumed_handoff", loop=fresh.key)
                case recovery.Stall(detail=detail):
                    lifecycle.finish(
                        store,
                        fresh.key,
                        Status.STALLED,
                        Reason.STALL_TIMEOUT,
                        detail,
                        guard=Guard.ALWAYS,  # decided under the loop's lock
                    )
                case recovery.Resume():
                    lifecycle.requeue(store, fresh.key, Requeue.WORKER_LOST)
                    log.warning(
                        "reconciler.resumed", loop=fresh.key, attempt=fresh.auto_resumes + 1
                    )
                case _:
                    assert_never(decision)
            acted.append(fresh.key)
    return acted


def _pending_jobs(rt: Runtime) -> set[tuple[JobKind, str, int]]:
    """(kind, repo, issue) of every critic and gate job queued, running, scheduled
    (the gate's timer, an RQ retry) or deferred on the loop queue."""
    queue = loop_queue(rt.redis)
    ids = set(queue.get_job_ids())
    for registry in (StartedJobRegistry, ScheduledJobRegistry, DeferredJobRegistry):
        ids.update(registry(LOOP_QUEUE, connection=rt.redis).get_job_ids())
    found: set[tuple[JobKind, str, int]] = set()
    for job_id in ids:
        try:
            job = fetch_job(job_id, rt.redis)
            name, args = job.func_name, job.args
        except Exception:  # noqa: BLE001 - gone meanwhile, or not ours: not a pending job
            continue
        kind = kind_of(name)
        if kind in (JobKind.CRITIC, JobKind.GATE) and len(args) == 2:
            found.add((kind, str(args[0]), int(args[1])))
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

    def decide(record: LoopRecord | None) -> recovery.Stranded:
        if record is None:
            return recovery.Skip("gone")
        kind = JobKind.CRITIC if record.status is Status.REVIEWING else JobKind.GATE
        return recovery.stranded(
            record,
            job_pending=(kind, record.repo, record.issue) in pending,
            now=now,
            grace=STRANDED_GRACE_SECONDS,
            max_auto_resumes=rt.settings.max_auto_resumes,
        )

    for key in candidates:
        if isinstance(decide(store.get(key)), recovery.Skip):
            continue  # before the lock: a running gate holds it for as long as it runs
        with store.lock(f"gate:{key}", timeout=120):  # the gate's: never mid-merge
            record = store.get(key)
            if record is None:
                continue
            decision = decide(record)
            match decision:
                case recovery.Skip():
                    continue
                case recovery.EndStranded(reason=reason, detail=detail):
                    lifecycle.finish(
                        store,
                        key,
                        Status.FAILED,
                        reason,
                        detail,
                        guard=Guard.ALWAYS,  # decided under the gate's lock
                        gh=rt.github.installation(record.installation_id),
                        best_effort=True,  # the record is terminal whatever GitHub says
                    )
                case recovery.Revive():
                    lifecycle.revive(store, key)
                    log.warning("reconciler.requeued", loop=key, status=record.status.value)
                case _:
                    assert_never(decision)
            acted.append(key)
    return acted


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
                    config = rt.parse_config(text)
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
        if record is None or record.status is Status.COMPLETED:
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
