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
- **Spend.** With ``LOOPBOT_SPEND_RESUME_ON_ROLLOVER``, loops a spend cap held back or
  stopped are restarted once every cap has room for the call each could not make.
- **Retention.** Loops ended more than ``LOOPBOT_RETENTION_DAYS`` ago are archived to their
  cost summary (``bot/core/spend/retention.py``); the sweep leaves archived loops alone.
- **Schedules.** Each schedule's due slot starts its loop once (``jobs/schedules.py``),
  by the reconciler's clock. The sweep also reads every repository's ``loop.yml`` into the
  schedules' book (a push to the default branch does so at once: ``jobs.dispatch``).
- **Pace.** The slots and the line (``bot/core/rules/pace.py``) are kept true to the
  records: an ended loop's slot or place is given back, an active loop that has neither
  is counted (running) or put in line (queued, no job); then whoever may start is
  admitted, and waiting loops whose issue does not show their place yet are told. A
  crash between a loop's end and the admissions it frees strands nobody. Waiting loops
  are never resumed as lost: they have no job on purpose. The sweep also gives a waiting
  loop the priority label's place when the label was added (or removed) after it joined.

What to do with a lapsed or stranded loop is decided by the pure rules in
``bot/core/rules/recovery.py``; this module reads the facts and acts through
``jobs/lifecycle.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import assert_never

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.record import ACTIVE, LoopRecord, Reason, Status
from bot.core.rules import recovery
from bot.core.rules.lifecycle import SPEND_HELD, Guard, Requeue
from bot.core.rules.loop.budget import Call
from bot.core.spend import retention
from bot.io.github.failures import GitHubError
from bot.io.logs import get_logger
from bot.io.pace import Pace
from bot.io.queues import JobKind, enqueue_gate, fetch_job, waits_where_it_says
from bot.io.schedules import Book
from jobs import lifecycle, merge_slot, schedules
from jobs.dispatch import start_loop
from jobs.runtime import Runtime
from jobs.spend import SpendGate
from jobs.tree.worktree import Worktrees

log = get_logger("loopbot.reconciler")
# A queued loop whose job nobody has taken for this long is looked at too (a lost enqueue).
QUEUED_GRACE_SECONDS = 120
# A reviewing or merging loop whose job is gone is looked at after this long unchanged.
STRANDED_GRACE_SECONDS = 300
# A gate tidies up within seconds of the merge; still held after this, its gate died.
TIDY_GRACE_SECONDS = 30


def _job_state(rt: Runtime, record: LoopRecord) -> recovery.JobState:
    try:
        job = fetch_job(record.id.job_id, rt.redis)
        state = str(job.get_status(refresh=True).value)
        # Waiting as RQ says, or waiting nowhere: then it is lost, and its loop with it.
        return state if waits_where_it_says(job, state, rt.redis) else None
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
    line = Pace(rt.redis)
    acted = []
    now = time.time()
    # Summaries pick the candidates; only those records are read whole.
    wanted = {Status.RUNNING.value, Status.QUEUED.value}
    # A loop waiting in line for a slot has no job on purpose: it is not lost.
    waiting = line.state().line.keys()
    for summary in store.summaries():
        if summary["status"] not in wanted or summary["key"] in waiting:
            continue
        if summary.get("phase") == SPEND_HELD:  # held by a spend cap: no job on purpose
            continue
        record = store.get(summary["key"])
        if record is None or isinstance(_lapsed(rt, record, now), recovery.Skip):
            continue
        # Said before the lock, which a start or restart deciding meanwhile holds: an
        # operator (and the hand-over test) sees which loop a pass waits to take over.
        log.info("reconciler.lapsed", loop=record.key)
        with store.lock(record.key):  # against a start or restart deciding meanwhile
            fresh = store.get(record.key)
            if fresh is None or line.waiter(fresh.key) is not None:
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


_ACTIVE = frozenset(s.value for s in ACTIVE)


def keep_pace(rt: Runtime) -> list[str]:
    """Keep the slots and the line true to the records, then admit whoever may start;
    returns the keys whose pace was repaired. Redis only: the waiting loops' places reach
    their issues in ``show_places``, last in the pass, so a GitHub outage delays nothing
    else the reconciler does."""
    store = rt.store
    line = Pace(rt.redis)
    state = line.state()
    summaries = {str(s["key"]): s for s in store.summaries()}
    repaired = []

    def holds(key: str, status: str) -> bool:
        """Whether ``key``'s slot or place still belongs to it: an active loop holds a
        slot; only a queued one waits in line."""
        if status not in _ACTIVE:
            return False
        return line.holds_slot(key) or (
            status == Status.QUEUED.value and line.waiter(key) is not None
        )

    for key in sorted(state.slots.keys() | state.line.keys()):
        summary = summaries.get(key)
        if summary is not None and holds(key, str(summary["status"])):
            continue
        with store.lock(key):  # against a start or restart deciding meanwhile
            record = store.get(key)
            if record is not None and holds(key, record.status.value):
                continue
            lifecycle.release(store, key)
            repaired.append(key)
            log.warning("reconciler.pace_released", loop=key)
    for key, summary in summaries.items():
        if summary["status"] not in _ACTIVE or key in state.slots or key in state.line:
            continue
        if summary.get("phase") == SPEND_HELD:  # waits for room to spend, not for a slot
            continue
        with store.lock(key):
            record = store.get(key)
            if record is None or not record.active:
                continue
            if line.holds_slot(key) or line.waiter(key) is not None:
                continue  # it asked meanwhile
            if record.status is Status.QUEUED and not lifecycle.job_pending(
                rt.redis, record.id.job_id
            ):
                # Its priority as last known (no GitHub call here); the sweep re-reads labels.
                priority = record.waiting.priority if record.waiting is not None else False
                pacing = lifecycle.Pacing(priority, None, rt.settings.max_parallel)
                lifecycle.rejoin(store, record, pacing)
            else:
                line.adopt(key, record.repo)  # it runs already: counted, not stopped
            repaired.append(key)
            log.warning("reconciler.pace_joined", loop=key, status=record.status.value)
    shown = [k for k, s in summaries.items() if str(s.get("phase", "")).startswith("waiting")]
    lifecycle.keep_pace(store, None, operator_max=rt.settings.max_parallel, shown_waiting=shown)
    return repaired


def resume_spend(rt: Runtime, now: float) -> list[str]:
    """With ``LOOPBOT_SPEND_RESUME_ON_ROLLOVER``: restart the loops a spend cap held back or
    stopped, once every cap has room again for the call it refused (a new day or month, or
    a cap raised). Without it, only a writer's ``/loop-restart`` does."""
    if not rt.settings.spend_resume_on_rollover:
        return []
    store, started = rt.store, []
    for summary in store.summaries():
        held = summary["status"] == Status.QUEUED.value and summary.get("phase") == SPEND_HELD
        stopped = (summary["status"], summary["reason"]) == (
            Status.FAILED.value,
            Reason.BUDGET.value,
        )
        if not (held or stopped):
            continue
        record = store.get(summary["key"])
        if record is None or record.spend_need_usd <= 0:
            continue  # stopped by its own budget, not by a cap: only a person can go on
        try:
            gh = rt.github.installation(record.installation_id)
            config = rt.config(gh, record.repo)
        except (GitHubError, repo_config.ConfigError) as exc:
            log.warning("reconciler.spend_resume_failed", loop=record.key, error=str(exc)[:200])
            continue
        gate = SpendGate.of(rt.redis, rt.settings, record, config, clock=lambda: now)
        if gate.room(Call(tokens=0, usd=record.spend_need_usd)):
            continue  # still no room for the call it could not make
        result = start_loop(
            rt,
            record.repo,
            record.issue,
            record.installation_id,
            record.started_by,
            config,
            restart=True,
            note="A spend cap held this loop back; there is room again, so it goes on.",
        )
        store.event(record.key, "spend_resumed", result=result)
        log.info("reconciler.spend_resumed", loop=record.key, result=result)
        started.append(record.key)
    return started


def archive_expired(rt: Runtime, now: float) -> list[str]:
    """Archive the loops that ended more than ``LOOPBOT_RETENTION_DAYS`` ago: their cost
    summary stays for the report (``bot/core/spend/retention.py``), the rest goes."""
    days, store, done = rt.settings.retention_days, rt.store, []
    for summary in store.summaries():
        if summary["status"] in _ACTIVE or float(summary["updated_at"]) >= now - days * 86_400:
            continue
        with store.lock(summary["key"]):  # against a restart deciding meanwhile
            record = store.get(summary["key"])
            if record is None or not retention.expired(record, now, days):
                continue
            store.archive(record)
        log.info("reconciler.archived", loop=record.key)
        done.append(record.key)
    return done


def show_places(rt: Runtime) -> int:
    """Tell each waiting loop's issue where it stands, where it does not say so yet."""
    return lifecycle.show_waiting(rt.store, rt.github)


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
    pending = lifecycle.pending_stage_jobs(rt.redis)
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


def finish_merged(rt: Runtime) -> list[str]:
    """A loop merged whose gate died before its tidy-up (the branch, the receipt, the
    last status: a worker killed right after the merge) gets its gate again, which
    finishes it (``Gate._tidy_merged``); nothing else revives a completed loop."""
    now = time.time()
    due = [s for s in rt.store.summaries() if s.get("tidy_pending")]
    if not due:
        return []
    pending = lifecycle.pending_stage_jobs(rt.redis)
    acted = []
    for s in due:
        job = (JobKind.GATE, str(s["repo"]), int(s["issue"]))
        if recovery.tidy_due(s, job_pending=job in pending, now=now, grace=TIDY_GRACE_SECONDS):
            enqueue_gate(rt.redis, str(s["repo"]), int(s["issue"]))
            log.warning("reconciler.tidy_merged", loop=s["key"])
            acted.append(str(s["key"]))
    return acted


def sweep(rt: Runtime) -> list[str]:
    """Start loops for labelled issues whose webhook never arrived; book each repository's
    schedules as its ``loop.yml`` says now (a missed push, a file removed)."""
    started = []
    book = Book(rt.redis)
    seen: set[str] = set()
    complete = True  # every installation's repositories were listed
    for iid in rt.github.installation_ids():
        gh = rt.github.installation(iid)
        try:
            repos = gh.repositories()
        except GitHubError as exc:
            # One installation GitHub refuses (paused, a token it will not mint) must not
            # stop the sweep of the others: found by bench/chaos.py.
            log.warning("reconciler.sweep_failed", installation=iid, error=str(exc))
            complete = False
            continue
        for repo in repos:
            seen.add(repo)
            try:
                text = gh.file(repo, repo_config.CONFIG_PATH)
                if text is None:
                    book.drop(repo)
                    continue
                book.read(repo, iid, text, time.time())
                # The ready label's fix loops, and the optimize label's metric loops when
                # loop.yml has a ``metric:`` section (jobs/loop/metric.py).
                kinds = [(repo_config.ready_label(text), "code")]
                if _has_metric(text):
                    kinds.append((repo_config.loop_label(text, "metric"), "metric"))
                priority = _priority_label(text)
                waiting = Pace(rt.redis).state().line
                labelled = [
                    (issue, label, kind)
                    for label, kind in kinds
                    for issue in gh.open_issues_with_label(repo, label)
                ]
                for issue, label, kind in labelled:
                    key = LoopId(repo, issue.number).key
                    first = priority in issue.labels
                    moved = key in waiting and waiting[key].priority != first
                    if moved and Pace(rt.redis).reprioritize(key, first):
                        rt.store.event(key, "reprioritized", priority=first)
                    if rt.store.get(key) is not None or rt.store.is_archived(key):
                        continue  # an archived loop ended long ago: the label is not news
                    actor = gh.last_labeler(repo, issue.number, label)
                    if actor is None or not gh.can_write(repo, actor):
                        continue
                    config = rt.parse_config(text)
                    result = start_loop(
                        rt, repo, issue.number, iid, actor, config, approved=issue, kind=kind
                    )
                    rt.store.event(key, "swept", actor=actor, result=result)
                    started.append(key)
            except (GitHubError, repo_config.ConfigError) as exc:
                log.warning("reconciler.sweep_failed", repo=repo, error=str(exc))
    if complete:  # repositories no installation reaches any more: their schedules end
        for repo in book.tables().keys() - seen:
            book.drop(repo)
    return started


def _has_metric(text: str) -> bool:
    """Whether a loop.yml starts metric loops (a broken one starts nothing)."""
    try:
        return repo_config.parse(text).metric is not None
    except repo_config.ConfigError:
        return False


def _priority_label(text: str) -> str:
    """The priority label of a loop.yml, even a broken one (its loops wait all the same)."""
    try:
        return repo_config.parse(text).labels.priority
    except repo_config.ConfigError:
        return repo_config.DEFAULT_LABELS.priority


def free_merge_slots(rt: Runtime) -> list[str]:
    """Let go of the repositories' merge slots whose holders ended without letting go (a
    record deleted, an end that could not reach Redis): their waiting gates run. A slot
    lapses on its own too (jobs/merge_slot.py), but twenty minutes later."""
    freed = []
    for repo, key in merge_slot.held(rt.redis).items():
        record = rt.store.get(key)
        if record is None or record.status not in ACTIVE:
            merge_slot.release(rt.redis, LoopId.parse(key))
            freed.append(f"{repo}: {key}")
    if freed:
        log.info("reconciler.merge_slots_freed", slots=freed)
    return freed


def reap(rt: Runtime) -> list[str]:
    """Recycle (or remove) worktrees on this machine that no unfinished loop needs."""
    wt = Worktrees(rt.settings.data_dir)
    removed = []
    for repo, issue, path in wt.owned_worktrees():
        record = rt.store.get(LoopId(repo, issue))
        if record is None or record.status is Status.COMPLETED:
            try:
                wt.release(repo, issue)
            except Exception:  # one worktree never stops the others
                log.exception("reconciler.reap_failed", path=str(path))
                continue
            removed.append(str(path))
    return removed


# How long a stopping worker waits for its reconciler's pass in progress (a step waits 30 s
# at most for a loop's lock; GitHub's pace, in the sweep, up to its own limits).
FINISH_PASS_SECONDS = 120.0


class Reconciler(threading.Thread):
    """The timer that runs the passes above; one worker acts per interval (Redis lock)."""

    def __init__(self, rt: Runtime, clock: Callable[[], float] = time.time) -> None:
        super().__init__(daemon=True, name="loopbot-reconciler")
        self.rt = rt
        # What time it is for the schedules (a test passes its own, to run minutes in seconds).
        self.clock = clock
        self.stop = threading.Event()
        self._last_sweep = time.time()
        self.in_pass = False

    def close(self, timeout: float = FINISH_PASS_SECONDS) -> None:
        """Start no more passes, and wait for the step in progress to end. The thread is a
        daemon: a worker that exited mid-step cut it off where it stood, and a take-over
        cut between the loop's record (resumed, no longer handed over) and its new job
        left the loop queued with no job until the queued grace ran out (the hand-over
        test's two-minute stall, issue 37 item 9: a draining worker's own reconciler took
        over the loop it had just handed over, and the worker exited)."""
        self.stop.set()
        if self.in_pass:
            log.info("reconciler.finishing_pass")
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        interval = self.rt.settings.reconcile_interval
        while not self.stop.wait(interval):
            try:
                self.tick()
            except Exception:
                log.exception("reconciler.failed")

    def tick(self) -> None:
        """One pass. Each step on its own: one that fails (a worktree git cannot clean,
        a GitHub error) is logged and the others still run, this pass and every next."""
        log.debug("reconciler.tick")
        self.in_pass = True
        try:
            self._pass()
        finally:
            self.in_pass = False

    def _pass(self) -> None:
        self._step("reap", reap)  # worktrees are on this machine: every worker reaps its own
        redis = self.rt.redis
        if not redis.set(
            "loopbot:reconciler", "1", nx=True, px=int(self.rt.settings.reconcile_interval * 900)
        ):
            return
        self._step("pace", keep_pace)  # first: a queued loop without a slot joins the line
        self._step("resume", resume_lapsed)
        self._step("revive", revive_stranded)
        self._step("tidy", finish_merged)
        self._step("merge slots", free_merge_slots)
        if time.time() - self._last_sweep >= self.rt.settings.sweep_interval:
            self._last_sweep = time.time()
            self._step("sweep", sweep)
        self._step("schedules", self.run_schedules)  # after the sweep: its fresh schedules
        self._step("spend", lambda rt: resume_spend(rt, self.clock()))
        self._step("retention", lambda rt: archive_expired(rt, self.clock()))
        self._step("places", show_places)  # last: the only part that waits for GitHub

    def run_schedules(self, rt: Runtime) -> list[str]:
        """The schedules step at this reconciler's clock."""
        return schedules.run(rt, self.clock())

    def _step(self, name: str, step: Callable[[Runtime], object]) -> None:
        if self.stop.is_set():
            return  # the worker stops: the step in progress ends, no other begins
        try:
            step(self.rt)
        except Exception:  # logged; the pass goes on
            log.exception("reconciler.step_failed", step=name)
