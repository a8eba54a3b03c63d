"""JSON log lines: the same text as structlog's own JSONRenderer writes, one line each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from bot.io.logs import _encode, configure, get_logger


class Custom:
    def __structlog__(self) -> str:
        return "custom form"


class Plain:
    def __repr__(self) -> str:
        return "<plain>"


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from([Custom(), Plain(), Path("/tmp/x"), b"bytes"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(), VALUES, max_size=8))
def test_json_lines_are_what_structlogs_renderer_writes(event_dict: dict[str, Any]) -> None:
    # Objects JSON has no type for go through the same fallback: __structlog__, else repr.
    default = structlog.processors.JSONRenderer()(None, "info", dict(event_dict))
    assert _encode(dict(event_dict)) == default


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.mark.usefixtures("restore_logging")
def test_json_format_writes_one_line_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    configure("json")
    log = get_logger("loopbot.test")  # a new proxy: earlier loggers cached the old config
    log.info("webhook.enqueued", delivery="d-1", issue=7, ms=0.53, job=Custom())
    log.debug("webhook.ignored", delivery="d-2")  # below INFO: not written
    log.warning("webhook.replay", delivery="d-3")
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "delivery": "d-1",
            "issue": 7,
            "ms": 0.53,
            "job": "custom form",
            "event": "webhook.enqueued",
            "level": "info",
            "timestamp": json.loads(lines[0])["timestamp"],
        },
        {
            "delivery": "d-3",
            "event": "webhook.replay",
            "level": "warning",
            "timestamp": json.loads(lines[1])["timestamp"],
        },
    ]
    # The fields in the order given, then structlog's own: what a reader's columns expect.
    assert list(json.loads(lines[0])) == [
        "delivery",
        "issue",
        "ms",
        "job",
        "event",
        "level",
        "timestamp",
    ]
    assert all(json.loads(line)["timestamp"].endswith("Z") for line in lines)
