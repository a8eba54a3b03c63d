"""One budget per issue, over its whole life: dollars, tokens, turns and wall-clock hours.

Pure rules over plain values: what the budget is (``loop.yml`` within the operator's
ceilings), what the issue has spent (summed over every turn, critic round, restart and
retry: nothing here is ever reset), whether the next model call fits, and which budget
is exhausted, in words that say how to raise it. The I/O around a call (counting the
request's tokens with the API near the edge) is ``jobs.precall``.

Wall-clock hours are the time the loop was active (queued, running, reviewing, merging),
banked by the store at each write of an active record (``LoopRecord.active_seconds``);
the time a loop sat failed or cancelled is not counted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from bot.core import repo_config
from bot.core.pricing import CACHE_WRITE_1H, price_of
from bot.core.record import ACTIVE, LoopRecord
from bot.core.repo_config import Ceilings, RepoConfig
from bot.core.text.numbers import duration

NAMES = ("dollars", "tokens", "turns", "hours")
# budget -> (its key in .github/loop.yml, the operator's ceiling variable)
KEYS: dict[str, tuple[str, str]] = {
    "dollars": ("max_cost_usd", "LOOPBOT_MAX_COST_USD"),
    "tokens": ("limits.max_tokens", "LOOPBOT_MAX_TOKENS"),
    "turns": ("limits.max_total_turns", "LOOPBOT_MAX_TOTAL_TURNS"),
    "hours": ("limits.max_hours", "LOOPBOT_MAX_WALL_HOURS"),
}
# Tokens the API adds to a request that its JSON does not show: the built-in tools'
# own system prompts (a few hundred tokens each) and message framing.
HIDDEN_TOKENS = 2000
# A 5-minute cache write costs 1.25x input: the most any input token of a call that asks
# for no longer cache can cost. A request asking for a 1-hour cache write anywhere
# (``write_rate``) may pay 2x input (``CACHE_WRITE_1H``) for every input token.
CACHE_WRITE = 1.25


@dataclass(frozen=True)
class Budget:
    """The issue's limits, as ``loop.yml`` asks within the operator's ``ceilings``."""

    usd: float
    tokens: int
    turns: int
    hours: float
    ceilings: Ceilings = repo_config.DEFAULT_CEILINGS

    @classmethod
    def of(cls, config: RepoConfig, ceilings: Ceilings) -> Budget:
        # ``config`` is already clamped; an unset limit means the operator's ceiling.
        limits = config.limits
        return cls(
            usd=config.max_cost_usd,
            tokens=limits.max_tokens if limits.max_tokens is not None else ceilings.max_tokens,
            turns=(
                limits.max_total_turns
                if limits.max_total_turns is not None
                else ceilings.max_total_turns
            ),
            hours=repo_config.wall_hours(config, ceilings),
            ceilings=ceilings,
        )

    @classmethod
    def stored(cls, record: LoopRecord, ceilings: Ceilings) -> Budget | None:
        """The limits the loop stored when it last ran (None before it first ran): what
        the critic holds its call to, without reading ``loop.yml`` again."""
        limits = record.budget_limits
        if not all(n in limits for n in NAMES):
            return None
        return cls(
            usd=limits["dollars"],
            tokens=int(limits["tokens"]),
            turns=int(limits["turns"]),
            hours=limits["hours"],
            ceilings=ceilings,
        )

    def limits(self) -> dict[str, float]:
        """What the record keeps (``LoopRecord.budget_limits``) for comments and the
        dashboard, which do not read ``loop.yml``."""
        return {
            "dollars": self.usd,
            "tokens": self.tokens,
            "turns": self.turns,
            "hours": self.hours,
        }

    def limit(self, name: str) -> float:
        return self.limits()[name]

    def ceiling(self, name: str) -> float:
        c = self.ceilings
        return {
            "dollars": c.max_cost_usd,
            "tokens": c.max_tokens,
            "turns": c.max_total_turns,
            "hours": c.max_hours,
        }[name]


@dataclass(frozen=True)
class Spent:
    usd: float = 0.0
    tokens: int = 0
    turns: int = 0
    seconds: float = 0.0

    @classmethod
    def of(cls, record: LoopRecord, now: float | None = None) -> Spent:
        return cls(
            usd=record.cost_usd,
            tokens=tokens_of(record),
            turns=record.total_turns,
            seconds=active_seconds(record, time.time() if now is None else now),
        )

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    def plus(self, *, usd: float = 0.0, tokens: int = 0, seconds: float = 0.0) -> Spent:
        return replace(
            self, usd=self.usd + usd, tokens=self.tokens + tokens, seconds=self.seconds + seconds
        )

    def of_budget(self, name: str) -> float:
        return {
            "dollars": self.usd,
            "tokens": self.tokens,
            "turns": self.turns,
            "hours": self.hours,
        }[name]


def tokens_of(record: LoopRecord) -> int:
    """Every token the issue paid for: input, output, cache reads and writes, all roles."""
    return sum(
        u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens
        for u in record.usage.values()
    )


def alive_until(beat: str, last: float, now: float) -> float:
    """Until when a running loop's worker was working, from its heartbeat (``"TIME:TTL"``,
    written at each lease renewal): past its last beat by at most the lease's TTL (it
    renews every third of it), never past ``now``. A heartbeat that cannot be read
    counts up to ``now``, as without one."""
    try:
        at, _, ttl = beat.partition(":")
        alive = max(last, float(at)) + float(ttl)
    except ValueError:
        return now
    return min(now, alive)


def active_seconds(record: LoopRecord, now: float) -> float:
    """The time banked so far, plus the stretch since the last write if still active."""
    live = max(0.0, now - record.updated_at) if record.status in ACTIVE else 0.0
    return record.active_seconds + live


@dataclass(frozen=True)
class Call:
    """The most one model call can use: its input bound plus ``max_tokens`` of output."""

    tokens: int
    usd: float


def worst_call(model: str, input_tokens: int, max_tokens: int, write: float = CACHE_WRITE) -> Call:
    """Every input token priced as a cache write (``write`` times input: ``write_rate``
    of the request), every output token the call may write."""
    pin, pout = price_of(model)
    usd = (input_tokens * pin * write + max_tokens * pout) / 1_000_000
    return Call(tokens=input_tokens + max_tokens, usd=usd)


def write_rate(request: Any) -> float:
    """The most one input token of ``request`` can cost, as a multiple of the input
    price: ``CACHE_WRITE_1H`` when any ``cache_control`` in it (at any depth, wherever the
    API would take one) asks for a TTL other than the default 5 minutes, else
    ``CACHE_WRITE``. An unknown TTL counts as the dearest: the API refuses it, but a
    bound must not depend on that."""
    stack = [request]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            cache = item.get("cache_control")
            if isinstance(cache, dict) and cache.get("ttl", "5m") != "5m":
                return CACHE_WRITE_1H
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return CACHE_WRITE


def size(payload: Any) -> int:
    """UTF-8 bytes of ``payload`` as JSON: no token is shorter than a byte, so this bounds
    the tokens of the text it carries."""
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


# A request field the model gateway adds for the budget alone (never sent): a floor on the
# input bound, for content its bytes do not bound (an image or a PDF is billed by its
# pixels and pages, not its size).
MIN_INPUT = "min_input_tokens"


def input_bound(request: dict[str, Any]) -> int:
    """An upper bound on a request's input tokens, with nothing known about it."""
    sized = size({k: v for k, v in request.items() if k not in ("max_tokens", MIN_INPUT)})
    return max(sized + HIDDEN_TOKENS, int(request.get(MIN_INPUT) or 0))


def grown_bound(counted: int, added: list[dict[str, Any]]) -> int:
    """An upper bound on the input of a call whose conversation is the previous call's
    (``counted``: its input, cache and output tokens, as the API counted them) plus the
    ``added`` messages."""
    return counted + size(added)


@dataclass(frozen=True)
class Exhausted:
    """Which budget is used up (one of ``NAMES``), with the numbers and how to raise it."""

    budget: str
    detail: str


def before_turn(b: Budget, s: Spent, call: Call | None = None) -> Exhausted | None:
    """Whether a new turn may start: every budget must have something left, and with
    ``call`` (the smallest call the turn could make), enough for that call."""
    if s.turns >= b.turns:
        return _out(b, "turns", f"{s.turns} of {b.turns} turns used over the issue's life")
    return _used_up(b, s) if call is None else _fits(b, s, call)


def before_call(b: Budget, s: Spent, call: Call) -> Exhausted | None:
    """Whether a model call whose worst case is ``call`` fits what is left.

    ``s`` includes the turn in progress, so turns are exhausted only past the limit.
    """
    if s.turns > b.turns:
        return _out(b, "turns", f"{s.turns} of {b.turns} turns used over the issue's life")
    return _fits(b, s, call)


def smallest_call(model: str, max_tokens: int) -> Call:
    """The least a call's worst case can be: a conversation only grows, so no call of a
    turn is smaller than a bare request (its hidden tokens) plus ``max_tokens``."""
    return worst_call(model, HIDDEN_TOKENS, max_tokens)


def _fits(b: Budget, s: Spent, call: Call) -> Exhausted | None:
    if (used := _used_up(b, s)) is not None:
        return used
    if s.usd + call.usd > b.usd:
        return _out(
            b,
            "dollars",
            f"{_usd(s.usd)} of {_usd(b.usd)} spent; the next call could cost up to "
            f"{_usd(call.usd)}",
        )
    if s.tokens + call.tokens > b.tokens:
        return _out(
            b,
            "tokens",
            f"{s.tokens:,} of {b.tokens:,} tokens used; the next call could use up to "
            f"{call.tokens:,}",
        )
    return None


def _used_up(b: Budget, s: Spent) -> Exhausted | None:
    if s.hours >= b.hours:
        return _out(b, "hours", f"{_hours(s.hours)} h of {_hours(b.hours)} h used")
    if s.usd >= b.usd:
        return _out(b, "dollars", f"{_usd(s.usd)} of {_usd(b.usd)} spent")
    if s.tokens >= b.tokens:
        return _out(b, "tokens", f"{s.tokens:,} of {b.tokens:,} tokens used")
    return None


_TITLES = {
    "dollars": "dollar budget",
    "tokens": "token budget",
    "turns": "turn budget",
    "hours": "wall-clock budget",
}


def _out(b: Budget, name: str, numbers: str) -> Exhausted:
    return Exhausted(name, f"{_TITLES[name]}: {numbers}. {how_to_raise(b, name)}")


def how_to_raise(b: Budget, name: str) -> str:
    """What a person does to give the loop more of budget ``name``."""
    key, env = KEYS[name]
    cap = b.ceiling(name)
    if b.limit(name) >= cap:
        return (
            f"It is already at the operator's ceiling ({_amount(name, cap)}, `{env}`): the "
            "operator who runs loopbot must raise that before `/loop-restart` can go on"
        )
    return (
        f"To go on, raise `{key}` in `{repo_config.CONFIG_PATH}` (up to "
        f"{_amount(name, cap)}, the operator's ceiling `{env}`), then comment `/loop-restart`"
    )


def refusal(
    b: Budget, record: LoopRecord, call: Call | None = None, now: float | None = None
) -> str:
    """Why ``/loop-restart`` (or the ready label again) may not resume ``record``: "" when
    every budget has something left (with ``call``, enough for that call). A restart
    never refills a budget."""
    out = before_turn(b, Spent.of(record, now), call)
    return "" if out is None else f"this loop has used its {out.detail}"


def line(record: LoopRecord, now: float | None = None) -> str:
    """``budget: $x of $y · tokens a of b · turns c of d · time e of f`` from the record
    (empty before the loop first ran and stored its limits)."""
    limits = record.budget_limits
    if not all(n in limits for n in NAMES):
        return ""
    s = Spent.of(record, now)
    return (
        f"budget: {_usd(s.usd)} of {_usd(limits['dollars'])}"
        f" · tokens {_count(s.tokens)} of {_count(int(limits['tokens']))}"
        f" · turns {s.turns} of {int(limits['turns'])}"
        f" · time {duration(s.hours * 3600)} of {duration(limits['hours'] * 3600)}"
    )


def table(record: LoopRecord, now: float | None = None) -> dict[str, dict[str, float]]:
    """Spent and limit per budget, for the dashboard ({} before the loop first ran)."""
    limits = record.budget_limits
    if not all(n in limits for n in NAMES):
        return {}
    s = Spent.of(record, now)
    return {n: {"spent": round(s.of_budget(n), 6), "limit": limits[n]} for n in NAMES}


def _usd(v: float) -> str:
    return f"${v:.2f}"


def _hours(v: float) -> str:
    return f"{v:.3g}"


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.3g}M"
    if n >= 10_000:
        return f"{n / 1000:.3g}k"
    return f"{n:,}"


def _amount(name: str, v: float) -> str:
    return {
        "dollars": _usd(v),
        "tokens": f"{int(v):,} tokens",
        "turns": f"{int(v)} turns",
        "hours": f"{v:g} h",
    }[name]
