"""Scheduled loops end to end: the reconciler's schedules step on an explicit clock (three
minutes of slots in seconds), two reconcilers on one Redis, real RQ workers running each
loop through the critic to a squash merge, real git, the local GitHub and model."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from click.testing import CliRunner
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Status
from bot.io.metrics import render
from bot.io.schedules import Book
from bot.io.store import Store
from bot.ops.cli import main
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.reconciler import Reconciler, sweep
from jobs.runtime import Runtime
from tests.conftest import Web
from tests.helpers import REPO, reply_between_turns, sample_repo

TASK_PATH = ".github/loop-tasks/notes.md"
YML = """\
verify: python3 check.py
triage:
  enabled: false
schedules:
  - cron: '* * * * *'
    task: .github/loop-tasks/notes.md
"""
TASK = """\
---
title: Write the daily note
---
Add a note file under notes/ saying what day it is.
"""
CHECK = "raise SystemExit(0)\n"


def at(hhmmss: str) -> float:
    return (
        datetime.strptime(f"2026-05-04 {hhmmss}", "%Y-%m-%d %H:%M:%S")
        .replace(tzinfo=UTC)
        .timestamp()
    )


def note_writer(model: AnthropicServer) -> list[str]:
    """Each loop's first call writes a new note (a change to merge); the rest is the same
    every time. Returns the opening prompts, in order."""
    prompts: list[str] = []

    def respond(body: dict[str, Any]) -> m.Reply:
        reply = reply_between_turns(body)
        if reply is not None:
            return reply  # type: ignore[return-value]
        prompts.append(str(body["messages"][0]["content"]))
        return m.write_file(f"notes/{len(prompts)}.txt", f"note {len(prompts)}\n")

    model.responder = respond
    return prompts


def reconcilers(rt: Runtime, redis: Redis, now: list[float]) -> list[Reconciler]:
    """Two workers' reconcilers on one Redis, each with its own runtime, on one clock."""
    return [Reconciler(r, clock=lambda: now[0]) for r in (rt, Runtime(rt.settings, redis))]


def both(recs: list[Reconciler]) -> list[str]:
    """Both reconcilers' schedules steps at the same moment; the slots they took."""
    gate, taken = threading.Barrier(len(recs)), []

    def one(rec: Reconciler) -> None:
        gate.wait()
        taken.extend(rec.run_schedules(rec.rt))

    threads = [threading.Thread(target=one, args=(r,)) for r in recs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return taken


def runs(redis: Redis) -> list[LoopRecord]:
    """The scheduled loops, by issue."""
    records = [r for r in Store(redis).all() if r.schedule]
    return sorted(records, key=lambda r: r.issue)


def bot_issues(github: GitHubServer) -> list[Any]:
    return [
        i
        for i in github.repo(REPO).issues.values()
        if i.title == "Write the daily note" and not i.is_pull
    ]


def setup(github: GitHubServer, rt: Runtime, yml: str = YML, task: str = TASK) -> None:
    sample_repo(github, loop_yml=yml, extra={TASK_PATH: task, "check.py": CHECK})
    sweep(rt)  # the reconciler's sweep books the default branch's schedules


def test_every_minute_for_three_minutes_is_three_merged_runs_with_two_workers(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    rt: Runtime,
    drain: Callable[..., None],
) -> None:
    prompts = note_writer(model)
    setup(github, rt)
    now = [at("10:00:30")]
    recs = reconcilers(rt, redis, now)
    taken = []
    while now[0] <= at("10:03:50"):
        taken += both(recs)
        drain()  # the run's loop codes, is reviewed and merged before the next tick
        now[0] += 10
    assert [t.rsplit(" ", 2)[1:] for t in taken] == [
        ["2026-05-04T10:01Z:", "started"],
        ["2026-05-04T10:02Z:", "started"],
        ["2026-05-04T10:03Z:", "started"],
    ]
    loops = runs(redis)
    assert [(r.status, r.reason) for r in loops] == [(Status.COMPLETED, "merged")] * 3
    assert len(bot_issues(github)) == 3 and all(i.state == "closed" for i in bot_issues(github))
    assert [github.file_at(REPO, "main", f"notes/{n}.txt") for n in (1, 2, 3)] == [
        "note 1\n",
        "note 2\n",
        "note 3\n",
    ]
    # Approved by the default branch's commit that held the task, not by a person.
    for r in loops:
        assert r.approved_by == "" and r.started_by == "" and len(r.approved_commit) == 40
        assert "Add a note file under notes/" in r.approved_body
        assert f"as of commit {r.approved_commit} on `main`, which approved it" in r.approved_body
    opened = {r.issue for r in loops if any(f"Resolve issue #{r.issue} " in p for p in prompts)}
    assert opened == {r.issue for r in loops} and all("Add a note file" in p for p in prompts)
    standing = Book(redis).standing(REPO, TASK_PATH)
    assert (standing.runs, standing.skips, standing.outcome) == (3, 0, "started")


def test_a_worker_stopped_over_two_slots_runs_one_catch_up(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    rt: Runtime,
    drain: Callable[..., None],
) -> None:
    note_writer(model)
    setup(github, rt)
    now = [at("10:00:30")]
    recs = reconcilers(rt, redis, now)
    taken = []
    for moment in ("10:00:30", "10:01:05", "10:01:40"):  # slot 10:01 runs
        now[0] = at(moment)
        taken += both(recs)
        drain()
    for moment in ("10:03:20", "10:03:40"):  # down over 10:02 and 10:03: one run, of 10:03
        now[0] = at(moment)
        taken += both(recs)
        drain()
    assert [t.split(" ")[2] for t in taken] == ["2026-05-04T10:01Z:", "2026-05-04T10:03Z:"]
    loops = runs(redis)
    assert [r.reason for r in loops] == ["merged", "merged"]
    caught = [
        e["data"]
        for e in Store(redis).events(LoopId(REPO, loops[1].issue))
        if e["kind"] == "scheduled_run"
    ]
    assert [(c["slot"], c["missed"]) for c in caught] == [("2026-05-04T10:03Z", 1)]


def test_a_slot_while_the_last_run_is_active_is_skipped_and_says_so(
    github: GitHubServer, model: AnthropicServer, redis: Redis, rt: Runtime, env: dict[str, str]
) -> None:
    setup(github, rt)
    github.webhooks_enabled = False
    now = [at("10:00:30")]
    (rec, _) = reconcilers(rt, redis, now)
    rec.run_schedules(rt)
    now[0] = at("10:01:00")
    (first,) = rec.run_schedules(rt)  # started; its job waits in the queue, not run here
    now[0] = at("10:02:00")
    (second,) = rec.run_schedules(rt)
    assert first.endswith("started") and second.endswith("skipped")
    (loop,) = runs(redis)
    assert loop.status is Status.QUEUED
    comments = [c["body"] for c in github.repo(REPO).comments.values()]
    assert any(
        "slot 2026-05-04T10:02Z (UTC) was skipped: this issue's loop, the last run, is still "
        "queued" in c
        for c in comments
    )
    kinds = [e["kind"] for e in Store(redis).events(LoopId(REPO, loop.issue))]
    assert "schedule_skipped" in kinds
    standing = Book(redis).standing(REPO, TASK_PATH)
    assert (standing.outcome, standing.runs, standing.skips) == ("skipped", 1, 1)
    assert standing.detail == f"the last run (#{loop.issue}) is still queued"
    # Visible to the operator: `loopbot schedules` and /metrics.
    shown = CliRunner().invoke(main, ["schedules"], env={"REDIS_URL": env["REDIS_URL"]}).output
    assert "acme/widgets  .github/loop-tasks/notes.md  * * * * *   2026-05-04T10:02Z" in shown
    assert f"skipped #{loop.issue} (queued)" in shown
    (row,) = json.loads(
        CliRunner()
        .invoke(main, ["schedules", "--json"], env={"REDIS_URL": env["REDIS_URL"]})
        .output
    )
    assert (row["outcome"], row["runs"], row["skips"], row["loop_status"]) == (
        "skipped",
        1,
        1,
        "queued",
    )
    metrics = render(redis).decode()
    labels = f'{{repo="{REPO}",task="{TASK_PATH}"}}'
    assert f"loopbot_schedule_skips_total{labels} 1.0" in metrics
    assert f"loopbot_schedule_runs_total{labels} 1.0" in metrics


NEW_TASK = TASK.replace("saying what day it is", "saying what week it is")


def test_a_task_edited_on_a_branch_never_runs_and_runs_once_merged(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    rt: Runtime,
    drain: Callable[..., None],
) -> None:
    prompts = note_writer(model)
    # No schedule at first: a push of loop.yml to the default branch books it (the webhook).
    sample_repo(github, extra={TASK_PATH: TASK, "check.py": CHECK}, loop_yml="verify: 'true'\n")
    sweep(rt)
    github.push_files(REPO, "main", {".github/loop.yml": YML}, "Schedule the note", "writer")
    drain()
    assert [s.task for s in Book(redis).tables()[REPO].schedules] == [TASK_PATH]
    # The task edited on a branch, not merged: the next slot runs the default branch's text.
    github.push_files(REPO, "edit-task", {TASK_PATH: NEW_TASK}, "Weekly notes", "writer")
    now = [at("10:00:30")]
    (rec, _) = reconcilers(rt, redis, now)
    for moment in ("10:00:30", "10:01:05"):
        now[0] = at(moment)
        rec.run_schedules(rt)
        drain()
    # It merges (a writer's pull request); the next slot runs the new text.
    with github.as_user("writer") as u:
        pr = u.post(
            f"/repos/{REPO}/pulls",
            json={"title": "Weekly notes", "head": "edit-task", "base": "main", "body": ""},
        ).json()["number"]
        u.put(f"/repos/{REPO}/pulls/{pr}/merge", json={"merge_method": "squash"}).raise_for_status()
    merged = github.ref(REPO, "main")
    now[0] = at("10:02:05")
    rec.run_schedules(rt)
    drain()
    first, second = runs(redis)
    assert "what day it is" in first.approved_body and "what week" not in first.approved_body
    assert "what week it is" in second.approved_body and second.approved_commit == merged
    assert any("what day it is" in p for p in prompts) and "what week it is" in prompts[-1]
    assert [r.reason for r in (first, second)] == ["merged", "merged"]


METRIC = "print('x count:', open('src/work.txt').read().count('x'))\n"
METRIC_TASK = """\
---
title: Nightly x count
loop:
  metric:
    command: python3 metric.py
    direction: higher
    guard: python3 check.py
    scope: ['src/**']
    max_iterations: 2
---
Raise the x count of src/work.txt.
"""


def test_a_metric_task_on_a_schedule_keeps_and_discards_as_its_metric_says(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    rt: Runtime,
    drain: Callable[..., None],
) -> None:
    # Seed 004's nightly job: loop.yml has no metric section; the task file brings it.
    yml = YML.replace("notes.md", "nightly.md").replace("'* * * * *'", "'0 3 * * *'")
    sample_repo(
        github,
        loop_yml=yml,
        extra={
            ".github/loop-tasks/nightly.md": METRIC_TASK,
            "metric.py": METRIC,
            "check.py": CHECK,
            "src/work.txt": "xx\n",
        },
    )
    sweep(rt)
    model.play(
        m.write_file("src/work.txt", "xxxx\n"),
        m.text("Double the x"),  # 2 -> 4: kept
        m.write_file("src/work.txt", "x\n"),
        m.text("Trim to one x"),  # worse: discarded
        m.structured({"verdict": "approve", "summary": "Sound.", "findings": []}),
    )
    now = [at("02:59:30")]
    (rec, _) = reconcilers(rt, redis, now)
    rec.run_schedules(rt)
    now[0] = at("03:00:10")
    (taken,) = rec.run_schedules(rt)
    drain()
    assert taken.endswith("2026-05-04T03:00Z: started")
    (record,) = runs(redis)
    assert record.kind == "metric" and record.schedule == ".github/loop-tasks/nightly.md"
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), record.detail
    rows = [(r["iteration"], r["status"], r["metric"]) for r in record.metric_results]
    assert rows == [(0, "baseline", 2.0), (1, "keep", 4.0), (2, "discard", 1.0)]
    assert github.file_at(REPO, "main", "src/work.txt") == "xxxx\n"
    issue = github.repo(REPO).issues[record.issue]
    assert "loop:optimize" in issue.labels and issue.state == "closed"
