"""The spend caps' and the report's pure rules (bot/core/spend/)."""

from __future__ import annotations

import calendar
import re

import pytest

from bot.core import repo_config
from bot.core.record import LoopRecord, Reason, Status, Usage
from bot.core.rules import lifecycle as rules
from bot.core.spend import chart
from bot.core.spend.caps import (
    DEFAULTS,
    Period,
    Scope,
    caps_for,
    counter,
    full,
    period_end,
    period_of,
)
from bot.core.spend.report import outcome, parse_since, percentile, report

NOV_30_23H = calendar.timegm((2026, 11, 30, 23, 0, 0))
DEC_31_23H = calendar.timegm((2026, 12, 31, 23, 0, 0))


@pytest.mark.parametrize(
    ("day", "month", "expected"),
    [
        pytest.param(None, None, (50.0, 1000.0), id="unset: the operator's"),
        pytest.param(0.05, None, (0.05, 1000.0), id="a lower day cap is taken"),
        pytest.param(None, 20.0, (50.0, 20.0), id="a lower month cap is taken"),
        pytest.param(80.0, 5000.0, (50.0, 1000.0), id="a higher one never raises"),
    ],
)
def test_loop_yml_lowers_a_repository_cap_never_raises_it(
    day: float | None, month: float | None, expected: tuple[float, float]
) -> None:
    caps = {(c.scope, c.period): c for c in caps_for(DEFAULTS, day, month)}
    got = (caps[(Scope.REPOSITORY, Period.DAY)].usd, caps[(Scope.REPOSITORY, Period.MONTH)].usd)
    assert got == expected
    assert caps[(Scope.INSTALLATION, Period.DAY)].usd == DEFAULTS[(Scope.INSTALLATION, Period.DAY)]


def test_clamp_says_when_loop_yml_asks_above_the_operator() -> None:
    config = repo_config._validate("verify: make\nspend:\n  day_usd: 80\n  month_usd: 5\n")
    clamped, notes = repo_config.clamp(config, repo_config.DEFAULT_CEILINGS)
    assert (clamped.spend.day_usd, clamped.spend.month_usd) == (50.0, 5.0)
    assert notes == [
        "`spend.day_usd`: 80 asked, lowered to 50 (the operator's ceiling, "
        "`LOOPBOT_SPEND_REPO_DAY_USD`)"
    ]


@pytest.mark.parametrize(
    ("now", "period", "name", "ends"),
    [
        (NOV_30_23H, Period.DAY, "2026-11-30", calendar.timegm((2026, 12, 1, 0, 0, 0))),
        (NOV_30_23H, Period.MONTH, "2026-11", calendar.timegm((2026, 12, 1, 0, 0, 0))),
        (DEC_31_23H, Period.MONTH, "2026-12", calendar.timegm((2027, 1, 1, 0, 0, 0))),
    ],
)
def test_periods_are_utc_days_and_months(
    now: float, period: Period, name: str, ends: float
) -> None:
    assert period_of(period, now) == name
    assert period_end(period, now) == ends


def test_counters_name_the_repository_or_installation_and_the_period() -> None:
    repo_day, repo_month, inst_day, _ = caps_for(DEFAULTS)
    assert counter(repo_day, "o/r", 7, NOV_30_23H) == "repo:o/r:day:2026-11-30"
    assert counter(repo_month, "o/r", 7, NOV_30_23H) == "repo:o/r:month:2026-11"
    assert counter(inst_day, "o/r", 7, NOV_30_23H) == "inst:7:day:2026-11-30"


def test_a_full_cap_says_which_who_set_it_and_how_to_go_on() -> None:
    repo_day = caps_for(DEFAULTS, 0.05)[0]
    words = full(repo_day, 40_000, 20_000, NOV_30_23H)
    assert words.startswith("the repository's daily spend cap ($0.05, `spend.day_usd` in")
    assert "$0.0400 spent today" in words and "up to $0.0200" in words
    assert "rolls over in 60 min (UTC)" in words and "`/loop-restart`" in words
    inst_month = caps_for(DEFAULTS)[3]
    words = full(inst_month, 1, 1, NOV_30_23H)
    assert "installation's monthly spend cap" in words
    assert "the operator can raise `LOOPBOT_SPEND_INSTALLATION_MONTH_USD`" in words


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [([], 50, None), ([3.0], 90, 3.0), ([1, 2, 3, 4], 50, 2.0), ([*range(1, 11)], 90, 9.0)],
)
def test_percentile_is_nearest_rank(values: list[float], p: float, expected: float | None) -> None:
    assert percentile(values, p) == expected


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (Status.COMPLETED, Reason.MERGED, "merged"),
        (Status.COMPLETED, Reason.PR_OPENED, "unmerged_done"),
        (Status.REFUSED, Reason.NEEDS_SPEC, "refused"),
        (Status.FAILED, Reason.BUDGET, "failed"),
        (Status.STALLED, Reason.STALL_TIMEOUT, "failed"),
        (Status.CANCELLED, Reason.CANCELLED, "cancelled"),
        (Status.RUNNING, None, "active"),
    ],
)
def test_outcomes(status: Status, reason: Reason | None, expected: str) -> None:
    r = LoopRecord(repo="o/r", issue=1, installation_id=1, status=status)
    r.reason = reason.value if reason else ""
    assert outcome(r) == expected


def _loop(issue: int, status: Status, reason: str, usd: float, backend: str = "") -> LoopRecord:
    r = LoopRecord(repo="o/r", issue=issue, installation_id=1, status=status, reason=reason)
    r.backend = backend
    r.record_usage("m1", "agent", Usage(input_tokens=10, output_tokens=5, cost_usd=usd))
    r.record_usage("m1", "critic", Usage(cache_read_tokens=7, cost_usd=0.5, messages=1))
    r.cost_usd = usd + 0.5
    r.created_at, r.updated_at = 1000.0, 1000.0 + 7200
    return r


def test_report_sorts_spend_by_backend_and_shares_the_unmerged() -> None:
    loops = [
        _loop(1, Status.COMPLETED, "merged", 1.5, "claude-code"),
        _loop(2, Status.FAILED, "max_turns_reached", 2.0),
        _loop(3, Status.COMPLETED, "merged", 0.5),
    ]
    row = report(loops, since=0).repos["(total)"].row()
    assert (row["loops_started"], row["loops_merged"], row["loops_failed"]) == (3, 2, 1)
    assert row["usd"] == pytest.approx(5.5) and row["unmerged_usd"] == pytest.approx(2.5)
    assert row["unmerged_share"] == pytest.approx(2.5 / 5.5, abs=1e-6)
    assert row["merged_usd_median"] == 1.0 and row["merged_usd_p90"] == 2.0
    assert row["label_to_merge_hours_median"] == 2.0
    by = report(loops, since=0).repos["o/r"].by_model
    assert by[("claude-code", "m1")].usd == pytest.approx(1.5)
    assert by[("builtin", "m1")].usd == pytest.approx(2.0 + 0.5 + 1.5)
    assert report(loops, since=2000).repos["(total)"].counts["started"] == 0


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("12h", 43200), ("90", 90)])
def test_since(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["soon", "", "-1d", "0h", "infd"])
def test_since_refuses_what_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError):
        parse_since(text)


def test_chart_escapes_names_and_stacks_each_day() -> None:
    svg = chart.svg(["2026-11-27", "2026-11-28"], {"<b>/x": [0.0, 0.3], "o/r": [0.1, 0.2]})
    assert "<b>" not in svg and "&lt;b&gt;/x" in svg
    assert len(re.findall(r"<rect x=", svg)) == 3 + 2  # three bars' bands, two legend keys
    assert "$0.50" in svg  # the axis's top: 0.5 rounded up to 1, 2 or 5 times ten's power
    assert chart.nice_top(0.0) == 0.01 and chart.nice_top(3.2) == 5 and chart.nice_top(20) == 20


@pytest.mark.parametrize(
    ("status", "held"),
    [
        (Status.QUEUED, True),
        (Status.RUNNING, True),
        (Status.CANCELLED, False),  # a cancel that landed meanwhile stands
        (Status.COMPLETED, False),
        (Status.REVIEWING, False),
    ],
)
def test_only_a_loop_about_to_start_is_held_for_spend(status: Status, held: bool) -> None:
    changes = rules.held_for_spend(status, "the repository's daily spend cap", 0.05)
    if not held:
        assert changes is None
        return
    assert changes is not None
    assert changes["status"] is Status.QUEUED and changes["phase"] == rules.SPEND_HELD
    assert changes["detail"].startswith("⏳ Waiting to start: the repository's daily")
    assert changes["spend_need_usd"] == 0.05
