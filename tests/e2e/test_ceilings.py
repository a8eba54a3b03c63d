"""Operator ceilings: what a repository's loop.yml may ask for, and the clamp above it."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core import repo_config
from bot.core.record import Reason, Status
from bot.core.rules.loop import turns as transitions
from bot.core.settings import Settings
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, label, open_issue, sample_repo

CEILINGS = repo_config.Ceilings(
    max_cost_usd=25.0, max_turns=50, tool_budget=1000, wait_checks_minutes=240, max_hours=12.0
)


def _cfg(extra: str) -> repo_config.RepoConfig:
    return repo_config._validate("verify: make test\n" + extra)


@pytest.mark.parametrize(
    ("yml", "path", "expected", "note"),
    [
        (
            "max_cost_usd: 1.0e+12\n",
            "max_cost_usd",
            25.0,
            "`max_cost_usd`: 1e+12 asked, lowered to 25",
        ),
        ("max_turns: 100\n", "max_turns", 50, "`max_turns`: 100 asked, lowered to 50"),
        ("tool_budget: 1000000000\n", "tool_budget", 1000, "`tool_budget`: 1000000000 asked"),
        (
            "merge:\n  wait_checks_minutes: 100000000\n",
            "merge.wait_checks_minutes",
            240,
            "`merge.wait_checks_minutes`: 100000000 asked, lowered to 240",
        ),
        (
            "limits:\n  max_hours: 1000\n",
            "limits.max_hours",
            12.0,
            "`limits.max_hours`: 1000 asked, lowered to 12",
        ),
        (
            "merge:\n  protected_paths: []\n",
            "merge.protected_paths",
            (".github/**",),
            "`merge.protected_paths`: `.github/**` added",
        ),
        (
            "merge:\n  protected_paths: ['src/**']\n",
            "merge.protected_paths",
            (".github/**", "src/**"),
            "`.github/**` added",
        ),
        # At the ceiling or under it: untouched, no note.
        ("max_cost_usd: 25\nmax_turns: 50\n", "max_cost_usd", 25.0, None),
        ("max_turns: 7\ntool_budget: 12\n", "tool_budget", 12, None),
        ("merge:\n  wait_checks_minutes: 30\n", "merge.wait_checks_minutes", 30, None),
        ("limits:\n  max_hours: 2\n", "limits.max_hours", 2.0, None),
        ("", "limits.max_hours", None, None),  # unset: the ceiling applies at run time
        ("", "merge.protected_paths", (".github/**",), None),  # the default holds it already
    ],
)
def test_clamp(yml: str, path: str, expected: Any, note: str | None) -> None:
    config = _cfg(yml)
    clamped, notes = repo_config.clamp(config, CEILINGS)
    value: Any = clamped
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected
    if note is None:
        assert notes == [] and clamped is config
    else:
        assert len(notes) == 1 and note in notes[0], notes
        if "lowered" in note:
            assert "operator's ceiling, `LOOPBOT_MAX_" in notes[0]


def test_clamp_reports_every_key_and_keeps_the_rest() -> None:
    config = _cfg(
        "max_cost_usd: 1.0e+12\nmax_turns: 100\ntool_budget: 1000000000\nmax_steps: 30\n"
        "merge:\n  wait_checks_minutes: 100000000\n  protected_paths: []\n  max_fix_turns: 4\n"
    )
    clamped, notes = repo_config.clamp(config, CEILINGS)
    assert (clamped.max_cost_usd, clamped.max_turns, clamped.tool_budget) == (25.0, 50, 1000)
    assert clamped.merge.wait_checks_minutes == 240
    assert clamped.max_steps == 30 and clamped.merge.max_fix_turns == 4
    assert clamped.verify == "make test"
    assert len(notes) == 5
    body = repo_config.clamped_comment(notes)
    assert "operator" in body and all(n in body for n in notes)


def test_parse_clamps_with_default_ceilings_when_given_none() -> None:
    text = "verify: make\nmax_cost_usd: 1.0e+12\nmerge:\n  protected_paths: []\n"
    config = repo_config.parse(text)
    assert config.max_cost_usd == repo_config.DEFAULT_CEILINGS.max_cost_usd
    assert ".github/**" in config.merge.protected_paths
    looser = repo_config.Ceilings(max_cost_usd=2e12)
    assert repo_config.parse(text, looser).max_cost_usd == 1e12


def test_ceilings_from_settings(env: dict[str, str]) -> None:
    s = Settings.model_validate(
        {
            **env,
            "LOOPBOT_MAX_COST_USD": "3.5",
            "LOOPBOT_MAX_TURNS": "9",
            "LOOPBOT_MAX_TOOL_BUDGET": "77",
            "LOOPBOT_MAX_WALL_HOURS": "1.5",
            "LOOPBOT_MAX_WAIT_CHECKS_MINUTES": "15",
        }
    )
    assert repo_config.Ceilings.of(s) == repo_config.Ceilings(3.5, 9, 77, 15, 1.5)
    assert repo_config.Ceilings.of(Settings.model_validate(env)) == repo_config.DEFAULT_CEILINGS


def test_wall_hours_is_the_lower_of_file_and_ceiling() -> None:
    assert repo_config.wall_hours(_cfg(""), CEILINGS) == 12.0
    assert repo_config.wall_hours(_cfg("limits:\n  max_hours: 2\n"), CEILINGS) == 2.0


def test_before_turn_stops_on_the_wall_clock() -> None:
    args: dict[str, Any] = dict(
        turn=3, max_turns=10, issue_open=True, has_label=True, cancel=None, max_hours=2.0
    )
    assert transitions.before_turn(**args, elapsed_hours=1.9) == transitions.RunTurn(4)
    stop = transitions.before_turn(**args, elapsed_hours=2.0)
    assert isinstance(stop, transitions.Stop)
    assert stop.status == Status.FAILED and stop.reason == Reason.BUDGET
    assert "wall-clock budget" in stop.detail


GREEDY = """\
verify: python3 -m unittest -q
max_turns: 100
max_cost_usd: 1.0e+12
tool_budget: 1000000000
critic:
  enabled: false
merge:
  enabled: false
  wait_checks_minutes: 100000000
  protected_paths: []
"""


def _clamp_comments(github: GitHubServer) -> list[dict[str, Any]]:
    return [
        c
        for c in github.repo(REPO).comments.values()
        if c["user"]["type"] == "Bot" and repo_config.CLAMPED_COMMENT_KEY in c["body"]
    ]


def test_greedy_loop_yml_runs_within_the_ceilings(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.replace("calc.py", "return a - b", "return a + b"), m.text("Fixed."))
    sample_repo(github, loop_yml=GREEDY)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None and record.status == Status.COMPLETED, record
    assert record.max_turns == 50
    comments = _clamp_comments(github)
    assert len(comments) == 1
    body = comments[0]["body"]
    for key in ("max_cost_usd", "max_turns", "tool_budget", "merge.wait_checks_minutes"):
        assert f"`{key}`" in body
    assert "`.github/**` added" in body and "operator" in body
    events = [e for e in Store(redis).events(f"{REPO}#{n}") if e["kind"] == "config_clamped"]
    assert len(events) == 1 and len(events[0]["data"]["notes"]) == 5


def test_wall_clock_budget_stops_the_loop(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    yml = (
        "verify: python3 -m unittest -q\nlimits:\n  max_hours: 0.000001\n"
        "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
    )
    sample_repo(github, loop_yml=yml)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None and record.status == Status.FAILED, record
    assert record.reason == Reason.BUDGET.value and "wall-clock budget" in record.detail
    assert not model.requests
    assert _clamp_comments(github) == []


def test_doctor_names_the_ceilings(env: dict[str, str]) -> None:
    from bot.ops.doctor import ceilings_check

    line = ceilings_check(Settings.model_validate({**env, "LOOPBOT_MAX_TURNS": "9"})).line()
    assert line.startswith("[ok  ] ceilings:") and "9 turns (LOOPBOT_MAX_TURNS)" in line
    assert "$25 (LOOPBOT_MAX_COST_USD)" in line
    assert "100,000,000 tokens (LOOPBOT_MAX_TOKENS)" in line
    assert "200 turns over an issue's life (LOOPBOT_MAX_TOTAL_TURNS)" in line
