"""How big an event may be (``bot/core/rules/event_size.py``): what is kept of an event's
fields, however large or oddly shaped what the agent gave. Pure."""

from __future__ import annotations

import json

import pytest

from bot.core.rules import event_size as es


def test_a_long_string_is_cut_with_a_marker_saying_how_much() -> None:
    data = json.loads(es.bound({"text": "a" * 8_000_000, "step": 3}, 4000, 16 << 10))
    assert data["step"] == 3
    assert data["text"] == "a" * 4000 + "… [7996000 more characters cut]"


def test_short_fields_are_kept_as_they_are() -> None:
    fields = {"tool": "Bash", "input": {"command": "ls -l", "n": [1, 2.5, None, True]}}
    assert json.loads(es.bound(fields, 4000, 16 << 10)) == fields


@pytest.mark.parametrize(
    "fields",
    [
        {"input": {"cmd": "x" * (1 << 20)}, "title": "y" * (1 << 20)},
        {"input": {f"k{i}": "z" * 5000 for i in range(10_000)}},
        {"input": ["w" * 3000] * 50_000},
        {"changes": [{"path": "é" * 4000, "diff": "ü" * 4000}] * 90},  # escapes: 6 bytes each
        {"input": json.loads("[" * 900 + "]" * 900)},
        {f"f{i}": "v" * 100 for i in range(5000)},
    ],
)
def test_an_event_of_any_shape_fits_its_size(fields: dict[str, object]) -> None:
    for chars, size in ((es.FIELD_CHARS, es.EVENT_BYTES), (200, 1024)):
        data = es.bound(fields, chars, size)
        assert len(data) <= size
        json.loads(data)  # still an object a reader decodes


def test_what_is_cut_from_a_list_or_an_object_is_said() -> None:
    data = json.loads(
        es.bound({"xs": list(range(500)), "o": {str(i): i for i in range(150)}}, 40, 1 << 20)
    )
    assert data["xs"][:3] == [0, 1, 2] and data["xs"][-1] == "… 400 more items cut"
    assert data["o"]["…"] == "50 more keys cut" and len(data["o"]) == es.ITEMS + 1


def test_the_agents_kinds_are_budgeted_and_the_harness_kinds_are_not() -> None:
    assert {"agent_text", "agent_tool", "agent_result", "step"} <= es.BUDGETED
    assert not {"turn_started", "verify", "pushed", "merged", "events_capped"} & es.BUDGETED
