"""The red team's ways past redaction, each now a test that must fail to leak.

A secret is "leaked" when any 8-character piece of it survives: a clipped title or a
defused line that keeps half a token is as bad as the whole one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from bot.core.text import sessionlog
from bot.core.text.redact import MARK, Redactor, deep, url_secrets
from bot.core.text.timeline import timeline

WEBHOOK = "9f8e7d6c5b4a39281706f5e4d3c2b1a0deadbeef"
TOKEN = "ghs_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
REDIS_PASSWORD = "p@ss#123word"
REDACT = Redactor([WEBHOOK, REDIS_PASSWORD])


def pieces(secret: str, size: int = 8) -> list[str]:
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


def assert_no_piece(text: str, *secrets: str) -> None:
    for secret in secrets:
        for piece in pieces(secret):
            assert piece not in text, (piece, text[:400])


def verify_event(tail: str) -> dict[str, Any]:
    return {
        "id": "1-0",
        "kind": "verify",
        "at": 1.0,
        "data": {"turn": 1, "passed": False, "tail": tail},
    }


def test_a_secret_late_in_verify_output_is_not_clipped_into_the_timeline() -> None:
    # The timeline names the failing line, clipped: it used to clip before redacting.
    event = verify_event("E   AssertionError: expected webhook token " + WEBHOOK)
    lines = timeline([event], redact=REDACT)
    assert_no_piece("\n".join(lines), WEBHOOK)


def test_a_defused_password_in_the_timeline_is_still_redacted() -> None:
    # safe_text puts a word joiner after "@x" and "#1": redaction must come first.
    event = verify_event("RuntimeError: redis auth " + REDIS_PASSWORD)
    lines = timeline([event], redact=REDACT)
    text = "\n".join(lines).replace("\u2060", "")
    assert REDIS_PASSWORD not in text and "123word" not in text


def test_a_token_at_the_end_of_a_long_line_is_not_clipped_into_a_title() -> None:
    conversation = [
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": [{"type": "text", "text": "y" * 145 + " " + TOKEN}]},
    ]
    entries = sessionlog.build(conversation, [], Redactor())
    assert_no_piece(json.dumps(entries), TOKEN)


def test_keys_are_redacted_as_well_as_values() -> None:
    data = {"app.py|hard coded webhook secret " + WEBHOOK: 2, "nested": {TOKEN: 1}}
    assert_no_piece(json.dumps(deep(data, REDACT)), WEBHOOK, TOKEN)


def test_a_redis_password_in_the_query_string_is_a_secret() -> None:
    found = url_secrets("redis://redis:6379/0?password=Sup3rS3cretRedis")
    assert "Sup3rS3cretRedis" in found
    assert Redactor(found)("pw is Sup3rS3cretRedis") == f"pw is {MARK}"


def test_overlapping_secrets_leave_nothing_behind() -> None:
    redact = Redactor(["AAAAAAAA1234", "1234BBBBBBBB"])
    assert redact("x AAAAAAAA1234BBBBBBBB y") == f"x {MARK} y"


@pytest.mark.parametrize("size", [64 * 1024, 1024 * 1024])
def test_a_crafted_tool_result_cannot_make_redaction_quadratic(size: int) -> None:
    # "x-access-token:" repeated took 40 s at 256 KB before; linear now. The bound is
    # loose on purpose: it catches a quadratic pattern, not a slow machine.
    text = ("x-access-token:" * (size // 15 + 1))[:size]
    started = time.perf_counter()
    REDACT(text)
    assert time.perf_counter() - started < 5.0


def test_real_remote_urls_are_still_redacted() -> None:
    url = f"https://x-access-token:{TOKEN}@github.com/acme/widgets.git"
    assert REDACT(url) == f"https://x-access-token:{MARK}@github.com/acme/widgets.git"
