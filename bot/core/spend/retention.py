"""How long a loop's record is kept, and what of it outlives that: pure rules.

A loop's detailed state (its event stream, conversation and agent session) expires
``EVENTS_TTL_SECONDS`` after it was last written (``bot.io.store``). Its record is kept
``LOOPBOT_RETENTION_DAYS`` after it ended; then it is archived: the few fields the spend
report reads (``ARCHIVED``) are kept, a few hundred bytes, and the rest goes."""

from __future__ import annotations

from typing import Any

from bot.core.record import TERMINAL, LoopRecord

# What the report (bot/core/spend/report.py) reads of a loop, and nothing else.
ARCHIVED = frozenset(
    {
        "repo",
        "issue",
        "installation_id",
        "status",
        "reason",
        "backend",
        "usage",
        "cost_usd",
        "total_turns",
        "critic_round",
        "created_at",
        "updated_at",
        "pr_number",
        "merge_sha",
    }
)


def expired(record: LoopRecord, now: float, days: int) -> bool:
    """Whether ``record`` ended more than ``days`` ago (an active loop never expires)."""
    return record.status in TERMINAL and record.updated_at < now - days * 86_400


def compact(record: LoopRecord) -> dict[str, Any]:
    """The record as the archive keeps it."""
    return record.model_dump(mode="json", include=set(ARCHIVED))
