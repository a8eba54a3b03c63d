"""The dashboard's chart of spend per day per repository: an SVG drawn on the server (no
script, no library, nothing fetched from elsewhere). Pure: figures in, markup out; every
text in it is escaped."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 900, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40  # the plot's margins: axis labels, legend room
# Colour-blind-safe (Okabe and Ito), then repeated: more repositories share colours, the
# legend still tells them apart by order.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000")


def nice_top(value: float) -> float:
    """The y axis's top: ``value`` rounded up to 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 0.01
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 5):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def svg(days: Sequence[str], spend: Mapping[str, Sequence[float]]) -> str:
    """Stacked bars, one per day of ``days`` (``YYYY-MM-DD``), each repository's dollars
    (``spend[repo][i]`` on ``days[i]``) a band of its own colour, with a legend."""
    repos = sorted(spend)
    totals = [sum(spend[r][i] for r in repos) for i in range(len(days))]
    top = nice_top(max(totals, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(days))
    bar = max(1.0, slot * 0.7)
    tall = HEIGHT + 20 * len(repos)  # the legend's rows under the plot
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{tall}"'
        f' viewBox="0 0 {WIDTH} {tall}" role="img" id="spend-chart"'
        ' font-family="sans-serif" font-size="11">',
        "<title>Spend per day per repository (USD)</title>",
    ]
    for k in range(5):  # grid lines and the y axis's dollars
        value = top * k / 4
        y = TOP + plot_h - plot_h * k / 4
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">${value:,.2f}</text>')
    every = max(1, len(days) // 10)  # at most about ten dates along the bottom
    for i, day in enumerate(days):
        x = LEFT + slot * i + (slot - bar) / 2
        y = TOP + plot_h
        for n, repo in enumerate(repos):
            value = spend[repo][i]
            if value <= 0:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{COLOURS[n % len(COLOURS)]}"><title>{escape(repo)} {escape(day)}: '
                f"${value:,.4f}</title></rect>"
            )
        if i % every == 0:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{TOP + plot_h + 16}" '
                f'text-anchor="middle">{escape(day[5:])}</text>'
            )
    for n, repo in enumerate(repos):  # the legend, under the dates
        y = HEIGHT + 20 * n
        colour = COLOURS[n % len(COLOURS)]
        parts.append(f'<rect x="{LEFT}" y="{y - 10}" width="12" height="12" fill="{colour}"/>')
        total = sum(spend[repo])
        parts.append(f'<text x="{LEFT + 18}" y="{y}">{escape(repo)} · ${total:,.4f}</text>')
    parts.append("</svg>")
    return "".join(parts)
