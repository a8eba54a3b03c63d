"""Scheduled loops, the pure parts: the slot rule, cron and task files, loop.yml's
``schedules:``, a task's ``loop:`` settings, and the push that re-reads them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.core import repo_config
from bot.core.commands import DefaultBranchPushed
from bot.core.rules.routing import Enqueue, Ignore, route
from bot.core.schedules import slots, tasks


def t(hhmmss: str, day: int = 4) -> float:
    """2026-05-<day> at hh:mm:ss UTC (the 4th is a Monday)."""
    return (
        datetime.strptime(f"2026-05-{day:02d} {hhmmss}", "%Y-%m-%d %H:%M:%S")
        .replace(tzinfo=UTC)
        .timestamp()
    )


EVERY_MINUTE = "* * * * *"
MONDAYS = "0 3 * * 1"


@pytest.mark.parametrize(
    ("name", "cron", "now", "since", "last", "want"),
    [
        (
            "a slot at exactly now is due",
            EVERY_MINUTE,
            t("10:01:00"),
            t("10:00:30"),
            None,
            slots.Due(t("10:01:00"), 0),
        ),
        (
            "the latest slot is due seconds later",
            EVERY_MINUTE,
            t("10:01:20"),
            t("10:00:30"),
            None,
            slots.Due(t("10:01:00"), 0),
        ),
        (
            "a slot from before the schedule was seen never runs",
            EVERY_MINUTE,
            t("10:00:40"),
            t("10:00:30"),
            None,
            slots.Wait(t("10:01:00"), "before"),
        ),
        (
            "a slot that ran does not run again",
            EVERY_MINUTE,
            t("10:01:50"),
            t("10:00:30"),
            t("10:01:00"),
            slots.Wait(t("10:02:00"), "ran"),
        ),
        (
            "two slots slept through: the latest runs once, one missed",
            EVERY_MINUTE,
            t("10:03:30"),
            t("10:00:30"),
            t("10:01:00"),
            slots.Due(t("10:03:00"), 1),
        ),
        (
            "weekly, down three days: Monday's slot runs once when back",
            MONDAYS,
            t("09:00:00", 7),
            t("00:00:00", 1),
            t("03:00:00", 4) - 7 * 86400,
            slots.Due(t("03:00:00", 4), 0),
        ),
        (
            "weekly, added on a Wednesday: Monday's slot never runs",
            MONDAYS,
            t("09:00:00", 6),
            t("08:00:00", 6),
            None,
            slots.Wait(t("03:00:00", 11), "before"),
        ),
        (
            "weekly, after its run: the next Monday",
            MONDAYS,
            t("09:00:00", 6),
            t("00:00:00", 1),
            t("03:00:00", 4),
            slots.Wait(t("03:00:00", 11), "ran"),
        ),
    ],
)
def test_which_slot_is_due(
    name: str, cron: str, now: float, since: float, last: float | None, want: slots.Decision
) -> None:
    assert slots.decide(cron, now, since=since, last=last) == want, name


def test_the_latest_slot_is_never_older_than_its_own_interval() -> None:
    # The catch-up rule's bound: whenever loopbot comes back, the slot it runs is within
    # one interval of now; an older one was superseded by a later slot.
    for cron in (EVERY_MINUTE, MONDAYS, "*/15 9-17 * * 1-5", "0 0 1 * *"):
        for now in (t("00:00:00"), t("12:34:56", 9), t("23:59:59", 30)):
            slot = slots.latest(cron, now)
            assert slot <= now < slot + slots.interval(cron, slot)


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("* * * *", "has 4"),
        ("0 * * * * *", "has 6"),  # croniter's seconds field: not a schedule's
        ("61 * * * *", "not a cron expression"),
        ("@daily", "has 1"),
    ],
)
def test_a_cron_expression_has_five_fields_croniter_reads(cron: str, problem: str) -> None:
    with pytest.raises(slots.CronError, match=problem):
        slots.check(cron)


def test_a_cron_expression_is_single_spaced() -> None:
    assert slots.check(" 0  3 * *   1 ") == MONDAYS


TASK = """\
---
title: Keep dependencies current
---
Update every pinned dependency to its newest release.
"""


def test_a_task_file_is_a_title_and_a_body() -> None:
    task = tasks.parse(".github/loop-tasks/deps.md", TASK)
    assert (task.title, task.body, task.kind) == (
        "Keep dependencies current",
        "Update every pinned dependency to its newest release.",
        "code",
    )
    assert task.settings_dict() == {}


def test_a_task_with_a_metric_section_is_a_metric_loop() -> None:
    text = TASK.replace(
        "---\nUpdate",
        "loop:\n  max_turns: 4\n  metric:\n    command: python3 bench.py\n"
        "    direction: lower\n    guard: python3 -m unittest\n    scope: src/**\n---\nUpdate",
    )
    task = tasks.parse(".github/loop-tasks/speed.md", text)
    assert task.kind == "metric"
    assert task.settings_dict()["metric"]["guard"] == "python3 -m unittest"
    assert task.settings_dict()["max_turns"] == 4


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "is not on the default branch"),
        ("Update things\n", "starts with a `---` line"),
        ("---\ntitle: x\nUpdate", "no closing `---`"),
        ("---\nbody: x\n---\ntext\n", "`body`: unknown key"),
        ("---\nloop: {}\n---\ntext\n", "`title`: required"),
        ("---\ntitle: x\n---\n\n", "it is empty"),
        ("---\ntitle: x\nloop:\n  verify: rm -rf /\n---\ntext\n", "`loop.verify`: unknown key"),
        ("---\ntitle: x\nloop:\n  max_turns: 500\n---\ntext\n", "`loop.max_turns`"),
        (
            "---\ntitle: x\nloop:\n  kind: code\n  metric: {command: a, direction: up, scope: b}"
            "\n---\ntext\n",
            "`loop.metric.direction`",
        ),
    ],
)
def test_a_bad_task_file_says_where(text: str | None, problem: str) -> None:
    with pytest.raises(tasks.TaskError, match=problem.replace("(", r"\(")):
        tasks.parse(".github/loop-tasks/x.md", text)


def test_the_issue_says_which_commit_approved_it() -> None:
    task = tasks.parse(".github/loop-tasks/deps.md", TASK)
    body = tasks.issue_body(task, cron=MONDAYS, slot=t("03:00:00"), commit="a" * 40, branch="main")
    assert body.startswith(task.body)
    assert f"as of commit {'a' * 40} on `main`, which approved it" in body
    assert "slot 2026-05-04T03:00Z" in body


YML = "verify: 'true'\nschedules:\n"


def test_schedules_in_loop_yml() -> None:
    config = repo_config.parse(YML + "  - {cron: '0 3 * * 1', task: .github/loop-tasks/deps.md}\n")
    (s,) = config.schedules
    assert (s.cron, s.task) == (MONDAYS, ".github/loop-tasks/deps.md")


@pytest.mark.parametrize(
    ("entries", "problem"),
    [
        (["{cron: 'nope', task: .github/loop-tasks/a.md}"], "`schedules.0.cron`"),
        (["{cron: '* * * * *', task: docs/a.md}"], "`schedules.0.task`"),
        (["{cron: '* * * * *', task: .github/loop-tasks/../loop.yml}"], "`schedules.0.task`"),
        (["{cron: '* * * * *', task: .github/loop-tasks/a.md, when: now}"], "unknown key"),
        (
            ["{cron: '* * * * *', task: .github/loop-tasks/a.md}"] * 2,
            "a task file has one schedule",
        ),
        (
            [f"{{cron: '* * * * *', task: .github/loop-tasks/t{i}.md}}" for i in range(6)],
            "at most 5",
        ),
    ],
)
def test_bad_schedules_name_the_key(entries: list[str], problem: str) -> None:
    text = YML + "".join(f"  - {e}\n" for e in entries)
    with pytest.raises(repo_config.ConfigError) as exc:
        repo_config.parse(text)
    assert problem in str(exc.value)


def test_a_task_asks_within_the_operators_ceilings() -> None:
    config = repo_config.parse("verify: 'true'\nmax_turns: 5\n")
    ceilings = repo_config.Ceilings(max_turns=10, max_cost_usd=3.0)
    got, notes = repo_config.with_task(config, {"max_turns": 40, "max_cost_usd": 2.0}, ceilings)
    assert (got.max_turns, got.max_cost_usd) == (10, 2.0)
    assert notes == [
        "`max_turns`: 40 asked, lowered to 10 (the operator's ceiling, `LOOPBOT_MAX_TURNS`)"
    ]


def push(ref: str = "refs/heads/main", files: tuple[str, ...] = (".github/loop.yml",), n: int = 1):  # type: ignore[no-untyped-def]
    return {
        "ref": ref,
        "after": "c" * 40,
        "sender": {"login": "writer", "type": "User"},
        "installation": {"id": 7},
        "repository": {"full_name": "acme/widgets", "default_branch": "main"},
        "commits": [{"modified": list(files)}] * n,
    }


@pytest.mark.parametrize(
    ("name", "payload", "enqueued"),
    [
        ("loop.yml changed on the default branch", push(), True),
        ("another file on the default branch", push(files=("README.md",)), False),
        ("loop.yml on another branch", push(ref="refs/heads/feature"), False),
        ("20 commits listed: one unlisted may have changed it", push(files=(), n=20), True),
    ],
)
def test_a_push_re_reads_schedules_when_loop_yml_changed(
    name: str, payload: dict[str, object], enqueued: bool
) -> None:
    r = route("push", payload, app_id=1)
    assert isinstance(r, Enqueue) == enqueued, (name, r)
    if isinstance(r, Enqueue):
        assert r.command == DefaultBranchPushed(
            installation_id=7, repo="acme/widgets", actor="writer", head_sha="c" * 40
        )
    else:
        assert isinstance(r, Ignore)
