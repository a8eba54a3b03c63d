"""The catalogue of models (``ModelSpec``, ``default_models``) and how ``GET /v1/models``
describes one: what the checks read a model's limits from."""

from __future__ import annotations

from dataclasses import dataclass

from bot.standins.openai.wire import Json

ALL_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")


@dataclass(frozen=True)
class ModelSpec:
    """One model of the catalogue. ``window``: the most input tokens a request may hold;
    ``max_output``: the highest ``max_output_tokens``; ``efforts``: the ``reasoning.effort``
    levels it takes; ``sampling``: whether it takes ``temperature`` and ``top_p`` (the
    reasoning models do not)."""

    id: str
    window: int = 272_000
    max_output: int = 128_000
    efforts: tuple[str, ...] = ("low", "medium", "high")
    created: int = 1_767_225_600  # 2026-01-01
    sampling: bool = False


def default_models() -> dict[str, ModelSpec]:
    """The catalogue a new server starts with."""
    sol = ("low", "medium", "high", "xhigh", "max", "ultra")
    specs = [
        ModelSpec("gpt-6.1-sol", 872_000, 128_000, sol, created=1_790_000_000),
        ModelSpec("gpt-6-sol", 872_000, 128_000, sol, created=1_785_000_000),
        ModelSpec("gpt-6-luna", 872_000, 128_000, sol[:-1], created=1_785_000_000),
        ModelSpec("gpt-5.5", 272_000, 128_000, sol[:-2], created=1_776_902_400),
    ]
    return {s.id: s for s in specs}


def model_info(spec: ModelSpec) -> Json:
    """``spec`` as ``GET /v1/models/{id}`` describes it (OpenAI's says no more)."""
    return {"id": spec.id, "object": "model", "created": spec.created, "owned_by": "openai"}
