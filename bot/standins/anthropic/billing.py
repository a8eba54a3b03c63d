"""What the API bills for an answer it gave, from the answer's own usage: what a test
holds loopbot's charges and budgets against.

The multipliers are Anthropic's prompt-caching page's, applied here on their own (not
loopbot's ``Price.cache_write``): a 5-minute cache write costs 1.25x the base input price,
a 1-hour write 2x, whatever loopbot thinks. The base prices (input, output, cache read)
are the table in ``bot.core.pricing``, at the long tier when the prompt passes it.
"""

from __future__ import annotations

from typing import Any

from bot.core.pricing import price

WRITE_5M = 1.25
WRITE_1H = 2.0


def billed_usd(model: str, usage: dict[str, Any]) -> float:
    """USD the API bills for one answer's ``usage`` (its ``cache_creation`` split by TTL;
    without one, every write is a 5-minute one, the API's default)."""

    def n(node: Any, key: str) -> int:
        value = node.get(key) if isinstance(node, dict) else None
        return value if isinstance(value, int) and value > 0 else 0

    inp, out = n(usage, "input_tokens"), n(usage, "output_tokens")
    read, written = n(usage, "cache_read_input_tokens"), n(usage, "cache_creation_input_tokens")
    split = usage.get("cache_creation")
    long = min(n(split, "ephemeral_1h_input_tokens"), written)
    short = written - long
    p = price(model)
    if p.long is not None and inp + read + written > p.long_above:
        p = p.long
    cost = (
        inp * p.input
        + out * p.output
        + read * p.cache_read
        + short * p.input * WRITE_5M
        + long * p.input * WRITE_1H
    )
    return cost / 1_000_000
