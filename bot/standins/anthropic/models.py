"""The catalogue of models (``ModelSpec``, ``default_models``) and how ``GET /v1/models``
describes one (``model_info``): what the other checks read a model's limits from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bot.standins.anthropic.wire import Json

# The output limit the server enforces on ``max_tokens`` (Sonnet 4.5's and Haiku 4.5's:
# https://platform.claude.com/docs/en/about-claude/models/overview); more is a 400.
MAX_OUTPUT_TOKENS = 64_000

Lifecycle = Literal["active", "deprecated", "retired"]
EFFORTS = ("low", "medium", "high", "xhigh", "max")
THINKING_TYPES = ("adaptive", "enabled", "disabled", "between_tools")


@dataclass(frozen=True)
class ModelSpec:
    """One model of the catalogue, as ``GET /v1/models/{id}`` describes it.

    ``window`` is ``max_input_tokens``, ``max_output`` is ``max_tokens``; ``thinking`` the
    ``thinking.type`` values a request may send, ``efforts`` the ``output_config.effort``
    levels; ``min_cache_tokens`` the shortest prefix the prompt cache stores.
    """

    id: str
    display_name: str = ""
    window: int = 200_000
    max_output: int = MAX_OUTPUT_TOKENS
    lifecycle: Lifecycle = "active"
    deprecated_at: str | None = None
    retires_at: str | None = None
    thinking: frozenset[str] = frozenset({"adaptive", "disabled"})
    efforts: tuple[str, ...] = ("low", "medium", "high")
    min_cache_tokens: int = 1024
    created_at: str = "2025-01-01T00:00:00Z"
    line: str | None = None
    system_messages: bool = False  # mid-conversation system messages (Opus 4.8 only)


def default_models() -> dict[str, ModelSpec]:
    """The catalogue a new server starts with: every model name the tests, the demo and the
    benchmarks send, and one of each lifecycle and thinking style."""
    budget_only = frozenset({"enabled", "disabled"})
    specs = [
        ModelSpec("claude-test", "Claude Test", line="sonnet"),
        ModelSpec(
            "claude-sonnet-5-5",
            "Claude Sonnet 5.5",
            window=1_000_000,
            max_output=128_000,
            efforts=EFFORTS,
            created_at="2026-06-01T00:00:00Z",
            line="sonnet",
        ),
        ModelSpec(
            "claude-opus-4-8",
            "Claude Opus 4.8",
            window=1_000_000,
            max_output=128_000,
            efforts=EFFORTS,
            created_at="2026-09-01T00:00:00Z",
            line="opus",
            system_messages=True,
        ),
        ModelSpec(
            "claude-sonnet-4-6",
            "Claude Sonnet 4.6",
            thinking=frozenset({"adaptive", "enabled", "disabled"}),
            efforts=("low", "medium", "high", "max"),
            min_cache_tokens=2048,
            created_at="2026-02-17T00:00:00Z",
            line="sonnet",
        ),
        ModelSpec(
            "claude-haiku-4-5",
            "Claude Haiku 4.5",
            thinking=budget_only,
            efforts=(),
            min_cache_tokens=4096,
            created_at="2025-10-01T00:00:00Z",
            line="haiku",
        ),
        ModelSpec(
            "claude-sonnet-4-5",
            "Claude Sonnet 4.5",
            lifecycle="deprecated",
            deprecated_at="2026-05-29T00:00:00Z",
            retires_at="2026-11-30T00:00:00Z",
            thinking=budget_only,
            efforts=(),
            created_at="2025-09-29T00:00:00Z",
            line="sonnet",
        ),
        ModelSpec(
            "claude-3-5-haiku-20241022",
            "Claude Haiku 3.5",
            max_output=8192,
            lifecycle="retired",
            deprecated_at="2025-12-19T00:00:00Z",
            retires_at="2026-02-19T00:00:00Z",
            thinking=frozenset({"disabled"}),
            efforts=(),
            min_cache_tokens=2048,
            created_at="2024-10-22T00:00:00Z",
            line="haiku",
        ),
    ]
    return {s.id: s for s in specs}


def model_info(spec: ModelSpec, window: int | None = None) -> Json:
    """``spec`` in the shape of the SDK's ``ModelInfo`` (every capability key present)."""

    def sup(flag: bool) -> Json:
        return {"supported": flag}

    return {
        "type": "model",
        "id": spec.id,
        "display_name": spec.display_name or spec.id,
        "created_at": spec.created_at,
        "max_input_tokens": window if window is not None else spec.window,
        "max_tokens": spec.max_output,
        "lifecycle": spec.lifecycle,
        "deprecated_at": spec.deprecated_at,
        "retires_at": spec.retires_at,
        "line": spec.line,
        "capabilities": {
            "batch": sup(True),
            "citations": sup(True),
            "code_execution": sup(False),
            "context_management": {"supported": False},
            "effort": {
                "supported": bool(spec.efforts),
                **{e: sup(e in spec.efforts) for e in EFFORTS},
            },
            "image_input": sup(True),
            "pdf_input": sup(True),
            "server_tools": {
                "supported": False,
                "code_execution": sup(False),
                "web_search": sup(False),
            },
            "structured_outputs": sup(True),
            "thinking": {
                "supported": bool(spec.thinking & {"adaptive", "enabled"}),
                "types": {t: sup(t in spec.thinking) for t in THINKING_TYPES},
            },
        },
    }
