"""``.github/loop.yml``: the repository's contract with loopbot, validated strictly.

Unknown keys are errors, not silently ignored: a typo such as ``max_turn`` would
otherwise run a loop with a limit the maintainer did not choose.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from bot.core.models import DEFAULT_MODEL, Effort, clamp_effort
from bot.core.pricing import is_openai
from bot.core.schedules import slots

if TYPE_CHECKING:
    from bot.core.settings import Settings

CONFIG_PATH = ".github/loop.yml"
STEP_CAP = 200  # the harness's own ceiling, whatever a repository asks for


class _Strict(BaseModel):
    # Each field's docstring is its description: docs/loop-yml.md is generated from them
    # (bot/ops/loop_yml_docs.py).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


Backend = Literal["builtin", "claude-code", "opencode", "codex"]
BACKENDS: tuple[Backend, ...] = ("builtin", "claude-code", "opencode", "codex")


_MCP_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# What loopbot and the backends set themselves: a repository cannot reach them this way.
_RESERVED_ENV = (
    "ANTHROPIC_",
    "OPENAI_",
    "CLAUDE_",
    "OPENCODE_",
    "CODEX_",
    "LOOPBOT_",
    "GITHUB_",
    "GH_",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "HOME",
    "PATH",
    "LD_",
    "GIT_",
)


class McpServer(_Strict):
    """A stdio MCP server the agent's backend starts inside the sandbox (in the worktree,
    with the sandbox's network): ``command`` and ``args`` run there, ``env`` is given to it
    (public values only: this file is in the repository)."""

    command: str = Field(min_length=1, max_length=500)
    """The server's command, run inside the sandbox, in the worktree."""
    args: tuple[str, ...] = Field((), max_length=32)
    """Its arguments."""
    env: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Environment variables given to it: public values only (this file is in the
    repository). Names loopbot or the backends set (`ANTHROPIC_*`, `OPENAI_*`,
    `LOOPBOT_*`, `GITHUB_*`, `GIT_*`, proxies, `PATH`, `HOME`, `LD_*`, ...) are refused."""

    @field_validator("args")
    @classmethod
    def _args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(len(a) > 1000 or "\0" in a for a in v):
            raise ValueError("an argument is over 1000 characters or holds a NUL")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str) -> str:
        if "\0" in v or "\n" in v:
            raise ValueError("the command holds a NUL or a newline")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"not an environment variable name: {name[:64]!r}")
            if name.startswith(_RESERVED_ENV) or name in _RESERVED_ENV:
                raise ValueError(f"{name} is loopbot's to set, not a repository's")
            if len(value) > 1000 or "\0" in value:
                raise ValueError(f"{name}: a value is at most 1000 characters, without NUL")
        return v


class AgentConfig(_Strict):
    model: str | None = Field(None, min_length=1, max_length=200)
    """The agent's model, one of the operator's `LOOPBOT_ALLOWED_MODELS`; another is
    replaced by the operator's default, and the issue is told. Unset: `LOOPBOT_MODEL`
    (for `codex`, an OpenAI model the file names, else `LOOPBOT_CODEX_MODEL`)."""
    effort: Effort | None = None
    """`low`, `medium`, `high`, `xhigh` or `max`, up to the operator's
    `LOOPBOT_MAX_EFFORT` (more is lowered to it); sent with adaptive thinking, to models
    that take it. Unset: `LOOPBOT_EFFORT`."""
    # jobs/agents/backends.py; one the operator does not allow is clamped by ``clamp``.
    backend: Backend = "builtin"
    """Who codes: `builtin` (loopbot's own agent, on the Messages API, from the worker),
    `claude-code`, `opencode` or `codex` (a CLI inside the sandbox, behind the model
    gateway), if the operator allows it (`LOOPBOT_AGENT_BACKENDS`); otherwise `builtin`,
    and the issue is told. A `loop:agent-<name>` label picks one for one issue."""
    # jobs/agents/mcp.py. The built-in agent runs each command in a fresh sandbox that ends
    # with it, and an MCP server must live across calls.
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict, max_length=8)
    """stdio MCP servers by name (lower-case letters, digits, `-` and `_`, at most 32
    characters), started by `claude-code`, `opencode` or `codex` inside the sandbox,
    with the sandbox's network. The built-in agent does not start them."""

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_names(cls, v: dict[str, McpServer]) -> dict[str, McpServer]:
        bad = [n for n in v if not _MCP_NAME.match(n)]
        if bad:
            raise ValueError(
                f"MCP server names are lower-case letters, digits, - and _ (at most 32): "
                f"{', '.join(repr(b[:40]) for b in bad)}"
            )
        return v


class CriticConfig(_Strict):
    enabled: bool = True
    """Whether the critic reviews the pull request and audits milestones' sections."""
    model: str | None = Field(None, min_length=1, max_length=200)
    """The critic's model, chosen as `agent.model` is. Unset: `LOOPBOT_CRITIC_MODEL`."""
    effort: Effort | None = None
    """As `agent.effort`, for the critic. Unset: `LOOPBOT_EFFORT`."""
    tools: bool = True  # jobs/review/tools.py
    """The critic may read files, search and run `verify` on the pull request's head,
    read-only, in the sandbox, so it checks claims against the code."""
    max_rounds: int = Field(3, ge=1, le=20)
    """Review rounds: `sev1` findings still standing after this many end the loop
    `failed` / `critic_rounds_exhausted`. Also the audits a milestone's section may
    take."""
    large_diff_lines: int = Field(400, ge=1)
    """An approval with no findings on a diff of more changed lines than this needs a
    person (`loop:needs-human`)."""


class MergeConfig(_Strict):
    enabled: bool = True
    """Whether the gate merges; `false`: the loop ends `completed` once reviewed, its
    pull request open ("merging is disabled for this repository")."""
    method: Literal["squash"] = "squash"
    """How the gate merges: squash only."""
    require_checks: bool = True
    """The gate waits for checks to pass (those the base branch requires, or every check
    on the head when it requires none); `false`: checks are not considered."""
    wait_checks_minutes: int = Field(60, ge=1)
    """How long the gate waits for pending checks."""
    max_fix_turns: int = Field(2, ge=0, le=10)
    """Turns the agent gets to fix failing checks and conflicts with the base."""
    approval_timeout_hours: int = Field(168, ge=1, le=24 * 90)
    """How long a loop waits for the approvals and resolved threads its base branch asks
    of people before it hands the pull request to a person (`loop:needs-human`)."""
    # The agent could otherwise rewrite the CI that judges it.
    protected_paths: tuple[str, ...] = (".github/**",)
    """A pull request touching these is never merged by loopbot: `loop:needs-human`,
    naming the files. `dir/**` is everything under dir; other patterns are globs.
    `.github/**` is always included, whatever the file says."""


class LabelsConfig(_Strict):
    ready: str = Field("loop:ready", min_length=1)
    """Added by someone with write access, starts a loop; removed, stops it."""
    needs_human: str = Field("loop:needs-human", min_length=1)
    """Put on an issue whose pull request a person must look at."""
    priority: str = Field("loop:priority-high", min_length=1)
    """A waiting loop whose issue carries this label goes before those that do not."""
    optimize: str = Field("loop:optimize", min_length=1)
    """Starts a metric loop (`metric:`)."""
    needs_spec: str = Field("loop:needs-spec", min_length=1)
    """Put on an issue that triage found not ready to code (no checkable outcome, or too
    large), with a proposed specification; a writer accepts it, then re-applies `ready`."""

    @model_validator(mode="after")
    def _distinct(self) -> LabelsConfig:
        # One label with two meanings would start a metric loop where a coding loop was
        # asked for, or stop a loop the moment triage labels it.
        names = self.model_dump()
        seen: dict[str, str] = {}
        for role, label in names.items():
            if label in seen:
                raise ValueError(f"`{seen[label]}` and `{role}` are both `{label}`")
            seen[label] = role
        return self

    def of_kind(self, kind: str) -> str:
        """The label that keeps a loop of ``kind`` going (``LoopRecord.kind``): removing it
        stops the loop and the gate refuses without it. ``optimize`` for a metric loop."""
        return self.optimize if kind == "metric" else self.ready


_HOST = re.compile(
    r"^\.?(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)


class SandboxConfig(_Strict):
    network: bool | tuple[str, ...] = False
    """`false`: no network; `true`: any public host; a list of host names: only those
    (`.example.org` also allows its subdomains). Always through loopbot's filtering
    proxy, never loopback, private, link-local or metadata addresses."""
    timeout_seconds: int = Field(600, ge=1, le=3600)
    """Seconds each command in the sandbox may run."""

    @field_validator("network")
    @classmethod
    def _hosts(cls, v: bool | tuple[str, ...]) -> bool | tuple[str, ...]:
        return _network(v)


def _network(v: bool | tuple[str, ...]) -> bool | tuple[str, ...]:
    """A network setting: off, any public host, or these host names."""
    if isinstance(v, bool):
        return v
    if not v:
        raise ValueError("a list of host names must name at least one host")
    hosts = tuple(h.strip().lower() for h in v)
    bad = [h for h in hosts if not _HOST.match(h)]
    if bad:
        raise ValueError(f"not host names: {', '.join(bad)} (no schemes, ports or paths)")
    return hosts


class LimitsConfig(_Strict):
    max_hours: float | None = Field(None, gt=0)
    """Hours the issue's loop may be active, summed over its whole life, restarts
    included; past them it stops `failed` / `budget_exhausted`. Unset: the operator's
    `LOOPBOT_MAX_WALL_HOURS`."""
    max_changed_lines: int = Field(1000, ge=1)
    """A change with more changed lines is not merged on its own: `loop:needs-human`,
    with the numbers."""
    max_changed_files: int = Field(100, ge=1)
    """A change with more changed files is not merged on its own: `loop:needs-human`,
    with the numbers."""
    # The whole-life budgets: bot/core/rules/loop/budget.py.
    max_tokens: int | None = Field(None, ge=1)
    """Tokens (all kinds) over the issue's whole life. Unset: the operator's
    `LOOPBOT_MAX_TOKENS`."""
    max_total_turns: int | None = Field(None, ge=1)
    """Turns over the issue's whole life. Unset: the operator's
    `LOOPBOT_MAX_TOTAL_TURNS`."""


class TriageConfig(_Strict):
    # bot/core/rules/triage.py
    enabled: bool = True
    """Before the first turn, one small structured call judges whether the approved
    issue has a checkable outcome; not ready, or too large, means no coding
    (`labels.needs_spec`)."""


class PostActionConfig(_Strict):
    prompt: str = Field(min_length=1, max_length=4000)
    """What the post-action turn is asked (e.g. "add a line to CHANGELOG.md")."""


class MetricConfig(_Strict):
    """A metric loop (label ``labels.optimize``): one change per iteration, kept only if
    ``command``'s number improves by ``min_delta`` and ``guard`` passes."""

    command: str = Field(min_length=1)
    """A command whose last printed number is the metric."""
    direction: Literal["higher", "lower"]
    """Whether `higher` or `lower` is better."""
    min_delta: float = Field(0.0, ge=0)
    """The least improvement kept."""
    guard: str | None = Field(None, min_length=1)
    """A command that must pass for a change to be kept. Unset: `verify`."""
    scope: tuple[str, ...] = Field(min_length=1)
    """Globs of the files the agent may change (one glob may be given as a string)."""
    max_iterations: int = Field(20, ge=1, le=200)
    """Iterations per run (each an agent turn, so at most the operator's
    `LOOPBOT_MAX_TURNS`)."""
    max_consecutive_discards: int = Field(10, ge=2, le=100)
    """Discards in a row that stop the loop."""

    @field_validator("scope", mode="before")
    @classmethod
    def _one_glob(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v  # `scope: src/**`, a list of one


# The most schedules one repository may have: each is a loop that starts on its own, with
# nobody labelling an issue, so a repository gets a few (docs/repositories.md#scheduled-loops).
MAX_SCHEDULES = 5
TASK_DIR = ".github/loop-tasks/"
_TASK_PATH = re.compile(r"^\.github/loop-tasks/[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.md$")


class ScheduleConfig(_Strict):
    """One entry of ``schedules:``: a cron expression (five fields, UTC) and the task file
    (``.github/loop-tasks/<name>.md``) whose text loopbot opens as an issue and starts."""

    cron: str = Field(min_length=1, max_length=200)
    """When: a cron expression of five fields, in UTC."""
    task: str
    """The task file whose text loopbot opens as an issue: directly in
    `.github/loop-tasks/`, named with letters, digits, `.`, `-` and `_`, ending `.md`."""

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        try:
            return slots.check(v)
        except slots.CronError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        if not _TASK_PATH.match(v):
            raise ValueError(
                f"a task is a file directly in `{TASK_DIR}`, named with letters, digits, "
                f"`.`, `-` and `_`, ending `.md` (got {v[:120]!r})"
            )
        return v


class TaskSettings(_Strict):
    """A task file's ``loop:`` settings: what its runs change of ``loop.yml``. ``metric``
    (a metric loop's whole section) makes its runs metric loops; ``kind: metric`` alone
    uses ``loop.yml``'s own ``metric:``."""

    kind: Literal["code", "metric"] | None = None
    """`metric`: the task's runs are metric loops with `loop.yml`'s own `metric:`;
    `code`: coding loops."""
    metric: MetricConfig | None = None
    """A metric loop's whole section, in place of `loop.yml`'s (its runs are metric
    loops)."""
    max_turns: int | None = Field(None, ge=1, le=100)
    """In place of `loop.yml`'s `max_turns`."""
    max_cost_usd: float | None = Field(None, gt=0)
    """In place of `loop.yml`'s `max_cost_usd`."""
    milestones: Literal["off", "on", "auto"] | None = None
    """In place of `loop.yml`'s `milestones`."""

    @field_validator("milestones", mode="before")
    @classmethod
    def _yaml_switch(cls, v: Any) -> Any:
        if isinstance(v, bool):  # `milestones: off` reads as False (see RepoConfig)
            return "on" if v else "off"
        return v

    @model_validator(mode="after")
    def _kind(self) -> TaskSettings:
        if self.kind == "code" and self.metric is not None:
            raise ValueError("`kind: code` with a `metric:` section: a metric loop has kind metric")
        return self

    @property
    def loop_kind(self) -> str:
        """ "metric" when the settings ask for a metric loop, else "code"."""
        return self.kind or ("metric" if self.metric is not None else "code")


class SpendConfig(_Strict):
    """The repository's own spend caps (bot/core/spend/caps.py): lower than the operator's
    ``LOOPBOT_SPEND_REPO_{DAY,MONTH}_USD``, never higher (a higher value is lowered)."""

    day_usd: float | None = Field(None, gt=0)
    """This repository's model spend per UTC day, across its loops: lower than the
    operator's `LOOPBOT_SPEND_REPO_DAY_USD`, never higher (a higher value is lowered,
    and the issue is told). Unset: the operator's."""
    month_usd: float | None = Field(None, gt=0)
    """The same per UTC month, within `LOOPBOT_SPEND_REPO_MONTH_USD`."""


class RepoConfig(_Strict):
    verify: str = Field(min_length=1)
    """The command that judges the work: exit 0 means pass."""
    setup: str | None = None
    """Run once per new worktree, before the first turn, in a sandbox of its own with
    `setup_network` and the repository's dependency caches."""
    # Setup also gets the repository's dependency caches (jobs/loop/setup_phase.py); the
    # agent never does.
    setup_network: bool | tuple[str, ...] | None = None
    """The network of `setup` alone (e.g. `[pypi.org, files.pythonhosted.org]`), as
    `sandbox.network` is the agent's, verify's and the critic's. Unset:
    `sandbox.network`."""
    max_turns: int = Field(20, ge=1, le=100)
    """Turns per run before the loop ends `failed` / `max_turns_reached`."""
    max_steps: int = Field(200, ge=0)
    """Model calls per turn (0: one text-only call)."""
    tool_budget: int = Field(400, ge=1)
    """Tool calls per turn."""
    max_cost_usd: float = Field(10.0, gt=0)
    """Model spend for the issue's loop, in dollars; past it, `failed` /
    `budget_exhausted`."""
    max_parallel: int = Field(3, ge=1)  # bot/core/rules/pace.py
    """Loops of this repository admitted at once; more wait in line, `queued`, with
    their place shown. At most the operator's `LOOPBOT_MAX_PARALLEL`."""
    spend: SpendConfig = SpendConfig()
    """This repository's spend caps, per UTC day and month."""
    agent: AgentConfig = AgentConfig()
    """The agent that codes."""
    critic: CriticConfig = CriticConfig()
    """The critic that reviews."""

    @field_validator("setup_network")
    @classmethod
    def _setup_hosts(cls, v: bool | tuple[str, ...] | None) -> bool | tuple[str, ...] | None:
        return None if v is None else _network(v)

    merge: MergeConfig = MergeConfig()
    """The merge gate."""
    labels: LabelsConfig = LabelsConfig()
    """The labels loopbot reads and writes; every label must be distinct."""
    sandbox: SandboxConfig = SandboxConfig()
    """The sandbox every command runs in."""
    limits: LimitsConfig = LimitsConfig()
    """The issue's whole-life budgets and the size of a change merged on its own."""
    triage: TriageConfig = TriageConfig()
    """Readiness triage."""
    milestones: Literal["off", "on", "auto"] = "on"  # bot/core/rules/loop/sections.py
    """`on`: an issue with a task list (two or more `- [ ]`) or `## Milestone` headings
    is worked section by section, each audited; `auto`: also ask the model to propose
    sections for an issue that has none; `off`: every issue is one section."""
    post_action: PostActionConfig | None = None
    """One best-effort turn after a clean final audit; kept only if verify passes, no
    protected path or binary file changes and it changes at most 300 lines; not reviewed
    again."""
    metric: MetricConfig | None = None
    """A metric loop (started by `labels.optimize`): one change per iteration, kept only
    if `metric.command`'s number improves by `metric.min_delta` and `metric.guard`
    passes."""
    # bot/core/schedules/, jobs/schedules.py
    schedules: tuple[ScheduleConfig, ...] = Field((), max_length=MAX_SCHEDULES)
    """Recurring loops: a cron and a task file each, at most 5, one per task file."""

    @field_validator("schedules")
    @classmethod
    def _one_schedule_per_task(cls, v: tuple[ScheduleConfig, ...]) -> tuple[ScheduleConfig, ...]:
        # A task's runs share an issue while one is open: two schedules of one task
        # would take turns on it. One schedule per task file.
        tasks = [s.task for s in v]
        twice = sorted({t for t in tasks if tasks.count(t) > 1})
        if twice:
            raise ValueError(f"a task file has one schedule: {', '.join(twice)} has more")
        return v

    @field_validator("milestones", mode="before")
    @classmethod
    def _yaml_switch(cls, v: Any) -> Any:
        # YAML 1.1 reads a bare `off` / `on` (and `false` / `true`) as booleans: the file
        # says `milestones: off`, PyYAML hands over False.
        if isinstance(v, bool):
            return "on" if v else "off"
        return v

    @property
    def step_cap(self) -> int:
        return min(self.max_steps, STEP_CAP)

    # The model and effort each role runs with: the file's choice (already clamped to the
    # operator's list and ceiling by ``clamp``), else the operator's default.
    def agent_model(self, ceilings: Ceilings) -> str:
        """The agent's model. Codex talks to OpenAI: an OpenAI model the file names, else
        the operator's ``LOOPBOT_CODEX_MODEL``; every other backend an Anthropic one (an
        OpenAI model named for them is the operator's ``LOOPBOT_MODEL``)."""
        named = self.agent.model
        if self.agent.backend == "codex":
            return named if named and is_openai(named) else ceilings.models.codex_model
        if named and is_openai(named):
            return ceilings.models.model
        return named or ceilings.models.model

    def critic_model(self, ceilings: Ceilings) -> str:
        return self.critic.model or ceilings.models.critic_model

    def agent_effort(self, ceilings: Ceilings) -> Effort | None:
        return self.agent.effort or ceilings.models.effort

    def critic_effort(self, ceilings: Ceilings) -> Effort | None:
        return self.critic.effort or ceilings.models.effort


class ConfigError(Exception):
    """The file is missing, not YAML, or breaks the schema; ``problems`` name the keys."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


DEFAULT_LABELS = LabelsConfig()

# -- operator ceilings ---------------------------------------------------------------------------

ALWAYS_PROTECTED = ".github/**"
CLAMPED_COMMENT_KEY = "config-clamped"


@dataclass(frozen=True)
class ModelPolicy:
    """Which models a ``loop.yml`` may choose, and how much effort it may ask of them."""

    model: str = DEFAULT_MODEL  # the agent's, when the file names none
    critic_model: str = DEFAULT_MODEL
    allowed: frozenset[str] = frozenset({DEFAULT_MODEL})
    max_effort: Effort = "high"
    effort: Effort | None = None  # when the file names none; None: the model's default
    backends: frozenset[str] = frozenset({"builtin"})  # LOOPBOT_AGENT_BACKENDS
    codex_model: str = "gpt-6.1-sol"  # LOOPBOT_CODEX_MODEL

    @classmethod
    def of(cls, settings: Settings) -> ModelPolicy:
        return cls(
            model=settings.model,
            critic_model=settings.critic_model,
            allowed=settings.allowed_models,
            max_effort=settings.max_effort,
            effort=settings.effort,
            backends=settings.agent_backends,
            codex_model=settings.codex_model,
        )


@dataclass(frozen=True)
class Ceilings:
    """The most any ``loop.yml`` may ask for; the operator sets them (``LOOPBOT_MAX_*``)."""

    max_cost_usd: float = 25.0
    max_turns: int = 50
    tool_budget: int = 1000
    wait_checks_minutes: int = 240
    max_hours: float = 12.0
    max_tokens: int = 100_000_000
    max_total_turns: int = 200
    max_parallel: int = 20  # loops admitted at once across every repository
    spend_repo_day_usd: float = 50.0  # LOOPBOT_SPEND_REPO_DAY_USD
    spend_repo_month_usd: float = 1000.0  # LOOPBOT_SPEND_REPO_MONTH_USD
    # Ceilings compare by their numbers, as they always have; the policy compares on its own.
    models: ModelPolicy = field(default_factory=ModelPolicy, compare=False)

    @classmethod
    def of(cls, settings: Settings) -> Ceilings:
        return cls(
            max_cost_usd=settings.max_cost_usd,
            max_turns=settings.max_turns,
            tool_budget=settings.max_tool_budget,
            wait_checks_minutes=settings.max_wait_checks_minutes,
            max_hours=settings.max_wall_hours,
            max_tokens=settings.max_tokens,
            max_total_turns=settings.max_total_turns,
            max_parallel=settings.max_parallel,
            spend_repo_day_usd=settings.spend_repo_day_usd,
            spend_repo_month_usd=settings.spend_repo_month_usd,
            models=ModelPolicy.of(settings),
        )


DEFAULT_CEILINGS = Ceilings()

# (key in loop.yml, ceiling attribute, the operator's variable)
CAPS: tuple[tuple[str, str, str], ...] = (
    ("max_cost_usd", "max_cost_usd", "LOOPBOT_MAX_COST_USD"),
    ("max_turns", "max_turns", "LOOPBOT_MAX_TURNS"),
    ("tool_budget", "tool_budget", "LOOPBOT_MAX_TOOL_BUDGET"),
    ("merge.wait_checks_minutes", "wait_checks_minutes", "LOOPBOT_MAX_WAIT_CHECKS_MINUTES"),
    ("limits.max_hours", "max_hours", "LOOPBOT_MAX_WALL_HOURS"),
    ("limits.max_tokens", "max_tokens", "LOOPBOT_MAX_TOKENS"),
    ("limits.max_total_turns", "max_total_turns", "LOOPBOT_MAX_TOTAL_TURNS"),
    ("max_parallel", "max_parallel", "LOOPBOT_MAX_PARALLEL"),
    ("spend.day_usd", "spend_repo_day_usd", "LOOPBOT_SPEND_REPO_DAY_USD"),
    ("spend.month_usd", "spend_repo_month_usd", "LOOPBOT_SPEND_REPO_MONTH_USD"),
    # Each iteration of a metric loop is an agent turn: the turn ceiling bounds them too.
    ("metric.max_iterations", "max_turns", "LOOPBOT_MAX_TURNS"),
)


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def clamp(config: RepoConfig, ceilings: Ceilings) -> tuple[RepoConfig, list[str]]:
    """``config`` within ``ceilings``, and one sentence per key that was changed.

    A value above its ceiling is lowered to it; ``merge.protected_paths`` always holds
    ``.github/**``, whatever the file says. Values within the ceilings are untouched.
    """
    data = config.model_dump()
    notes: list[str] = []
    for key, attr, env in CAPS:
        *parents, leaf = key.split(".")
        node: dict[str, Any] | None = data
        for p in parents:
            node = node[p] if node is not None else None
        if node is None:  # an optional section the file leaves out (``metric``)
            continue
        asked = node[leaf]
        cap = getattr(ceilings, attr)
        if asked is None or asked <= cap:
            continue
        node[leaf] = cap
        notes.append(
            f"`{key}`: {_num(asked)} asked, lowered to {_num(cap)} "
            f"(the operator's ceiling, `{env}`)"
        )
    for role, default in (
        ("agent", ceilings.models.model),
        ("critic", ceilings.models.critic_model),
    ):
        notes += _clamp_model(data[role], role, default, ceilings.models)
    backend = data["agent"]["backend"]
    if backend not in ceilings.models.backends:
        data["agent"]["backend"] = "builtin"
        notes.append(
            f"`agent.backend`: `{backend}` is not one this installation allows "
            f"({', '.join(sorted(ceilings.models.backends))}; `LOOPBOT_AGENT_BACKENDS`), so "
            "loopbot's built-in agent codes"
        )
    protected = tuple(data["merge"]["protected_paths"])
    if ALWAYS_PROTECTED not in protected:
        data["merge"]["protected_paths"] = (ALWAYS_PROTECTED, *protected)
        notes.append(
            f"`merge.protected_paths`: `{ALWAYS_PROTECTED}` added; loopbot never merges "
            "changes to `.github/` on its own, whatever the file says"
        )
    if not notes:
        return config, []
    return RepoConfig.model_validate(data), notes


def _clamp_model(node: dict[str, Any], role: str, default: str, policy: ModelPolicy) -> list[str]:
    """``role``'s model within the allowed list and its effort within the ceiling, in place."""
    notes: list[str] = []
    asked = node["model"]
    if asked is not None and asked not in policy.allowed:
        node["model"] = None
        allowed = ", ".join(f"`{m}`" for m in sorted(policy.allowed))
        notes.append(
            f"`{role}.model`: `{asked}` is not one this installation allows ({allowed}; "
            f"`LOOPBOT_ALLOWED_MODELS`), so the operator's default `{default}` is used"
        )
    effort = node["effort"]
    capped = clamp_effort(effort, policy.max_effort)
    if capped != effort:
        node["effort"] = capped
        notes.append(
            f"`{role}.effort`: {effort} asked, lowered to {capped} "
            "(the operator's ceiling, `LOOPBOT_MAX_EFFORT`)"
        )
    return notes


def wall_hours(config: RepoConfig, ceilings: Ceilings) -> float:
    """The wall-clock hours a loop may run: ``limits.max_hours`` within the ceiling."""
    asked = config.limits.max_hours
    return min(asked if asked is not None else math.inf, ceilings.max_hours)


def with_backend(
    config: RepoConfig, asked: str, ceilings: Ceilings
) -> tuple[RepoConfig, list[str]]:
    """``config`` with the backend a writer's ``loop:agent-<name>`` label asked for, when
    the operator allows it; otherwise unchanged, with the note that says why."""
    label = f"`loop:agent-{asked}`"
    if "," in asked:
        names = ", ".join(f"`loop:agent-{a}`" for a in asked.split(","))
        return config, [
            f"{names}: more than one backend asked for, so `.github/loop.yml`'s "
            f"`{config.agent.backend}` codes"
        ]
    if asked not in BACKENDS:
        return config, [
            f"{label}: no such agent backend (known: {', '.join(BACKENDS)}), so "
            f"`{config.agent.backend}` codes"
        ]
    if asked not in ceilings.models.backends:
        return config, [
            f"{label}: not a backend this installation allows "
            f"({', '.join(sorted(ceilings.models.backends))}; `LOOPBOT_AGENT_BACKENDS`), so "
            f"`{config.agent.backend}` codes"
        ]
    agent = config.agent.model_copy(update={"backend": asked})
    return config.model_copy(update={"agent": agent}), []


def with_task(
    config: RepoConfig, settings: dict[str, Any], ceilings: Ceilings
) -> tuple[RepoConfig, list[str]]:
    """``config`` with a scheduled task's ``loop:`` settings (``TaskSettings``, as the
    record keeps them) in place of loop.yml's, within ``ceilings``: a task may ask for
    no more than loop.yml may. Returns the notes of what the ceilings lowered."""
    task = TaskSettings.model_validate(settings)
    data = config.model_dump()
    for key in ("metric", "max_turns", "max_cost_usd", "milestones"):
        value = getattr(task, key)
        if value is not None:
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
    return clamp(RepoConfig.model_validate(data), ceilings)


def clamped_comment(notes: list[str]) -> str:
    """The issue comment naming what the operator's ceilings changed."""
    lines = "\n".join(f"- {n}" for n in notes)
    return (
        f"`{CONFIG_PATH}` asks for more than this loopbot installation allows, so "
        f"the loop runs with these values instead:\n\n{lines}\n\n"
        "The operator who runs loopbot sets these ceilings; a repository can ask for "
        "less, not more."
    )


def parse(text: str | None, ceilings: Ceilings | None = None) -> RepoConfig:
    """The validated file, clamped to ``ceilings`` (default: the default ceilings).

    Every reader gets clamped values: a caller without the operator's settings still
    never sees more than the defaults allow.
    """
    return load(text, ceilings or DEFAULT_CEILINGS)[0]


def load(text: str | None, ceilings: Ceilings) -> tuple[RepoConfig, list[str]]:
    """The validated file within ``ceilings``, and a sentence per key that was lowered."""
    return clamp(_validate(text), ceilings)


def _validate(text: str | None) -> RepoConfig:
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


def loop_label(text: str | None, kind: str) -> str:
    """The label of a loop of ``kind`` (``LabelsConfig.of_kind``), even from a broken file."""
    if kind != "metric":
        return ready_label(text)
    try:
        data = yaml.safe_load(text or "")
        label = data.get("labels", {}).get("optimize") if isinstance(data, dict) else None
        return label if isinstance(label, str) and label else DEFAULT_LABELS.optimize
    except (yaml.YAMLError, AttributeError):
        return DEFAULT_LABELS.optimize


def ready_label(text: str | None) -> str:
    """The ready label even from a broken file, so a bad config can still be reported."""
    try:
        data = yaml.safe_load(text or "")
        label = data.get("labels", {}).get("ready") if isinstance(data, dict) else None
        return label if isinstance(label, str) and label else DEFAULT_LABELS.ready
    except (yaml.YAMLError, AttributeError):
        return DEFAULT_LABELS.ready
