"""The check before each model call: the call's worst case against the issue's budget.

A cheap bound first: the request's bytes (no token is shorter than a byte), or the
previous call's tokens as the API counted them plus the bytes added since. Only when
that bound does not fit does the API count the request's input exactly
(``messages.count_tokens``): calls near the edge are neither refused for a loose bound
nor let past the budget, and every other call costs no extra round trip.
"""

from __future__ import annotations

from typing import Any

import anthropic

from bot.core.record import LoopRecord
from bot.core.repo_config import Ceilings
from bot.core.rules import budget
from bot.core.rules.budget import Budget, Exhausted, Spent
from bot.core.settings import Settings
from bot.io.logs import get_logger

log = get_logger("loopbot.precall")


class OverBudget(Exception):
    """The call was not made: it could cross the issue's budget (the message says which)."""


def guard(
    client: anthropic.Anthropic,
    request: dict[str, Any],
    record: LoopRecord | None,
    settings: Settings,
) -> None:
    """Raise ``OverBudget`` unless ``request`` fits the budget the loop stored on
    ``record`` (read just before the call, so it counts every call made so far)."""
    if record is None:
        return
    limits = Budget.stored(record, Ceilings.of(settings))
    if limits is None:
        return
    out = check(client, request, limits, Spent.of(record))
    if out is not None:
        raise OverBudget(out.detail)


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
    client: anthropic.Anthropic,
    request: dict[str, Any],
    limits: Budget,
    spent: Spent,
    bound: int | None = None,
) -> tuple[Exhausted | None, budget.Call]:
    """``check``, and the worst case it judged the call by: what a call that times out
    or is cut off is charged (it may have reached the API and been billed)."""
    model, max_tokens = str(request["model"]), int(request["max_tokens"])
    if bound is None:
        bound = budget.input_bound(request)
    worst = budget.worst_call(model, bound, max_tokens)
    out = budget.before_call(limits, spent, worst)
    if out is None:
        return None, worst
    if budget.before_call(limits, spent, budget.worst_call(model, 0, max_tokens)) is not None:
        return out, worst  # not even an empty request fits: counting cannot help
    counted = count_input(client, request)
    if counted is None or counted >= bound:
        return out, worst  # no better number: the bound stands, and the call is not made
    worst = budget.worst_call(model, counted, max_tokens)
    return budget.before_call(limits, spent, worst), worst


def count_input(client: anthropic.Anthropic, request: dict[str, Any]) -> int | None:
    """The request's input tokens as the API counts them; None when it cannot say."""
    try:
        counted = client.messages.count_tokens(
            **{k: v for k, v in request.items() if k != "max_tokens"}
        )
    except anthropic.APIError as exc:
        log.warning("precall.count_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        return None
    return int(counted.input_tokens)
