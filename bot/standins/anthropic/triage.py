"""loopbot's readiness triage call (bot/core/rules/triage.py), known by its schema: it has
a script and a record of its own, so the scripts tests write for the agent and the critic
stay theirs."""

from __future__ import annotations

from typing import Any

from bot.standins.anthropic.replies import Reply, structured
from bot.standins.anthropic.wire import Json

# A triage request is known by its schema's top-level keys. Tests script its answers apart
# from the conversation's (``AnthropicServer.play_triage``), so a script written for the
# agent and the critic is not consumed by it; unscripted, it is answered "ready".
TRIAGE_KEYS = ("readiness", "proposed_criteria")


def is_triage(body: Json) -> bool:
    """Whether ``body`` asks for loopbot's readiness triage (its JSON schema says so)."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    props = schema.get("properties") if isinstance(schema, dict) else None
    return isinstance(props, dict) and all(k in props for k in TRIAGE_KEYS)


def triage_answer(
    readiness: str = "ready",
    *,
    outcome: str = "",
    reasons: tuple[str, ...] = (),
    criteria: tuple[str, ...] = (),
    sub_issues: tuple[tuple[str, str], ...] = (),
    **kw: Any,
) -> Reply:
    """A triage answer in its schema."""
    return structured(
        {
            "readiness": readiness,
            "checkable_outcome": outcome,
            "reasons": list(reasons) or [f"the local model's {readiness} verdict"],
            "proposed_criteria": list(criteria),
            "sub_issues": [{"title": t, "body": b} for t, b in sub_issues],
        },
        **kw,
    )
