"""USD per million tokens for the models loopbot supports, as Anthropic's pricing page
listed them on ``PRICES_TAKEN`` (``PRICES_URL``). Each model has its own cache prices:
a 5-minute cache write is 1.25x input everywhere, a 1-hour cache write 2x input
(``cache_write_1h``), a cache read 0.1x input on most models but less on some (Opus 5.5:
0.05x; Fable and Mythos 5.1: 0.025x). An answer's usage says how many of its cache writes
were of each TTL (``cache_creation``), and each is priced at its own rate.

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
# A 1-hour cache write's price, as a multiple of the model's input price.
CACHE_WRITE_1H = 2.0


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float  # a 5-minute cache write (loopbot's ``cache_control`` has no ttl)
    cache_read: float  # a cache hit or refresh
    long: Price | None = None  # above ``long_above`` prompt tokens, where the model has a tier
    long_above: int = LONG_PROMPT

    @property
    def highest(self) -> Price:
        return self.long or self

    @property
    def cache_write_1h(self) -> float:
        """A 1-hour cache write: 2x input on every model (an agent in the sandbox may ask
        for one through the gateway; loopbot's own requests never do)."""
        return self.input * CACHE_WRITE_1H


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


# OpenAI's models (the codex backend, through the gateway's Responses side), USD per
# million tokens as OpenAI's pricing page and model pages listed them on
# ``OPENAI_PRICES_TAKEN`` (read through third-party copies of those pages: check them
# against https://developers.openai.com/api/docs/pricing before relying on them). A
# request over 272K input tokens is billed whole at the long tier: 2x input and cache,
# 1.5x output. Where no cache-write price is published the write is priced at 1.25x
# input: more than OpenAI charges, never less.
OPENAI_PRICES_TAKEN = date(2026, 11, 25)
OPENAI_LONG_PROMPT = 272_000


def _openai(inp: float, out: float, cached: float, write: float | None = None) -> Price:
    write = inp * 1.25 if write is None else write
    long = Price(inp * 2, out * 1.5, write * 2, cached * 2)
    return Price(inp, out, write, cached, long=long, long_above=OPENAI_LONG_PROMPT)


OPENAI_PRICES: dict[str, Price] = {
    "gpt-6.1-sol": _openai(2.0, 10.0, 0.10, 2.5),
    "gpt-6-sol": _openai(2.0, 10.0, 0.20, 2.5),
    "gpt-6-luna": _openai(0.10, 0.50, 0.01, 0.125),
    "gpt-5.6-sol": _openai(5.0, 30.0, 0.50),
    "gpt-5.6-terra": _openai(2.5, 15.0, 0.25),
    "gpt-5.6-luna": _openai(1.0, 6.0, 0.10),
    "gpt-5.5": _openai(5.0, 30.0, 0.50),
    "gpt-5.5-pro": _openai(30.0, 180.0, 30.0),
    "gpt-5.4": _openai(2.5, 15.0, 0.25),
    "gpt-5.4-mini": _openai(0.75, 4.5, 0.075),
    "gpt-5.4-nano": _openai(0.20, 1.25, 0.02),
}


def _most(table: dict[str, Price]) -> Price:
    return Price(
        input=max(p.highest.input for p in table.values()),
        output=max(p.highest.output for p in table.values()),
        cache_write=max(p.highest.cache_write for p in table.values()),
        cache_read=max(p.highest.cache_read for p in table.values()),
    )


# Unknown models: the most any listed model of the same maker charges for each kind of
# token (an unknown OpenAI model is priced as GPT-5.5 Pro's long tier).
UNKNOWN = _most(PRICES)
OPENAI_UNKNOWN = _most(OPENAI_PRICES)
_DATED = re.compile(r"-\d{8}$")  # a snapshot id: claude-haiku-4-5-20251001
_OPENAI_DATED = re.compile(r"-\d{4}-\d{2}-\d{2}$")  # gpt-5.5-2026-04-23
_OPENAI_ID = re.compile(r"^(gpt-|o\d|codex-|chatgpt-)")


def is_openai(model: str) -> bool:
    """Whether ``model`` names an OpenAI model (the codex backend's), by its id."""
    return bool(_OPENAI_ID.match(model))


def price(model: str) -> Price:
    """The model's prices: by its id, or its alias when the id is a dated snapshot; an
    unlisted model (a new one, or a stand-in's) costs ``UNKNOWN`` (``OPENAI_UNKNOWN`` for
    an OpenAI id)."""
    if is_openai(model):
        return (
            OPENAI_PRICES.get(model)
            or OPENAI_PRICES.get(_OPENAI_DATED.sub("", model))
            or OPENAI_UNKNOWN
        )
    return PRICES.get(model) or PRICES.get(_DATED.sub("", model)) or UNKNOWN


def known(model: str) -> bool:
    p = price(model)
    return p is not UNKNOWN and p is not OPENAI_UNKNOWN


def price_of(model: str) -> tuple[float, float]:
    """(input, output) per million tokens at the model's highest tier: what a bound on
    a call's cost (``bot.core.rules.loop.budget``) must assume."""
    p = price(model).highest
    return p.input, p.output


def usage_from(model: str, u: object) -> Usage:
    """A ``Usage`` with cost, from the SDK's usage object (or the same fields read from a
    stream). Its ``cache_creation`` (an object or a dict) splits the cache writes by TTL:
    the 1-hour ones are priced at ``cache_write_1h``, the rest at ``cache_write``."""
    inp = int(getattr(u, "input_tokens", 0) or 0)
    out = int(getattr(u, "output_tokens", 0) or 0)
    cw = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    cr = int(getattr(u, "cache_read_input_tokens", 0) or 0)
    long_writes = min(_one_hour(getattr(u, "cache_creation", None)), cw)
    p = price(model)
    if p.long is not None and inp + cw + cr > p.long_above:
        p = p.long
    cost = (
        inp * p.input
        + out * p.output
        + (cw - long_writes) * p.cache_write
        + long_writes * p.cache_write_1h
        + cr * p.cache_read
    ) / 1_000_000
    return Usage(
        input_tokens=inp,
        output_tokens=out,
        cache_write_tokens=cw,
        cache_read_tokens=cr,
        messages=1,
        cost_usd=cost,
    )


def _one_hour(split: object) -> int:
    """The 1-hour cache writes of a usage's ``cache_creation`` (an SDK object or a dict)."""
    value = (
        split.get("ephemeral_1h_input_tokens")
        if isinstance(split, dict)
        else getattr(split, "ephemeral_1h_input_tokens", 0)
    )
    return value if isinstance(value, int) and value > 0 else 0


def usage_from_responses(model: str, usage: dict[str, object]) -> Usage:
    """A ``Usage`` with cost, from a Responses API ``usage`` object: ``input_tokens``
    counts every input token, of which ``input_tokens_details`` says how many were read
    from the prompt cache (``cached_tokens``) and written to it (``cache_write_tokens``);
    ``output_tokens`` includes the reasoning tokens."""

    def number(node: object, key: str) -> int:
        value = node.get(key) if isinstance(node, dict) else None
        return value if isinstance(value, int) and value > 0 else 0

    total = number(usage, "input_tokens")
    details = usage.get("input_tokens_details")
    cached = min(number(details, "cached_tokens"), total)
    written = min(number(details, "cache_write_tokens"), total - cached)

    class _Anthropic:  # the same figures as usage_from reads them
        input_tokens = total - cached - written
        output_tokens = number(usage, "output_tokens")
        cache_creation_input_tokens = written
        cache_read_input_tokens = cached

    return usage_from(model, _Anthropic())
