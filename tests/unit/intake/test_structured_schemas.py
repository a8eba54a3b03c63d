"""Every JSON schema loopbot sends in ``output_config.format`` is one the Messages API
compiles (the local model server refuses what the API refuses: bounds it cannot express,
objects without ``additionalProperties: false``)."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.rules import triage
from bot.core.rules.pull.review import output_schema
from bot.standins.anthropic import format_invalid
from jobs.intake import plan


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "schema": schema}


@pytest.mark.parametrize(
    "schema",
    [output_schema([]), output_schema(["F1", "F2"]), triage.output_schema(), plan.SCHEMA],
    ids=["critic", "critic-asked", "triage", "planner"],
)
def test_loopbots_schemas_compile(schema: dict[str, Any]) -> None:
    assert format_invalid(fmt(schema)) is None


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "object", "properties": {}}, "additionalProperties"),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"n": {"type": "integer", "minimum": 1}},
            },
            "property 'minimum' is not supported",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "xs": {
                        "type": "array",
                        "maxItems": 3,
                        "items": {"type": "string", "maxLength": 9},
                    }
                },
            },
            "property 'maxItems' is not supported",
        ),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"o": {"type": "object", "properties": {}}},
            },
            "additionalProperties",
        ),
    ],
)
def test_what_the_api_refuses_is_refused(schema: dict[str, Any], why: str) -> None:
    out = format_invalid(fmt(schema))
    assert out is not None and why in out
    assert format_invalid({"type": "json", "schema": {}}) is not None
