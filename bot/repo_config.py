"""``.github/loop.yml``: the repository's contract with loopbot, validated strictly.

Unknown keys are errors, not silently ignored: a typo such as ``max_turn`` would
otherwise run a loop with a limit the maintainer did not choose.
"""

from __future__ import annotations

import re
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

CONFIG_PATH = ".github/loop.yml"
STEP_CAP = 200  # the harness's own ceiling, whatever a repository asks for


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CriticConfig(_Strict):
    enabled: bool = True
    max_rounds: int = Field(3, ge=1, le=20)
    large_diff_lines: int = Field(400, ge=1)


class MergeConfig(_Strict):
    enabled: bool = True
    method: Literal["squash"] = "squash"
    require_checks: bool = True
    wait_checks_minutes: int = Field(60, ge=1)
    max_fix_turns: int = Field(2, ge=0, le=10)
    # Paths loopbot never merges changes to on its own: the agent could otherwise rewrite
    # the CI that judges it. ``dir/**`` is everything under dir; other patterns are globs.
    protected_paths: tuple[str, ...] = (".github/**",)


class LabelsConfig(_Strict):
    ready: str = Field("loop:ready", min_length=1)
    needs_human: str = Field("loop:needs-human", min_length=1)


_HOST = re.compile(
    r"^\.?(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


class SandboxConfig(_Strict):
    # false: no network; true: any public host; a list: only these hosts (``.example.org``
    # also allows its subdomains). Always through loopbot's egress proxy, never loopback,
    # private, link-local or metadata addresses.
    network: bool | tuple[str, ...] = False
    timeout_seconds: int = Field(600, ge=1, le=3600)

    @field_validator("network")
    @classmethod
    def _hosts(cls, v: bool | tuple[str, ...]) -> bool | tuple[str, ...]:
        if isinstance(v, bool):
            return v
        if not v:
            raise ValueError("a list of host names must name at least one host")
        hosts = tuple(h.strip().lower() for h in v)
        bad = [h for h in hosts if not _HOST.match(h)]
        if bad:
            raise ValueError(f"not host names: {', '.join(bad)} (no schemes, ports or paths)")
        return hosts


class RepoConfig(_Strict):
    verify: str = Field(min_length=1)
    setup: str | None = None
    max_turns: int = Field(20, ge=1, le=100)
    max_steps: int = Field(200, ge=0)
    tool_budget: int = Field(400, ge=1)
    max_cost_usd: float = Field(10.0, gt=0)
    critic: CriticConfig = CriticConfig()
    merge: MergeConfig = MergeConfig()
    labels: LabelsConfig = LabelsConfig()
    sandbox: SandboxConfig = SandboxConfig()

    @property
    def step_cap(self) -> int:
        return min(self.max_steps, STEP_CAP)


class ConfigError(Exception):
    """The file is missing, not YAML, or breaks the schema; ``problems`` name the keys."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


DEFAULT_LABELS = LabelsConfig()


def parse(text: str | None) -> RepoConfig:
    if text is None:
        raise ConfigError([f"{CONFIG_PATH} is missing; it needs at least a `verify` command"])
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{CONFIG_PATH} is not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{CONFIG_PATH} must be a mapping of keys to values"])
    try:
        return RepoConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden":
                problems.append(f"`{key}`: unknown key")
            elif err["type"] == "missing":
                problems.append(f"`{key}`: required")
            else:
                problems.append(f"`{key}`: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(problems) from None


def ready_label(text: str | None) -> str:
    """The ready label even from a broken file, so a bad config can still be reported."""
    try:
        data = yaml.safe_load(text or "")
        label = data.get("labels", {}).get("ready") if isinstance(data, dict) else None
        return label if isinstance(label, str) and label else DEFAULT_LABELS.ready
    except (yaml.YAMLError, AttributeError):
        return DEFAULT_LABELS.ready
