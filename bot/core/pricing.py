"""USD per million tokens for the models loopbot supports, as Anthropic's pricing page
listed them on ``PRICES_TAKEN`` (``PRICES_URL``). Each model has its own cache prices:
a 5-minute cache write is 1.25x input everywhere, a cache read 0.1x input on most models
but less on some (Opus 5.5: 0.05x; Fable and Mythos 5.1: 0.025x).

A model that is not in the table is priced as the most expensive one listed, field by
field: spend is never under-counted, and a budget never lets through a call it cannot
pay for. Retired models (Opus 4 and 4.1, Haiku 3.5, ...) are not listed: the API refuses
them, so they cost nothing; usage recorded under them earlier keeps its recorded cost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

from bot.core.record import Usage

PRICES_TAKEN = date(2026, 11, 23)
PRICES_URL = "https://platform.claude.com/docs/en/about-claude/pricing"
# Haiku 5.5 bills a request whose prompt (input, cache reads and writes) is longer than
# this at its ``long`` prices, every token of it, output included.
LONG_PROMPT = 100_000


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float  # a 5-minute cache write (loopbot's ``cache_control`` has no ttl)
    cache_read: float  # a cache hit or refresh
    long: Price | None = None  # above LONG_PROMPT prompt tokens, where the model has a tier

    @property
    def highest(self) -> Price:
        return self.long or self


_FABLE_51 = Price(10.0, 50.0, 12.5, 0.25)
_FABLE_5 = Price(10.0, 50.0, 12.5, 1.0)
_OPUS = Price(5.0, 25.0, 6.25, 0.5)
_SONNET_5 = Price(2.0, 10.0, 2.5, 0.2)
_SONNET_4 = Price(3.0, 15.0, 3.75, 0.3)

PRICES: dict[str, Price] = {
    "claude-fable-5-1": _FABLE_51,
    "claude-mythos-5-1": _FABLE_51,  # limited availability; Fable 5.1's prices
    "claude-fable-5": _FABLE_5,
    "claude-mythos-5": _FABLE_5,
    "claude-opus-5-5": Price(4.0, 20.0, 5.0, 0.2),
    "claude-opus-5": _OPUS,
    "claude-opus-4-8": _OPUS,
    "claude-opus-4-7": _OPUS,
    "claude-opus-4-6": _OPUS,
    "claude-opus-4-5": _OPUS,
    "claude-sonnet-5-5": _SONNET_5,
    "claude-sonnet-5": _SONNET_5,
    "claude-sonnet-4-6": _SONNET_4,
    "claude-sonnet-4-5": _SONNET_4,  # deprecated, retires 2026-11-30
    "claude-haiku-5-5": Price(0.1, 0.5, 0.125, 0.01, long=Price(0.5, 2.5, 0.625, 0.05)),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.1),
}
# Unknown models: the most any listed model charges for each kind of token.
UNKNOWN = Price(
    input=max(p.highest.input for p in PRICES.values()),
    output=max(p.highest.output for p in PRICES.values()),
    cache_write=max(p.highest.cache_write for p in PRICES.values()),
    cache_read=max(p.highest.cache_read for p in PRICES.values()),
)
_DATED = re.compile(r"-\d{8}$")  # a snapshot id: claude-haiku-4-5-20251001


def price(model: str) -> Price:
    """The model's prices: by its id, or its alias when the id is a dated snapshot; an
    unlisted model (a new one, or a stand-in's) costs ``UNKNOWN``."""
    return PRICES.get(model) or PRICES.get(_DATED.sub("", model)) or UNKNOWN


def known(model: str) -> bool:
    return price(model) is not UNKNOWN


def price_of(model: str) -> tuple[float, float]:
    """(input, output) per million tokens at the model's highest tier: what a bound on
    a call's cost (``bot.core.rules.budget``) must assume."""
    p = price(model).highest
    return p.input, p.output


def usage_from(model: str, u: object) -> Usage:
    """A ``Usage`` with cost, from the SDK's usage object."""
    inp = int(getattr(u, "input_tokens", 0) or 0)
    out = int(getattr(u, "output_tokens", 0) or 0)
    cw = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    cr = int(getattr(u, "cache_read_input_tokens", 0) or 0)
    p = price(model)
    if p.long is not None and inp + cw + cr > LONG_PROMPT:
        p = p.long
    cost = (inp * p.input + out * p.output + cw * p.cache_write + cr * p.cache_read) / 1_000_000
    return Usage(
        input_tokens=inp,
        output_tokens=out,
        cache_write_tokens=cw,
        cache_read_tokens=cr,
        messages=1,
        cost_usd=cost,
    )
