"""What loopbot knows about a model, and the thinking and effort it may ask of it.

Plain values: the Models API (``GET /v1/models/{id}``) is read by ``jobs.models``; here
its answer becomes a ``ModelSpec`` and the spec decides what a request may carry. A
request never carries a thinking type or an effort level the model does not accept: the
API answers those with a 400, which would fail the loop on a setting, not on its work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

DEFAULT_MODEL = "claude-sonnet-5-5"
Effort = Literal["low", "medium", "high", "xhigh", "max"]
EFFORTS: tuple[Effort, ...] = get_args(Effort)  # ordered, least first: the operator's ceiling
Lifecycle = Literal["active", "deprecated", "retired"]
# ``loopbot doctor`` warns this long before a model's scheduled retirement.
RETIREMENT_WARNING = timedelta(days=60)


@dataclass(frozen=True)
class ModelSpec:
    id: str
    window: int  # max_input_tokens
    max_output: int  # max_tokens
    adaptive: bool  # accepts thinking {"type": "adaptive"}
    efforts: frozenset[str]  # effort levels accepted; empty: send no effort
    lifecycle: str = "active"  # active | deprecated | retired
    retires_at: datetime | None = None
    known: bool = True  # False: a fallback guess (the Models API could not say)


def fallback_spec(model: str, window: int, max_output: int) -> ModelSpec:
    """A guess for a model the Models API could not be asked about: the operator's
    window and output limit, and nothing the model might refuse (no thinking, no effort)."""
    return ModelSpec(model, window, max_output, adaptive=False, efforts=frozenset(), known=False)


def _supported(node: Any, *path: str) -> bool:
    for key in path:
        if not isinstance(node, Mapping):
            return False
        node = node.get(key)
    return isinstance(node, Mapping) and node.get("supported") is True


def _when(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def spec_from_info(info: Mapping[str, Any], *, window: int, max_output: int) -> ModelSpec:
    """A spec from the Models API's ``ModelInfo`` as plain values (``model_dump()``).
    ``window`` and ``max_output`` stand in for limits the API leaves null. A capability
    the answer does not mention is taken as not supported."""
    caps = info.get("capabilities") or {}
    effort = caps.get("effort") if isinstance(caps, Mapping) else None
    efforts: frozenset[str] = frozenset()
    if isinstance(effort, Mapping) and effort.get("supported") is True:
        efforts = frozenset(e for e in EFFORTS if _supported(effort, e))
    return ModelSpec(
        id=str(info["id"]),
        window=int(info.get("max_input_tokens") or window),
        max_output=int(info.get("max_tokens") or max_output),
        adaptive=_supported(caps, "thinking", "types", "adaptive") and _supported(caps, "thinking"),
        efforts=efforts,
        lifecycle=str(info.get("lifecycle") or "active"),
        retires_at=_when(info.get("retires_at")),
    )


def rank(effort: str) -> int:
    """An effort's place in ``EFFORTS`` (low is 0); ValueError for anything else."""
    return EFFORTS.index(effort)


def clamp_effort(asked: Effort | None, ceiling: Effort) -> Effort | None:
    """``asked`` lowered to ``ceiling`` when above it; None (the model's default) stays."""
    if asked is None or rank(asked) <= rank(ceiling):
        return asked
    return ceiling


def thinking_params(spec: ModelSpec, effort: str | None) -> dict[str, Any]:
    """The request fields for adaptive thinking at ``effort`` (None: the model's default).

    ``{}`` for a model without adaptive thinking. An effort the model does not accept is
    dropped, never sent: the model then thinks at its own default."""
    if not spec.adaptive:
        return {}
    params: dict[str, Any] = {"thinking": {"type": "adaptive"}}
    if effort is not None and effort in spec.efforts:
        params["output_config"] = {"effort": effort}
    return params


def merged(request: dict[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` with ``params`` added; a field both hold as objects (``output_config``
    with the critic's ``format`` and an ``effort``) keeps the keys of both."""
    out = dict(request)
    for key, value in params.items():
        mine = out.get(key)
        if isinstance(mine, Mapping) and isinstance(value, Mapping):
            out[key] = {**mine, **value}
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Standing:
    """How a model stands for new work: ``fail`` (do not use it), ``warn``, or fine."""

    fail: bool
    warn: bool
    why: str


def standing(spec: ModelSpec, now: datetime, soon: timedelta = RETIREMENT_WARNING) -> Standing:
    """Retired fails; deprecated warns (with its retirement date); an active model whose
    retirement is scheduled within ``soon`` warns, naming the date. ``now`` is aware (UTC),
    as the API's dates are."""
    when = spec.retires_at.date().isoformat() if spec.retires_at else None
    if spec.lifecycle == "retired":
        return Standing(True, False, "retired: the API refuses every request naming it")
    if spec.lifecycle == "deprecated":
        date = f", retires {when}" if when else ""
        return Standing(False, True, f"deprecated{date}: move to an active model")
    if spec.retires_at is not None and spec.retires_at - now <= soon:
        return Standing(False, True, f"retires {when}: move to an active model before then")
    return Standing(False, False, "active")
