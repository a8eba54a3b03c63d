"""Models (bot.core.models): a spec from the Models API's answer, the thinking and effort a
request may carry, the effort ceiling, and how a model stands for new work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from anthropic.types import ModelInfo

from bot.core.models import (
    EFFORTS,
    ModelSpec,
    clamp_effort,
    fallback_spec,
    merged,
    rank,
    spec_from_info,
    standing,
    thinking_params,
)

ALL = frozenset(EFFORTS)
SONNET = ModelSpec("claude-sonnet-5-5", 1_000_000, 128_000, adaptive=True, efforts=ALL)
HAIKU = ModelSpec("claude-haiku-4-5", 200_000, 64_000, adaptive=False, efforts=frozenset())
NOW = datetime(2026, 11, 23, tzinfo=UTC)


def info(
    *,
    adaptive: bool = True,
    thinking: bool = True,
    efforts: tuple[str, ...] = EFFORTS,
    effort_supported: bool = True,
    **fields: Any,
) -> dict[str, Any]:
    """A ModelInfo as the SDK parses it, dumped to plain values as jobs.models does."""

    def sup(flag: bool) -> dict[str, bool]:
        return {"supported": flag}

    effort: dict[str, Any] = {"supported": effort_supported}
    effort |= {e: sup(e in efforts) for e in EFFORTS}
    raw = {
        "type": "model",
        "id": "claude-sonnet-5-5",
        "display_name": "Claude Sonnet 5.5",
        "created_at": "2026-09-28T00:00:00Z",
        "lifecycle": "active",
        "max_input_tokens": 1_000_000,
        "max_tokens": 128_000,
        "capabilities": {
            "batch": sup(True),
            "citations": sup(True),
            "code_execution": sup(False),
            "context_management": {"supported": False},
            "effort": effort,
            "image_input": sup(True),
            "pdf_input": sup(True),
            "server_tools": {
                "supported": False,
                "code_execution": sup(False),
                "web_search": sup(False),
            },
            "structured_outputs": sup(True),
            "thinking": {
                "supported": thinking,
                "types": {
                    "adaptive": sup(adaptive),
                    "enabled": sup(not adaptive),
                    "disabled": sup(True),
                    "between_tools": sup(False),
                },
            },
        },
        **fields,
    }
    return ModelInfo.model_validate(raw).model_dump()


# -- spec_from_info ----------------------------------------------------------------------


def test_spec_from_a_current_model() -> None:
    spec = spec_from_info(info(), window=1, max_output=1)
    assert spec == SONNET


def test_spec_of_a_model_with_extended_thinking_only() -> None:
    spec = spec_from_info(
        info(id="claude-haiku-4-5", adaptive=False, efforts=(), effort_supported=False),
        window=1,
        max_output=1,
    )
    assert (spec.adaptive, spec.efforts) == (False, frozenset())


def test_spec_takes_only_the_effort_levels_marked_supported() -> None:
    spec = spec_from_info(info(efforts=("low", "medium", "high")), window=1, max_output=1)
    assert spec.efforts == {"low", "medium", "high"}
    # A level marked supported under an effort capability that is not: none at all.
    off = spec_from_info(info(effort_supported=False), window=1, max_output=1)
    assert off.efforts == frozenset()


def test_adaptive_needs_thinking_itself_supported() -> None:
    assert not spec_from_info(info(thinking=False), window=1, max_output=1).adaptive


def test_spec_of_a_deprecated_model_keeps_its_retirement() -> None:
    spec = spec_from_info(
        info(
            lifecycle="deprecated",
            deprecated_at="2026-05-29T00:00:00Z",
            retires_at="2026-11-30T00:00:00Z",
        ),
        window=1,
        max_output=1,
    )
    assert spec.lifecycle == "deprecated"
    assert spec.retires_at == datetime(2026, 11, 30, tzinfo=UTC)


def test_limits_the_api_leaves_out_come_from_the_operator() -> None:
    spec = spec_from_info(
        info(max_input_tokens=None, max_tokens=None), window=150_000, max_output=32_000
    )
    assert (spec.window, spec.max_output) == (150_000, 32_000)


def test_an_answer_without_capabilities_is_taken_as_supporting_nothing() -> None:
    spec = spec_from_info({"id": "x", "max_input_tokens": 5}, window=1, max_output=2)
    assert spec == ModelSpec("x", 5, 2, adaptive=False, efforts=frozenset())


def test_retirement_as_an_iso_string_is_read() -> None:
    spec = spec_from_info({"id": "x", "retires_at": "2027-01-02T00:00:00Z"}, window=1, max_output=1)
    assert spec.retires_at == datetime(2027, 1, 2, tzinfo=UTC)


# -- thinking_params ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "effort", "expected"),
    [
        (SONNET, None, {"thinking": {"type": "adaptive"}}),
        (
            SONNET,
            "xhigh",
            {"thinking": {"type": "adaptive"}, "output_config": {"effort": "xhigh"}},
        ),
        # An effort the model does not take is dropped: the API would answer 400.
        (
            ModelSpec("m", 1, 1, adaptive=True, efforts=frozenset({"low", "high"})),
            "max",
            {"thinking": {"type": "adaptive"}},
        ),
        (
            ModelSpec("m", 1, 1, adaptive=True, efforts=frozenset()),
            "low",
            {"thinking": {"type": "adaptive"}},
        ),
        # No adaptive thinking: nothing at all, whatever the effort.
        (HAIKU, "high", {}),
        (ModelSpec("m", 1, 1, adaptive=False, efforts=ALL), "high", {}),
    ],
)
def test_thinking_params(spec: ModelSpec, effort: str | None, expected: dict[str, Any]) -> None:
    assert thinking_params(spec, effort) == expected


def test_a_fallback_guess_asks_for_nothing_a_model_could_refuse() -> None:
    guess = fallback_spec("claude-new", 200_000, 64_000)
    assert not guess.known and thinking_params(guess, "high") == {}
    assert (guess.window, guess.max_output) == (200_000, 64_000)


def test_merged_keeps_the_critics_format_beside_the_effort() -> None:
    request = {"model": "m", "output_config": {"format": {"type": "json_schema"}}}
    out = merged(request, thinking_params(SONNET, "low"))
    assert out["output_config"] == {"format": {"type": "json_schema"}, "effort": "low"}
    assert out["thinking"] == {"type": "adaptive"}
    assert request == {"model": "m", "output_config": {"format": {"type": "json_schema"}}}


# -- effort ceiling ------------------------------------------------------------------------


def test_efforts_are_ordered_least_first() -> None:
    assert [rank(e) for e in EFFORTS] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        rank("ultra")


@pytest.mark.parametrize(
    ("asked", "ceiling", "expected"),
    [
        ("max", "high", "high"),
        ("xhigh", "high", "high"),
        ("high", "high", "high"),
        ("low", "high", "low"),
        (None, "low", None),
        ("medium", "low", "low"),
    ],
)
def test_clamp_effort(asked: Any, ceiling: Any, expected: Any) -> None:
    assert clamp_effort(asked, ceiling) == expected


# -- standing ------------------------------------------------------------------------------


def test_a_retired_model_fails() -> None:
    s = standing(ModelSpec("m", 1, 1, False, frozenset(), lifecycle="retired"), NOW)
    assert s.fail and "retired" in s.why


def test_a_deprecated_model_warns_with_its_retirement_date() -> None:
    when = datetime(2026, 11, 30, tzinfo=UTC)
    s = standing(ModelSpec("m", 1, 1, False, frozenset(), "deprecated", when), NOW)
    assert (s.fail, s.warn) == (False, True) and "2026-11-30" in s.why


def test_an_active_model_retiring_soon_warns_and_one_retiring_later_does_not() -> None:
    soon = ModelSpec("m", 1, 1, True, ALL, retires_at=NOW + timedelta(days=59))
    later = ModelSpec("m", 1, 1, True, ALL, retires_at=NOW + timedelta(days=61))
    s = standing(soon, NOW)
    assert s.warn and not s.fail and (NOW + timedelta(days=59)).date().isoformat() in s.why
    assert standing(later, NOW) == standing(SONNET, NOW)
    assert not standing(SONNET, NOW).warn and not standing(SONNET, NOW).fail
