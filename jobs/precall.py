"""The check before each model call: the call's worst case against the issue's budget.

A cheap bound first: the request's bytes (no token is shorter than a byte), or the
previous call's tokens as the API counted them plus the bytes added since. Only when
that bound does not fit does the API count the request's input exactly
(``messages.count_tokens``): calls near the edge are neither refused for a loose bound
nor let past the budget, and every other call costs no extra round trip.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import anthropic

from bot.core.pricing import usage_from
from bot.core.record import LoopRecord, Usage
from bot.core.repo_config import Ceilings
from bot.core.rules.loop import budget
from bot.core.rules.loop.budget import Budget, Exhausted, Spent
from bot.core.settings import Settings
from bot.io.logs import get_logger

log = get_logger("loopbot.precall")


class OverBudget(Exception):
    """The call was not made: it could cross the issue's budget (the message says which)."""

    # What the model gateway tells the CLI before the message (a spend cap's own words
    # name it: ``jobs.spend.OverCap``).
    prefix = "the issue's budget is spent: "


Counter = Callable[[dict[str, Any]], int | None]


class Gate(Protocol):
    """The spend caps above the loop (``jobs.spend.SpendGate``): asked after the issue's
    budget with the call's worst case (raises ``OverBudget`` when a cap is full), told
    what the call was billed."""

    def admit(self, worst: budget.Call) -> None: ...

    def charge(self, model: str, used: Usage) -> None: ...


def guard(
    client: anthropic.Anthropic | None,
    request: dict[str, Any],
    record: LoopRecord | None,
    settings: Settings,
    count: Counter | None = None,
    spend: Gate | None = None,
) -> budget.Call:
    """Raise ``OverBudget`` unless ``request`` fits the budget the loop stored on
    ``record`` (read just before the call, so it counts every call made so far) and, with
    ``spend``, the spend caps above the loop (its worst case reserved under them). Returns
    the call's worst case, the figure it was judged by. ``count``: how the request's input
    is counted near the edge (default: Anthropic's ``count_tokens`` with ``client``)."""
    model, max_tokens = str(request["model"]), int(request["max_tokens"])
    limits = Budget.stored(record, Ceilings.of(settings)) if record is not None else None
    if record is None or limits is None:
        rate = budget.write_rate(request)
        worst = budget.worst_call(model, budget.input_bound(request), max_tokens, rate)
    else:
        out, worst = check_worst(client, request, limits, Spent.of(record), count=count)
        if out is not None:
            raise OverBudget(out.detail)
    if spend is not None:
        spend.admit(worst)
    return worst


Charge = Callable[[str, Usage], None]


def call(
    client: anthropic.Anthropic,
    request: dict[str, Any],
    *,
    record: LoopRecord | None,
    settings: Settings,
    charge: Charge,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    spend: Gate | None = None,
) -> tuple[Any, Usage]:
    """One model call of loopbot's own (triage, planner, critic), held to the budget:
    ``guard`` first; refusals (429, 5xx, 529, not billed) retried as the API asks, up to
    ``LOOPBOT_MODEL_RETRIES``; an attempt that times out or loses its connection may have
    been billed, so it is charged at the worst case ``guard`` allowed before the error is
    raised (the SDK never resends it unchecked). The answer is charged as the API counted
    it. With ``spend``, each attempt is held to the spend caps too, and charged there.
    Returns the response and its usage."""
    worst = guard(client, request, record, settings, spend=spend)
    if spend is not None:
        charge = _both(charge, spend)
    model, max_tokens = str(request["model"]), int(request["max_tokens"])
    options: dict[str, Any] = {"max_retries": 0}
    if timeout is not None:
        options["timeout"] = timeout
    sender = client.with_options(**options)
    refused = 0
    while True:
        try:
            resp = sender.messages.create(**request)
        except (anthropic.APITimeoutError, anthropic.APIConnectionError):
            charge(model, worst_usage(worst, max_tokens))
            raise
        except (anthropic.RateLimitError, anthropic.InternalServerError) as exc:
            if refused < settings.model_retries and retryable(exc):
                refused += 1
                sleep(retry_delay(exc.response.headers, refused))
                if spend is not None:  # refused, not billed: reserved again for the retry
                    spend.admit(worst)
                continue
            raise
        name = resp.model or model
        used = usage_from(name, resp.usage)
        charge(name, used)
        return resp, used


def _both(charge: Charge, spend: Gate) -> Charge:
    def both(model: str, used: Usage) -> None:
        spend.charge(model, used)
        charge(model, used)

    return both


def worst_usage(worst: budget.Call, max_tokens: int) -> Usage:
    """``worst`` as a charge: every output token, the rest input priced as cache writes."""
    output = min(max_tokens, worst.tokens)
    return Usage(
        cache_write_tokens=worst.tokens - output,
        output_tokens=output,
        messages=1,
        cost_usd=worst.usd,
    )


def retryable(exc: anthropic.APIStatusError) -> bool:
    return exc.response.headers.get("x-should-retry") != "false"


def retry_delay(headers: Any, attempt: int) -> float:
    """Seconds before retrying a refused call: the API's ``retry-after`` (or
    ``retry-after-ms``) when it is sensible, else the SDK's backoff: 0.5 s doubling to 8 s,
    less up to a quarter at random."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            seconds: float = float(headers.get(name)) * scale
        except (TypeError, ValueError):
            continue
        if 0 <= seconds <= 60:
            return seconds
    backoff: float = min(0.5 * 2.0 ** (attempt - 1), 8.0)
    return backoff * (1 - 0.25 * random.random())


def check(
    client: anthropic.Anthropic,
    request: dict[str, Any],
    limits: Budget,
    spent: Spent,
    bound: int | None = None,
) -> Exhausted | None:
    """None when ``request`` may be sent: ``spent`` plus its worst case (``bound`` input
    tokens, default the request's bytes, and ``max_tokens`` of output) fits ``limits``.
    Otherwise which budget it would cross, and nothing is sent."""
    return check_worst(client, request, limits, spent, bound)[0]


def check_worst(
    client: anthropic.Anthropic | None,
    request: dict[str, Any],
    limits: Budget,
    spent: Spent,
    bound: int | None = None,
    count: Counter | None = None,
) -> tuple[Exhausted | None, budget.Call]:
    """``check``, and the worst case it judged the call by: what a call that times out
    or is cut off is charged (it may have reached the API and been billed)."""
    model, max_tokens = str(request["model"]), int(request["max_tokens"])
    if bound is None:
        bound = budget.input_bound(request)
    rate = budget.write_rate(request)  # 2x input when it asks for a 1-hour cache write
    worst = budget.worst_call(model, bound, max_tokens, rate)
    out = budget.before_call(limits, spent, worst)
    if out is None:
        return None, worst
    if budget.before_call(limits, spent, budget.worst_call(model, 0, max_tokens)) is not None:
        return out, worst  # not even an empty request fits: counting cannot help
    if count is not None:
        counted = count(request)
    else:
        counted = count_input(client, request) if client is not None else None
    if counted is None or counted >= bound:
        return out, worst  # no better number: the bound stands, and the call is not made
    worst = budget.worst_call(model, counted, max_tokens, rate)
    return budget.before_call(limits, spent, worst), worst


def count_input(client: anthropic.Anthropic, request: dict[str, Any]) -> int | None:
    """The request's input tokens as the API counts them; None when it cannot say."""
    try:
        counted = client.messages.count_tokens(
            **{k: v for k, v in request.items() if k not in ("max_tokens", budget.MIN_INPUT)}
        )
    except anthropic.APIError as exc:
        log.warning("precall.count_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        return None
    return int(counted.input_tokens)
