"""The spend caps: which apply to a loop, which counter each reads, and how a full one is
said. Pure rules, no I/O.

Four caps, set by the operator (``LOOPBOT_SPEND_{REPO,INSTALLATION}_{DAY,MONTH}_USD``):
every repository's spend today and this month, and every installation's. A repository's
``loop.yml`` may lower its own two (``spend.day_usd``, ``spend.month_usd``), never raise
them (``bot.core.repo_config.clamp``). Days and months are UTC calendar periods.

Spend is counted in micro-dollars (integers: Redis adds them atomically and exactly). A
call is admitted only when every cap still has room for its worst case
(``bot.core.rules.loop.budget.worst_call``), which is reserved at once and replaced by what the
call was billed when it returns (``bot.io.spend``); so the counted spend never passes a
cap, and what the API billed never passes the counted spend.
"""

from __future__ import annotations

import calendar
import time
from dataclasses import dataclass
from enum import StrEnum

from bot.core.text.numbers import duration

MICRO = 1_000_000  # micro-dollars per dollar


class Scope(StrEnum):
    REPOSITORY = "repository"
    INSTALLATION = "installation"


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


# The operator's defaults: a day of a busy repository (some forty loops at the default
# per-issue budget's typical spend), and enough across an installation for several of
# them; a month at about twenty such days. Finite, so a runaway day stops by itself.
DEFAULTS: dict[tuple[Scope, Period], float] = {
    (Scope.REPOSITORY, Period.DAY): 50.0,
    (Scope.REPOSITORY, Period.MONTH): 1000.0,
    (Scope.INSTALLATION, Period.DAY): 200.0,
    (Scope.INSTALLATION, Period.MONTH): 4000.0,
}
ENV: dict[tuple[Scope, Period], str] = {
    (Scope.REPOSITORY, Period.DAY): "LOOPBOT_SPEND_REPO_DAY_USD",
    (Scope.REPOSITORY, Period.MONTH): "LOOPBOT_SPEND_REPO_MONTH_USD",
    (Scope.INSTALLATION, Period.DAY): "LOOPBOT_SPEND_INSTALLATION_DAY_USD",
    (Scope.INSTALLATION, Period.MONTH): "LOOPBOT_SPEND_INSTALLATION_MONTH_USD",
}
LOOP_YML = {Period.DAY: "spend.day_usd", Period.MONTH: "spend.month_usd"}


@dataclass(frozen=True)
class Cap:
    """One cap in force: its scope and period, its limit, and who set it (``env``: the
    operator's variable, or the ``loop.yml`` key that lowered it)."""

    scope: Scope
    period: Period
    usd: float
    source: str

    @property
    def micro(self) -> int:
        return round(self.usd * MICRO)

    def name(self) -> str:
        """ "the repository's daily spend cap"."""
        whose = "repository's" if self.scope is Scope.REPOSITORY else "installation's"
        per = "daily" if self.period is Period.DAY else "monthly"
        return f"the {whose} {per} spend cap"

    def set_by(self) -> str:
        if self.source.startswith("LOOPBOT_"):
            return f"the operator's `{self.source}`"
        return f"`{self.source}` in `.github/loop.yml`"


def caps_for(
    operator: dict[tuple[Scope, Period], float],
    day_usd: float | None = None,
    month_usd: float | None = None,
) -> tuple[Cap, ...]:
    """The four caps a repository's loops are held to: the operator's, the repository's
    own two lowered by ``loop.yml`` (a value above the operator's is not taken)."""
    out = []
    asked = {Period.DAY: day_usd, Period.MONTH: month_usd}
    for scope in Scope:
        for period in Period:
            usd, source = operator[(scope, period)], ENV[(scope, period)]
            lower = asked[period] if scope is Scope.REPOSITORY else None
            if lower is not None and lower < usd:
                usd, source = lower, LOOP_YML[period]
            out.append(Cap(scope, period, usd, source))
    return tuple(out)


def period_of(period: Period, now: float) -> str:
    """The UTC day (``2026-11-28``) or month (``2026-11``) that ``now`` falls in."""
    t = time.gmtime(now)
    return time.strftime("%Y-%m-%d" if period is Period.DAY else "%Y-%m", t)


def period_end(period: Period, now: float) -> float:
    """When the period holding ``now`` rolls over (UTC midnight, or the month's first)."""
    t = time.gmtime(now)
    midnight = calendar.timegm((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0))
    if period is Period.DAY:
        return float(midnight + 86_400)
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    return float(calendar.timegm((year, month, 1, 0, 0, 0)))


def counter(cap: Cap, repo: str, installation_id: int, now: float) -> str:
    """The counter a cap reads, under ``loopbot:spend:`` (``bot.io.spend``)."""
    who = f"repo:{repo}" if cap.scope is Scope.REPOSITORY else f"inst:{installation_id}"
    return f"{who}:{cap.period.value}:{period_of(cap.period, now)}"


def full(cap: Cap, spent_micro: int, need_micro: int, now: float) -> str:
    """Why a call (its worst case ``need_micro``) may not go out under ``cap``, in words
    that name the cap, who set it, and what lets the loop go on."""
    spent, need = spent_micro / MICRO, need_micro / MICRO
    when = "today" if cap.period is Period.DAY else "this month"
    rolls = duration(max(0.0, period_end(cap.period, now) - now))
    if cap.source.startswith("LOOPBOT_"):
        how = f"the operator can raise `{cap.source}`"
    else:
        how = f"a writer can raise `{cap.source}` in `.github/loop.yml` (up to the operator's)"
    return (
        f"{cap.name()} (${cap.usd:.2f}, {cap.set_by()}) is reached: ${spent:.4f} spent "
        f"{when}, and the next model call could cost up to ${need:.4f}. The period rolls "
        f"over in {rolls} (UTC); {how}, then comment `/loop-restart`"
    )
