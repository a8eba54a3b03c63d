"""What a maintainer reads agrees with itself, read on a two-turn loop with one sev1 round:
turns counted over the issue's life everywhere, the latest verify named as the timeline
names it, durations as people read them, loopbot's own pull request a link, the merge
receipt naming its head once."""

from __future__ import annotations

import pytest

from bot.core.record import LoopRecord, Status
from bot.core.rules.loop import budget
from bot.core.text import messages
from bot.core.text.numbers import duration, plural

PR_URL = "https://github.com/o/r/pull/2"


def two_turn_loop() -> LoopRecord:
    """Turn 1 coded and opened PR #2; the critic's sev1 sent it back; turn 2 (the first
    of its new round) passed verify and is under review again."""
    r = LoopRecord(repo="o/r", issue=1, installation_id=1)
    r.status = Status.REVIEWING
    r.turn, r.total_turns, r.max_turns, r.critic_round = 1, 2, 5, 1
    r.pr_number, r.pr_url = 2, PR_URL
    r.last_verify = {"turn": 1, "total": 2, "passed": True, "exit_code": 0, "seconds": 3.2}
    r.active_seconds = 3.0
    r.budget_limits = {"dollars": 10.0, "tokens": 1e6, "turns": 40, "hours": 12.0}
    return r


TIMELINE = [
    "turn 1 — verify passed",
    "PR #2 opened",
    "review round 1 — 1 sev1",
    "back to coding (findings)",
    "turn 2 — verify passed",
    "review round 2 — reviewing…",
]


def test_the_status_comment_counts_turns_as_its_timeline_does() -> None:
    r = two_turn_loop()
    body = messages.status_comment(r, timeline_lines=TIMELINE)
    assert "turn 2 (1 of 5 this round)" in body  # not "turn 1 of 5" under "turn 2 — …"
    assert "Latest verify (turn 2): ✅ passed, exit 0, 3.2 s" in body
    assert "Last verify (turn 1)" not in body
    assert "time 3 s of 12 h" in body and "0.000793" not in body
    assert f"- [x] [PR #2]({PR_URL}) opened" in body  # loopbot's own pull request: a link


def test_the_squash_message_counts_turns_over_the_issues_life() -> None:
    message = messages.merge_message(two_turn_loop(), "a" * 40)
    assert message.startswith("Merged by loopbot after 2 turns and 1 review round;")


def test_a_fresh_loop_reads_as_before() -> None:
    r = two_turn_loop()
    r.turn = r.total_turns = 1
    assert "turn 1 of 5" in messages.status_line(r)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.35, "0.3 s"),
        (3.0, "3 s"),
        (3.25, "3.2 s"),
        (45, "45 s"),
        (240, "4 min"),
        (5400, "1.5 h"),
        (43200, "12 h"),
    ],
)
def test_durations_read_as_people_say_them(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_counts_carry_their_noun() -> None:
    assert (plural(1, "turn"), plural(2, "turn"), plural(0, "review round")) == (
        "1 turn",
        "2 turns",
        "0 review rounds",
    )
    assert budget.line(two_turn_loop()).endswith("turns 2 of 40 · time 3 s of 12 h")
