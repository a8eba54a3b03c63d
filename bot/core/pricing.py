"""USD per million tokens, per model family. Cache writes cost 1.25x input (5-minute
cache), cache reads 0.1x input, as Anthropic's pricing page lists them."""

from __future__ import annotations

from bot.core.record import Usage

# (input, output) in USD per million tokens.
PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4": (15.0, 75.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4-7": (5.0, 25.0),
    "claude-opus-4-8": (5.0, 25.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-haiku-4": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
}
DEFAULT = (3.0, 15.0)  # unknown models are priced as Sonnet, the likely default


def price_of(model: str) -> tuple[float, float]:
    # Longest matching prefix: "claude-opus-4-5-20251101" -> "claude-opus-4-5".
    best = ""
    for prefix in PRICES:
        if model.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return PRICES[best] if best else DEFAULT


def usage_from(model: str, u: object) -> Usage:
    """A ``Usage`` with cost, from the SDK's usage object."""
    inp = int(getattr(u, "input_tokens", 0) or 0)
    out = int(getattr(u, "output_tokens", 0) or 0)
    cw = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    cr = int(getattr(u, "cache_read_input_tokens", 0) or 0)
    pin, pout = price_of(model)
    cost = (inp * pin + out * pout + cw * pin * 1.25 + cr * pin * 0.1) / 1_000_000
    return Usage(
        input_tokens=inp,
        output_tokens=out,
        cache_write_tokens=cw,
        cache_read_tokens=cr,
        messages=1,
        cost_usd=cost,
    )
