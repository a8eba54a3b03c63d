"""The reconciler's schedules step: each schedule's due slot starts one loop, once.

Every pass, for each schedule booked from a default branch's ``loop.yml``
(``bot/io/schedules.py``), the pure rule (``bot/core/schedules/slots.py``) says whether a
slot is due at ``now``. The first worker to claim the slot in Redis (SET NX) runs it; any
other finds it taken. A run reads the default branch's head: ``loop.yml`` there must still
hold the schedule, and the task file there is the text that runs, approved by that commit.
It opens an issue for the run, or takes the one its last run left open, labels it with
the loop's label, and starts the loop as a writer's label does (``jobs.dispatch.start_loop``:
the same line, ``max_parallel`` and budgets). While the last run is still active the slot
is skipped, and said so: on the issue, in its events, in ``loopbot schedules``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.record import Status
from bot.core.repo_config import ScheduleConfig
from bot.core.schedules import slots, tasks
from bot.io.github.client import Installation
from bot.io.github.failures import GitHubError
from bot.io.logs import get_logger
from bot.io.schedules import Book, Standing, Table
from jobs.dispatch import Scheduled, start_loop
from jobs.runtime import Runtime

log = get_logger("loopbot.schedules")
SKIPPED_KEY = "schedule-skipped"  # the comment on an issue whose run a slot skipped
STARTED = frozenset({"started", "restarted"})  # start_loop's words for a loop that starts


@dataclass(frozen=True)
class Outcome:
    """What a slot came to: ``started``, ``skipped`` (the last run is active),
    ``refused`` (start_loop's reason), ``task_invalid``, ``config_invalid``, ``removed``."""

    outcome: str
    detail: str = ""
    issue: int = 0
    commit: str = ""


def run(rt: Runtime, now: float) -> list[str]:
    """Start every schedule's due slot at ``now``; returns the slots this worker took
    (``repo task slot: outcome``). A schedule gone from a valid ``loop.yml`` is forgotten."""
    book = Book(rt.redis)
    owner = f"{socket.gethostname()}:{os.getpid()}"
    taken = []
    for repo, table in sorted(book.tables().items()):
        if not table.error:
            wanted = {s.task for s in table.schedules}
            for task in book.tasks(repo):
                if task not in wanted:
                    book.forget(repo, task)
        for schedule in table.schedules:
            try:
                done = _tick(rt, book, table, schedule, now, owner)
            except GitHubError as exc:  # the claim lapses; a later pass tries the slot again
                log.warning("schedules.failed", repo=repo, task=schedule.task, error=str(exc))
                continue
            if done:
                taken.append(done)
    return taken


def _tick(
    rt: Runtime, book: Book, table: Table, schedule: ScheduleConfig, now: float, owner: str
) -> str:
    repo, task, cron = table.repo, schedule.task, schedule.cron
    standing = book.seen(repo, task, cron, now)
    decision = slots.decide(cron, now, since=standing.since, last=standing.last_slot)
    if isinstance(decision, slots.Wait):
        return ""
    slot = decision.slot
    if not book.claim(repo, task, slot, owner):
        return ""  # another worker took this slot
    result = _start(rt, table, schedule, standing, slot, decision.missed)
    book.settle(
        repo,
        task,
        slot,
        result.outcome,
        now=now,
        detail=result.detail,
        issue=result.issue,
        loop=LoopId(repo, result.issue).key if result.issue else "",
        commit=result.commit,
    )
    book.done(repo, task, slot, slots.interval(cron, slot))
    log.info(
        "schedules.slot",
        repo=repo,
        task=task,
        slot=slots.iso(slot),
        missed=decision.missed,
        outcome=result.outcome,
        detail=result.detail,
        issue=result.issue,
    )
    return f"{repo} {task} {slots.iso(slot)}: {result.outcome}"


def _start(
    rt: Runtime,
    table: Table,
    schedule: ScheduleConfig,
    standing: Standing,
    slot: float,
    missed: int,
) -> Outcome:
    """Run ``slot``: read the default branch's head, open or take the issue, start."""
    repo, path = table.repo, schedule.task
    gh = rt.github.installation(table.installation_id)
    branch = gh.repo(repo).default_branch
    head = gh.branch_head(repo, branch)
    # The schedule as the head has it: one removed since the table was read never runs.
    try:
        config = rt.parse_config(gh.file(repo, repo_config.CONFIG_PATH, ref=head))
    except repo_config.ConfigError as exc:
        return Outcome("config_invalid", "; ".join(exc.problems), commit=head)
    if schedule not in config.schedules:
        return Outcome("removed", f"not in {repo_config.CONFIG_PATH} at {head[:12]}", commit=head)
    try:
        task = tasks.parse(path, gh.file(repo, path, ref=head))
    except tasks.TaskError as exc:
        return Outcome("task_invalid", "; ".join(exc.problems), commit=head)
    kind = task.kind
    if kind == "metric":
        effective, _ = repo_config.with_task(config, task.settings_dict(), rt.ceilings)
        if effective.metric is None:
            why = f"`{path}` asks for a metric loop: it needs a `metric:` section (or loop.yml's)"
            return Outcome("task_invalid", why, commit=head)
    reuse = 0
    if standing.issue:
        previous = gh.issue(repo, standing.issue)
        record = rt.store.get(LoopId(repo, previous.number)) if previous.open else None
        if record is not None and record.active:
            return _skip(rt, gh, repo, previous.number, record.status, path, slot, head)
        if previous.open and (record is None or record.status is not Status.COMPLETED):
            reuse = previous.number  # its last run ended unmerged: the next one goes on there
    body = tasks.issue_body(task, cron=schedule.cron, slot=slot, commit=head, branch=branch)
    key = f"schedule:{path}:{int(slot)}"
    if reuse:
        issue = gh.rewrite_issue(repo, reuse, key, task.title, body)
    else:
        issue = gh.create_issue(repo, key, task.title, body)
    label = config.labels.of_kind(kind)
    if label not in issue.labels:
        gh.add_labels(repo, issue.number, [label])
        issue = issue.model_copy(update={"labels": (*issue.labels, label)})
    loop = LoopId(repo, issue.number)
    rt.store.event(
        loop,
        "scheduled_run",
        task=path,
        cron=schedule.cron,
        slot=slots.iso(slot),
        commit=head,
        missed=missed,
        reused=bool(reuse),
    )
    # The approver is the commit, not a person: no one is asked to review for it.
    result = start_loop(
        rt,
        repo,
        issue.number,
        table.installation_id,
        "",
        config,
        approved=issue,
        kind=kind,
        scheduled=Scheduled(path, head, task.settings_dict()),
    )
    outcome = "started" if result in STARTED else "refused"
    return Outcome(outcome, "" if outcome == "started" else result, issue.number, head)


def _skip(
    rt: Runtime,
    gh: Installation,
    repo: str,
    number: int,
    status: Status,
    path: str,
    slot: float,
    head: str,
) -> Outcome:
    """The last run is still active: this slot does not run, and the issue says so."""
    when = slots.iso(slot)
    rt.store.event(LoopId(repo, number), "schedule_skipped", task=path, slot=when)
    gh.upsert_comment(
        repo,
        number,
        SKIPPED_KEY,
        f"The scheduled run of `{path}` for slot {when} (UTC) was skipped: this issue's "
        f"loop, the last run, is still {status.value}. The schedule runs again at its next "
        "slot after this loop ends.",
    )
    return Outcome("skipped", f"the last run (#{number}) is still {status.value}", number, head)
