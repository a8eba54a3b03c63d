"""The dashboard's spend page: the report's figures (``bot.core.spend.report``) and the chart
of spend per day per repository (``bot.core.spend.chart``), drawn on the server. The day
figures are the spend caps' counters (``bot.io.spend``), kept ``LOOPBOT_RETENTION_DAYS``."""

from __future__ import annotations

import time
from html import escape

from redis import Redis

from bot.core.record import LoopRecord
from bot.core.spend import chart
from bot.core.spend.caps import MICRO, Period, period_of
from bot.core.spend.report import TOTAL, Report, report
from bot.io.spend import SpendMeter

MAX_DAYS = 90  # the chart's widest window


def days_back(n: int, now: float) -> list[str]:
    """The last ``n`` UTC days, oldest first, today last."""
    return [period_of(Period.DAY, now - 86_400 * k) for k in range(n - 1, -1, -1)]


def page(redis: Redis, records: list[LoopRecord], window: float, now: float | None = None) -> str:
    now = time.time() if now is None else now
    built = report(records, now - window, None)
    days = days_back(max(1, min(MAX_DAYS, round(window / 86_400))), now)
    meter = SpendMeter(redis, 0)
    repos = sorted({r.repo for r in records})
    spend = {repo: [v / MICRO for v in meter.days(repo, days)] for repo in repos}
    spend = {repo: values for repo, values in spend.items() if any(values)}
    return _html(built, chart.svg(days, spend), days)


def _html(built: Report, svg: str, days: list[str]) -> str:
    rows = []
    for repo, f in built.repos.items():
        row = f.row()
        c = f.counts
        cells = [
            f"<b>{escape(repo)}</b>" if repo == TOTAL else escape(repo),
            str(c["started"]),
            str(c["merged"]),
            str(c["refused"]),
            str(c["failed"]),
            str(c["cancelled"]),
            f"${f.spend.usd:,.2f}",
            f"{f.spend.tokens:,}",
            _usd(row["merged_usd_median"]),
            _usd(row["merged_usd_p90"]),
            _hours(row["label_to_merge_hours_median"]),
            str(f.critic_rounds),
            "-" if row["unmerged_share"] is None else f"{row['unmerged_share']:.0%}",
        ]
        rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    models = []
    for repo, f in built.repos.items():
        if repo == TOTAL:
            continue
        for (backend, model), s in sorted(f.by_model.items()):
            cells = [
                escape(repo),
                escape(backend),
                escape(model),
                f"${s.usd:,.4f}",
                f"{s.input:,}",
                f"{s.output:,}",
                f"{s.cache_read:,}",
                f"{s.cache_write:,}",
            ]
            models.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    head = (
        "<tr><th>repository</th><th>loops</th><th>merged</th><th>refused</th><th>failed</th>"
        "<th>cancelled</th><th>spend</th><th>tokens</th><th>per merged PR (median)</th>"
        "<th>p90</th><th>label to merge (median)</th><th>critic rounds</th>"
        "<th>spent on unmerged</th></tr>"
    )
    model_head = (
        "<tr><th>repository</th><th>backend</th><th>model</th><th>spend</th><th>input</th>"
        "<th>output</th><th>cache read</th><th>cache write</th></tr>"
    )
    return (
        "<!doctype html><meta charset=utf-8><title>loopbot · spend</title>"
        "<link rel=stylesheet href=/dashboard/static/style.css>"
        '<h1>loopbot · spend <a class=muted href="/dashboard">loops</a></h1>'
        f"<p class=muted>Spend per day per repository, {escape(days[0])} to "
        f"{escape(days[-1])} (UTC), as charged under the spend caps.</p>"
        f"<figure>{svg}</figure>"
        "<h2>loops labelled in the window</h2>"
        f"<table id=figures><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
        "<h2>by backend and model</h2>"
        f"<table id=models><thead>{model_head}</thead><tbody>{''.join(models)}</tbody></table>"
    )


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.2f}"


def _hours(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 60:.1f} min" if v < 1 else f"{v:.2f} h"
