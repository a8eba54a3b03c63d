"""``loopbot doctor --config``: a repository's loop.yml checked the way the worker reads
it, the new keys (milestones, triage, metric, post_action, labels) included."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.core import repo_config
from bot.core.repo_config import Ceilings
from bot.ops.cli import main
from bot.ops.doctor_config import config_checks

METRIC = """verify: make test
max_cost_usd: 1e12
milestones: auto
triage: {enabled: false}
post_action: {prompt: "Add a line to CHANGELOG.md"}
metric:
  command: python3 bench.py
  direction: lower
  min_delta: 0.5
  scope: ["src/**"]
  max_iterations: 7
"""


def test_a_valid_file_says_what_it_sets_up_and_what_the_ceilings_lower() -> None:
    checks = config_checks("loop.yml", METRIC, Ceilings(max_cost_usd=5.0))
    assert all(c.ok for c in checks)
    warned = [c.detail for c in checks if c.warn]
    assert warned == [
        "`max_cost_usd`: 1e+12 asked, lowered to 5 (the operator's ceiling, `LOOPBOT_MAX_COST_USD`)"
    ]
    summary = checks[-1].detail
    for part in (
        "milestones auto",
        "triage off",
        "metric loops on `loop:optimize`: lower `python3 bench.py` by at least 0.5",
        "guard `make test`",
        "7 iterations",
        "post-action",
    ):
        assert part in summary


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("verify: x\nmetric: {command: y, scope: [a]}\n", "`metric.direction`: required"),
        (
            "verify: x\nmetric: {command: y, direction: up, scope: [a]}\n",
            "`metric.direction`: Input should be 'higher' or 'lower'",
        ),
        ("verify: x\nmilestones: sometimes\n", "`milestones`: Input should be"),
        ("verify: x\ntriage: {enable: true}\n", "`triage.enable`: unknown key"),
        ("verify: x\npost_action: {prompt: ''}\n", "`post_action.prompt`: String should have"),
        (
            "verify: x\nlabels: {optimize: loop:ready}\n",
            "`ready` and `optimize` are both `loop:ready`",
        ),
        (
            "verify: x\nlabels: {needs_spec: loop:needs-human}\n",
            "`needs_human` and `needs_spec` are both `loop:needs-human`",
        ),
    ],
)
def test_each_problem_is_named(text: str, problem: str) -> None:
    checks = config_checks("loop.yml", text, repo_config.DEFAULT_CEILINGS)
    failed = [c for c in checks if not c.ok]
    assert failed, checks
    assert any(problem in c.detail for c in failed), [c.detail for c in failed]


def test_the_cli_exits_nonzero_for_a_bad_file_and_zero_for_a_good_one(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(METRIC)
    bad.write_text("verify: x\nmax_turn: 3\n")
    runner = CliRunner()
    ok = runner.invoke(main, ["doctor", "--config", str(good)], env={"GITHUB_APP_ID": ""})
    assert ok.exit_code == 0, ok.output
    assert "lowered to 25" in ok.output  # no settings here: the default ceilings
    failed = runner.invoke(main, ["doctor", "--config", str(good), "--config", str(bad)])
    assert failed.exit_code == 1
    assert "`max_turn`: unknown key" in failed.output


@pytest.mark.parametrize(
    ("written", "read"),
    [("off", "off"), ("on", "on"), ("auto", "auto"), ("false", "off"), ("true", "on")],
)
def test_milestones_off_and_on_as_yaml_reads_them(written: str, read: str) -> None:
    # YAML 1.1 turns a bare off/on into a boolean: `milestones: off` must still mean off.
    assert repo_config.parse(f"verify: x\nmilestones: {written}\n").milestones == read


def test_a_metric_scope_may_be_one_glob() -> None:
    text = "verify: x\nmetric: {command: y, direction: lower, scope: 'src/**'}\n"
    metric = repo_config.parse(text).metric
    assert metric is not None and metric.scope == ("src/**",)


def test_a_file_that_is_not_utf8_is_a_failed_check_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "loop.yml"
    bad.write_bytes(b"verify: \xff\xfe\n")
    out = CliRunner().invoke(main, ["doctor", "--config", str(bad)])
    assert out.exit_code == 1 and "cannot be read" in out.output, out.output


def test_schedules_and_their_task_files_in_a_checkout(tmp_path: Path) -> None:
    github = tmp_path / ".github"
    (github / "loop-tasks").mkdir(parents=True)
    (github / "loop.yml").write_text(
        "verify: 'true'\nschedules:\n"
        "  - {cron: '0 3 * * 1', task: .github/loop-tasks/deps.md}\n"
        "  - {cron: '0 4 * * *', task: .github/loop-tasks/speed.md}\n"
        "  - {cron: '0 5 * * *', task: .github/loop-tasks/gone.md}\n"
    )
    (github / "loop-tasks" / "deps.md").write_text("---\ntitle: Deps\n---\nUpdate them.\n")
    (github / "loop-tasks" / "speed.md").write_text(
        "---\ntitle: Speed\nloop: {kind: metric}\n---\nFaster.\n"
    )
    result = CliRunner().invoke(main, ["doctor", "--config", str(github / "loop.yml")])
    assert result.exit_code == 1, result.output
    assert "`0 3 * * 1` (UTC), next " in result.output and ": a fix loop, 'Deps'" in result.output
    assert "neither it nor loop.yml has a `metric:` section" in result.output
    assert "`.github/loop-tasks/gone.md` is not on the default branch" in result.output
