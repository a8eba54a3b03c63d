"""Prices (bot.core.pricing): every listed model priced, its own cache prices used, an
unlisted model never cheaper than any listed one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bot.core.pricing import (
    LONG_PROMPT,
    PRICES,
    PRICES_TAKEN,
    PRICES_URL,
    UNKNOWN,
    known,
    price,
    price_of,
    usage_from,
)
from bot.core.rules.loop import budget


def usage(inp: int = 0, out: int = 0, cw: int = 0, cr: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        input_tokens=inp,
        output_tokens=out,
        cache_creation_input_tokens=cw,
        cache_read_input_tokens=cr,
    )


def test_the_table_says_when_and_where_it_was_taken() -> None:
    assert PRICES_TAKEN.isoformat() == "2026-11-23"
    assert PRICES_URL.startswith("https://platform.claude.com/")


@pytest.mark.parametrize("model", sorted(PRICES))
def test_every_listed_model_is_priced_and_cache_writes_cost_what_the_budget_assumes(
    model: str,
) -> None:
    for p in filter(None, (PRICES[model], PRICES[model].long)):
        assert p.input > 0 and p.output > p.input
        # A 5-minute cache write is 1.25x input: the most an input token can cost, which
        # is what bot.core.rules.loop.budget bounds a call with.
        assert p.cache_write == pytest.approx(p.input * budget.CACHE_WRITE)
        assert 0 < p.cache_read < p.input
    assert known(model)


@pytest.mark.parametrize(
    ("model", "inp", "out", "cw", "cr"),
    [
        ("claude-sonnet-5-5", 2.0, 10.0, 2.5, 0.2),
        ("claude-opus-5-5", 4.0, 20.0, 5.0, 0.2),
        ("claude-fable-5-1", 10.0, 50.0, 12.5, 0.25),
        ("claude-haiku-4-5", 1.0, 5.0, 1.25, 0.1),
        ("claude-sonnet-4-6", 3.0, 15.0, 3.75, 0.3),
    ],
)
def test_each_model_is_charged_its_own_cache_prices(
    model: str, inp: float, out: float, cw: float, cr: float
) -> None:
    u = usage_from(model, usage(1_000_000, 1_000_000, 1_000_000, 1_000_000))
    assert u.cost_usd == pytest.approx(inp + out + cw + cr)
    only_reads = usage_from(model, usage(cr=1_000_000))
    assert only_reads.cost_usd == pytest.approx(cr)
    assert (u.input_tokens, u.output_tokens, u.cache_write_tokens, u.cache_read_tokens) == (
        1_000_000,
        1_000_000,
        1_000_000,
        1_000_000,
    )


def test_a_dated_snapshot_is_priced_as_its_alias() -> None:
    assert price("claude-haiku-4-5-20251001") is PRICES["claude-haiku-4-5"]


@pytest.mark.parametrize(
    "model", ["claude-test", "claude-sonnet-5-6", "claude-opus-9", "claude-sonnet-5-5-preview"]
)
def test_an_unlisted_model_costs_the_most_of_every_kind(model: str) -> None:
    assert price(model) is UNKNOWN and not known(model)
    for p in PRICES.values():
        top = p.long or p
        assert UNKNOWN.input >= top.input and UNKNOWN.output >= top.output
        assert UNKNOWN.cache_write >= top.cache_write and UNKNOWN.cache_read >= top.cache_read
    assert price_of(model) == (UNKNOWN.input, UNKNOWN.output)


def test_haiku_5_5_bills_a_long_prompt_at_its_higher_prices() -> None:
    short = usage_from("claude-haiku-5-5", usage(LONG_PROMPT - 1000, 1000, 0, 1000))
    assert short.cost_usd == pytest.approx(
        ((LONG_PROMPT - 1000) * 0.1 + 1000 * 0.5 + 1000 * 0.01) / 1e6
    )
    # The prompt counts input, cache reads and cache writes; one token over, and every
    # token of the request, output included, is at the long prices.
    long = usage_from("claude-haiku-5-5", usage(LONG_PROMPT - 1000, 1000, 1, 1000))
    assert long.cost_usd == pytest.approx(
        ((LONG_PROMPT - 1000) * 0.5 + 1000 * 2.5 + 1 * 0.625 + 1000 * 0.05) / 1e6
    )
    # A bound on a call's cost cannot know the prompt's length: the higher tier.
    assert price_of("claude-haiku-5-5") == (0.5, 2.5)


def test_budget_bounds_use_the_model_price() -> None:
    cheap = budget.worst_call("claude-sonnet-5-5", 10_000, 1000)
    assert cheap.usd == pytest.approx((10_000 * 2.0 * 1.25 + 1000 * 10.0) / 1e6)
    assert budget.worst_call("claude-test", 10_000, 1000).usd > cheap.usd


def test_one_hour_cache_writes_are_priced_at_2x_input_from_the_usage_split() -> None:
    """An answer's ``cache_creation`` says how many writes were 1-hour ones (2x input,
    issue 37 item 2): each TTL at its own rate, an SDK object or a dict alike."""
    split = {"ephemeral_1h_input_tokens": 600_000, "ephemeral_5m_input_tokens": 400_000}
    for given in (split, SimpleNamespace(**split)):
        u = usage(cw=1_000_000)
        u.cache_creation = given
        assert usage_from("claude-sonnet-4-6", u).cost_usd == pytest.approx(
            0.6 * 3.0 * 2 + 0.4 * 3.75
        )
    # A split that claims more 1-hour writes than writes is held to the writes.
    u = usage(cw=1000)
    u.cache_creation = {"ephemeral_1h_input_tokens": 10**9}
    assert usage_from("claude-sonnet-4-6", u).cost_usd == pytest.approx(1000 * 6.0 / 1e6)


def test_a_request_asking_for_a_one_hour_write_anywhere_is_judged_at_2x_input() -> None:
    """The worst case of a call is judged at the dearest rate the request can incur:
    a 1-hour ``cache_control`` (or any TTL but the default), wherever it sits (a tool
    result's block inside a message), makes it 2x input; none, 1.25x."""
    plain = {"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]}
    five = {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]}
    nested = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {
                                "type": "text",
                                "text": "x",
                                "cache_control": {"type": "ephemeral", "ttl": "1h"},
                            }
                        ],
                    }
                ],
            }
        ]
    }
    odd = {"tools": [{"name": "t", "cache_control": {"type": "ephemeral", "ttl": "24h"}}]}
    assert budget.write_rate(plain) == budget.write_rate(five) == budget.CACHE_WRITE
    assert budget.write_rate(nested) == budget.write_rate(odd) == 2.0
    worst = budget.worst_call("claude-sonnet-4-6", 10_000, 0, budget.write_rate(nested))
    assert worst.usd == pytest.approx(10_000 * 3.0 * 2 / 1e6)
