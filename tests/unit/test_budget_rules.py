"""The hours budget's heartbeat rule: a running loop's time counts while its worker
beats (renews its lease), and stops a lease's TTL after the last beat."""

from __future__ import annotations

import pytest

from bot.core.rules.loop import budget


@pytest.mark.parametrize(
    ("beat", "last", "now", "until"),
    [
        ("100.0:30", 90.0, 110.0, 110.0),  # alive: beat 10 s ago, within its TTL
        ("100.0:30", 90.0, 500.0, 130.0),  # gone: last beat plus the TTL
        ("50.0:30", 90.0, 500.0, 120.0),  # no beat since the last write: from the write
        ("garbage", 90.0, 500.0, 500.0),  # unreadable: as without a heartbeat
        ("100.0:x", 90.0, 500.0, 500.0),
    ],
)
def test_a_running_loop_counts_until_its_worker_stopped_beating(
    beat: str, last: float, now: float, until: float
) -> None:
    assert budget.alive_until(beat, last, now) == until
