"""The webhook's log lines: one JSON line per delivery that did something, its fields in
a fixed order (delivery, event, action first), none for what it ignores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from redis import Redis

import bot.web.app as web_app
from bot.core import signature
from bot.core.settings import Settings
from bot.io.logs import configure, get_logger

SECRET = "local-webhook-secret"  # the local GitHub server's default


def labeled(sender_type: str = "User") -> dict[str, Any]:
    return {
        "action": "labeled",
        "issue": {"number": 4},
        "label": {"name": "loop:ready"},
        "sender": {"login": "alice", "type": sender_type},
        "installation": {"id": 5},
        "repository": {"full_name": "acme/widgets"},
    }


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def json_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production's JSON lines, to the stderr capsys reads; in the test itself, because
    capsys makes a new stderr between a test's set-up and its call."""
    configure("json")
    # A new proxy: the module's own one may have cached the console set-up already.
    monkeypatch.setattr(web_app, "log", get_logger("loopbot.web"))


def post(client: Any, payload: dict[str, Any], delivery: str) -> Any:
    body = json.dumps(payload).encode()
    return client.post(
        "/webhook",
        data=body,
        headers={
            "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signature.sign(SECRET, body),
        },
    )


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


@pytest.mark.usefixtures("restore_logging")
def test_each_delivery_logs_one_line_with_its_fields(
    settings: Settings,
    redis: Redis,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    json_log(monkeypatch)
    client = web_app.create_app(settings, redis).test_client()
    assert post(client, labeled(), "d-1").json == {"status": "queued", "job": "cmd-d-1"}
    [enqueued] = lines(capsys)
    assert list(enqueued) == [
        "delivery",
        "gh_event",
        "action",
        "kind",
        "repo",
        "issue",
        "actor",
        "job",
        "ms",
        "event",
        "level",
        "timestamp",
    ]
    assert enqueued | {"ms": 0, "timestamp": ""} == {
        "delivery": "d-1",
        "gh_event": "issues",
        "action": "labeled",
        "kind": "label_added",
        "repo": "acme/widgets",
        "issue": 4,
        "actor": "alice",
        "job": "cmd-d-1",
        "ms": 0,
        "event": "webhook.enqueued",
        "level": "info",
        "timestamp": "",
    }
    assert enqueued["ms"] > 0

    assert post(client, labeled(), "d-1").json == {"status": "duplicate"}
    [duplicate] = lines(capsys)
    assert list(duplicate) == ["delivery", "gh_event", "action", "event", "level", "timestamp"]
    assert (duplicate["delivery"], duplicate["event"]) == ("d-1", "webhook.duplicate")

    # An ignored delivery is a debug line: not written at the default level.
    assert post(client, labeled(sender_type="Bot"), "d-2").json["status"] == "ignored"
    assert lines(capsys) == []

    malformed = labeled()
    del malformed["label"]
    assert post(client, malformed, "d-3").status_code == 400
    [line] = lines(capsys)
    assert line | {"timestamp": ""} == {
        "delivery": "d-3",
        "gh_event": "issues",
        "action": "labeled",
        "reason": "issues.labeled payload: label: missing",
        "event": "webhook.malformed",
        "level": "warning",
        "timestamp": "",
    }
