"""One structured call: a request whose answer must be JSON in a schema (the API's
``output_config.format``), held to the issue's budget and charged (``precall.call``),
the answer parsed, and asked again with the problem named when it does not parse.
Triage and the planner are made of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bot.core.models import merged
from bot.core.record import LoopRecord
from jobs import precall
from jobs.runtime import Runtime

T = TypeVar("T")


@dataclass(frozen=True)
class Answer(Generic[T]):
    value: T | None  # None: no attempt parsed (``problem`` says why)
    model: str  # the model that answered last (a fallback may differ from the one asked)
    cost: float  # every attempt's, in dollars
    problem: str = ""


def ask(
    rt: Runtime,
    *,
    model: str,
    max_tokens: int,
    system: str,
    prompt: str,
    schema: dict[str, Any],
    parse: Callable[[str], T],
    record: Callable[[], LoopRecord | None],
    charge: precall.Charge,
    attempts: int = 1,
    params: dict[str, Any] | None = None,
    on_invalid: Callable[[int, str], None] = lambda attempt, problem: None,
    blocks: list[dict[str, Any]] | None = None,
    spend: precall.Gate | None = None,
) -> Answer[T]:
    """Ask ``prompt`` for JSON in ``schema``, up to ``attempts`` times; ``parse`` turns the
    answer's text into the value or raises ``ValueError`` (a pydantic ``ValidationError``
    is one) naming the problem, which the next attempt is told. ``record`` is read before
    each call, for the budget check (None: no loop, no budget). Raises what
    ``precall.call`` raises: ``OverBudget``, the SDK's errors."""
    # ``blocks``: images and documents (an issue's attachments) before the prompt's words.
    first: str | list[dict[str, Any]] = (
        [*blocks, {"type": "text", "text": prompt}] if blocks else prompt
    )
    history: list[dict[str, Any]] = [{"role": "user", "content": first}]
    cost, problem, answered_by = 0.0, "", model
    for attempt in range(1, attempts + 1):
        request: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "system": system,
            "messages": history,
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
        if params:
            request = merged(request, params)
        resp, used = precall.call(
            rt.model, request, record=record(), settings=rt.settings, charge=charge, spend=spend
        )
        cost += used.cost_usd
        answered_by = resp.model or model
        text = "".join(b.text for b in resp.content if b.type == "text")
        try:
            return Answer(parse(text), answered_by, cost)
        except ValueError as exc:
            problem = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            on_invalid(attempt, problem)
            history += [
                {"role": "assistant", "content": text or "(empty)"},
                {
                    "role": "user",
                    "content": f"That answer did not match the schema ({problem}). "
                    "Answer again with JSON only, in the schema.",
                },
            ]
    return Answer(None, answered_by, cost, problem)
