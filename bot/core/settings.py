"""The one typed settings object, built from the environment at start-up.

Nothing reads ``os.environ`` at import time: ``load_settings()`` is called by the
process entry points (``loopbot web``, ``loopbot worker``, the CLI) and the object is
passed down. A missing or malformed variable stops start-up with a message that names
the variable, never a traceback.

The environment is the process's own, over the values of an env file (``.env`` in the
working directory, or ``LOOPBOT_ENV_FILE``): ``loopbot app create`` writes the App's
credentials there, and a variable set in the environment wins over the file, as in
foreman, honcho and systemd's ``EnvironmentFile``.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from dotenv import dotenv_values
from dotenv.parser import parse_stream
from pydantic import (
    AnyHttpUrl,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot.core.models import DEFAULT_MODEL, Effort, rank
from bot.core.redis_url import DEFAULT_URL, effective_url, parse_hosts
from bot.core.spend.caps import Period, Scope

Role = Literal["web", "worker", "cli"]
_MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$")


class SettingsError(Exception):
    """Start-up configuration is missing or malformed; the message names each variable."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    # Redis Sentinel (bot/core/redis_url.py): the sentinels' HOST:PORT list and the master's
    # name. Declared before redis_url, whose validator folds them into it.
    redis_sentinels: str = Field("", alias="REDIS_SENTINELS")
    redis_sentinel_master: str | None = Field(None, alias="REDIS_SENTINEL_MASTER")
    # May carry a password: kept out of repr(), shown only through bot.core.redis_url.mask_url.
    # The URL every process connects to: REDIS_URL as given or, with REDIS_SENTINELS, the
    # redis+sentinel:// URL made of them (REDIS_URL then gives only the password and db).
    redis_url: str = Field(DEFAULT_URL, alias="REDIS_URL", repr=False, validate_default=True)
    github_app_id: int = Field(alias="GITHUB_APP_ID", gt=0)
    github_private_key: SecretStr | None = Field(None, alias="GITHUB_PRIVATE_KEY")
    github_private_key_path: Path | None = Field(None, alias="GITHUB_PRIVATE_KEY_PATH")
    github_webhook_secret: SecretStr = Field(alias="GITHUB_WEBHOOK_SECRET", min_length=1)
    github_api_url: AnyHttpUrl = Field(AnyHttpUrl("https://api.github.com"), alias="GITHUB_API_URL")
    # githubkit's default is no timeout at all; a hung socket would hold a job forever.
    github_timeout: float = Field(10.0, alias="LOOPBOT_GITHUB_TIMEOUT", gt=0)
    # Longest single wait loopbot accepts from a Retry-After before giving up on a call.
    github_max_retry_wait: float = Field(120.0, alias="LOOPBOT_GITHUB_MAX_RETRY_WAIT", ge=0)
    # Seconds between two writes of one installation, across every worker (GitHub asks
    # for at least one between content-creating requests; bot/io/github/pace.py).
    github_write_gap: float = Field(1.0, alias="LOOPBOT_GITHUB_WRITE_GAP", ge=0, le=60)
    # Requests of one installation in flight at once, across every worker (GitHub
    # refuses more than 100 concurrent requests, REST and GraphQL together).
    github_max_concurrent: int = Field(20, alias="LOOPBOT_GITHUB_MAX_CONCURRENT", ge=1, le=100)
    # Longest wait for a write's turn in its installation's line before its job fails.
    github_max_queue_wait: float = Field(1800.0, alias="LOOPBOT_GITHUB_MAX_QUEUE_WAIT", ge=0)
    anthropic_api_key: SecretStr | None = Field(None, alias="ANTHROPIC_API_KEY")
    anthropic_base_url: AnyHttpUrl | None = Field(None, alias="ANTHROPIC_BASE_URL")
    # The codex backend's model API (OpenAI's Responses API), used only by the worker's
    # model gateway; needed when LOOPBOT_AGENT_BACKENDS allows codex.
    openai_api_key: SecretStr | None = Field(None, alias="OPENAI_API_KEY")
    openai_base_url: AnyHttpUrl | None = Field(None, alias="OPENAI_BASE_URL")
    # The codex backend's model when loop.yml names no OpenAI model.
    codex_model: str = Field("gpt-6.1-sol", alias="LOOPBOT_CODEX_MODEL", min_length=1)
    model: str = Field(DEFAULT_MODEL, alias="LOOPBOT_MODEL", min_length=1)
    critic_model: str = Field(DEFAULT_MODEL, alias="LOOPBOT_CRITIC_MODEL", min_length=1)
    # The models a repository's loop.yml may choose (comma-separated); the three configured
    # here are always allowed. A model outside the list is replaced by the default.
    allowed_models_list: str = Field("", alias="LOOPBOT_ALLOWED_MODELS")
    # The agent backends a loop.yml may choose (comma-separated): builtin, claude-code,
    # opencode, codex.
    agent_backends_list: str = Field("builtin", alias="LOOPBOT_AGENT_BACKENDS")
    # The most effort a loop.yml may ask for; more is lowered to it.
    max_effort: Effort = Field("high", alias="LOOPBOT_MAX_EFFORT")
    # The effort asked when loop.yml names none; unset: the model's own default.
    effort: Effort | None = Field(None, alias="LOOPBOT_EFFORT")
    # A model the Models API cannot describe (it is down) is assumed to have this window
    # and output limit (bot.core.models.fallback_spec).
    context_window: int = Field(200_000, alias="LOOPBOT_CONTEXT_WINDOW", ge=1000)
    max_output: int = Field(64_000, alias="LOOPBOT_MAX_OUTPUT", ge=1)
    # The share of the model's window at which the agent's conversation is shrunk.
    context_threshold: float = Field(0.7, alias="LOOPBOT_CONTEXT_THRESHOLD", ge=0.2, le=0.95)
    # No answer from the model within this many seconds counts as a stall.
    stall_timeout: float = Field(300.0, alias="LOOPBOT_STALL_TIMEOUT", gt=0)
    # SDK-level retries of 429, 529, 5xx and timeouts before a call counts as failed.
    model_retries: int = Field(4, alias="LOOPBOT_MODEL_RETRIES", ge=0, le=10)
    fallback_model: str | None = Field(None, alias="LOOPBOT_FALLBACK_MODEL")
    # A loop's lease lapses this long after its worker stops renewing it.
    lease_ttl: float = Field(30.0, alias="LOOPBOT_LEASE_TTL", ge=2)
    reconcile_interval: float = Field(10.0, alias="LOOPBOT_RECONCILE_INTERVAL", gt=0)
    sweep_interval: float = Field(600.0, alias="LOOPBOT_SWEEP_INTERVAL", gt=0)
    max_auto_resumes: int = Field(3, alias="LOOPBOT_MAX_AUTO_RESUMES", ge=0)
    data_dir: Path = Field(Path.home() / ".loopbot", alias="LOOPBOT_DATA_DIR")
    dashboard_token: SecretStr | None = Field(None, alias="LOOPBOT_DASHBOARD_TOKEN")
    # A dashboard sign-in lasts this many seconds (a random session id in Redis).
    dashboard_session_ttl: int = Field(12 * 3600, alias="LOOPBOT_DASHBOARD_SESSION_TTL", ge=1)
    # Behind a TLS-terminating proxy: true (one proxy) or how many proxies to trust for
    # X-Forwarded-Proto/-For. Off by default: a client could claim "https" itself.
    trusted_proxy: bool | int = Field(False, alias="LOOPBOT_TRUSTED_PROXY")
    # Running agent commands without bubblewrap is an explicit operator decision.
    allow_unsandboxed: bool = Field(False, alias="LOOPBOT_ALLOW_UNSANDBOXED")
    log_format: Literal["json", "console"] = Field("json", alias="LOOPBOT_LOG_FORMAT")
    # The sandbox (jobs.sandbox.bwrap). A root worker runs sandboxed commands as this host uid,
    # so that nothing inside holds root's identity even outside its user namespace.
    sandbox_uid: int = Field(65534, alias="LOOPBOT_SANDBOX_UID", gt=0)
    sandbox_gid: int = Field(65534, alias="LOOPBOT_SANDBOX_GID", gt=0)
    # Toolchains outside /usr (e.g. /opt/go:/root/.pyenv), shown read-only; colon-separated.
    sandbox_read_only_paths: str = Field("", alias="LOOPBOT_SANDBOX_READ_ONLY_PATHS")
    sandbox_max_processes: int = Field(512, alias="LOOPBOT_SANDBOX_MAX_PROCESSES", ge=16)
    sandbox_max_memory_mb: int = Field(8192, alias="LOOPBOT_SANDBOX_MAX_MEMORY_MB", ge=0)
    sandbox_max_file_mb: int = Field(1024, alias="LOOPBOT_SANDBOX_MAX_FILE_MB", ge=1)
    sandbox_tmp_mb: int = Field(1024, alias="LOOPBOT_SANDBOX_TMP_MB", ge=16)
    sandbox_max_worktree_mb: int = Field(4096, alias="LOOPBOT_SANDBOX_MAX_WORKTREE_MB", ge=16)
    sandbox_max_output_kb: int = Field(64, alias="LOOPBOT_SANDBOX_MAX_OUTPUT_KB", ge=4)
    # Each repository's dependency caches (pip, npm, cargo, go, ...), mounted into its
    # `setup` only (jobs/loop/setup_phase.py); past this size a cache is emptied. 0: no caches.
    setup_cache_mb: int = Field(2048, alias="LOOPBOT_SETUP_CACHE_MB", ge=0)
    # All repositories' caches on this worker together: past it, the least recently used
    # are removed (jobs/loop/setup_phase.py).
    setup_caches_total_mb: int = Field(8192, alias="LOOPBOT_SETUP_CACHES_TOTAL_MB", ge=0)
    # Private or loopback networks the egress proxy may reach anyway (an internal package
    # mirror); comma-separated CIDRs. Empty: only public addresses.
    egress_allowed_networks: str = Field("", alias="LOOPBOT_EGRESS_ALLOWED_NETWORKS")
    # Operator ceilings: the most any repository's loop.yml may ask for; a value above
    # is lowered to the ceiling and the issue is told so (bot.core.repo_config.clamp).
    max_cost_usd: float = Field(25.0, alias="LOOPBOT_MAX_COST_USD", gt=0)
    max_turns: int = Field(50, alias="LOOPBOT_MAX_TURNS", ge=1)
    max_tool_budget: int = Field(1000, alias="LOOPBOT_MAX_TOOL_BUDGET", ge=1)
    max_wall_hours: float = Field(12.0, alias="LOOPBOT_MAX_WALL_HOURS", gt=0)
    max_wait_checks_minutes: int = Field(240, alias="LOOPBOT_MAX_WAIT_CHECKS_MINUTES", ge=1)
    # The whole-life budget of one issue (bot/core/rules/loop/budget.py): tokens of every kind
    # (input, output, cache reads and writes) and turns, summed over every run and restart.
    max_tokens: int = Field(100_000_000, alias="LOOPBOT_MAX_TOKENS", ge=1)
    max_total_turns: int = Field(200, alias="LOOPBOT_MAX_TOTAL_TURNS", ge=1)
    # Loops admitted at once across every repository (bot/core/rules/pace.py), and the
    # ceiling of each loop.yml's max_parallel; more wait in line.
    max_parallel: int = Field(20, alias="LOOPBOT_MAX_PARALLEL", ge=1)
    # Spend caps above the loop (bot/core/spend/caps.py), in dollars per UTC day and month:
    # each repository's, and each installation's across its repositories. A call that
    # could cross one is not made; a repository's loop.yml may lower its own (spend.*).
    spend_repo_day_usd: float = Field(50.0, alias="LOOPBOT_SPEND_REPO_DAY_USD", gt=0)
    spend_repo_month_usd: float = Field(1000.0, alias="LOOPBOT_SPEND_REPO_MONTH_USD", gt=0)
    spend_installation_day_usd: float = Field(
        200.0, alias="LOOPBOT_SPEND_INSTALLATION_DAY_USD", gt=0
    )
    spend_installation_month_usd: float = Field(
        4000.0, alias="LOOPBOT_SPEND_INSTALLATION_MONTH_USD", gt=0
    )
    # Loops stopped or held by a spend cap start again by themselves once the period rolls
    # over (the reconciler); off: only a writer's /loop-restart resumes them.
    spend_resume_on_rollover: bool = Field(False, alias="LOOPBOT_SPEND_RESUME_ON_ROLLOVER")
    # Days an ended loop's record is kept before the reconciler archives it to its cost
    # summary (bot/core/spend/retention.py), and the spend counters (the chart's days);
    # a loop's detailed events and conversation go sooner (EVENTS_TTL_SECONDS).
    retention_days: int = Field(400, alias="LOOPBOT_RETENTION_DAYS", ge=1)

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinel_hosts(cls, v: str) -> str:
        if v.strip():
            parse_hosts(v)
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_url_usable(cls, v: str, info: ValidationInfo) -> str:
        if "redis_sentinels" not in info.data:
            return v  # REDIS_SENTINELS is malformed: that is the error to show
        env = {
            "REDIS_URL": v,
            "REDIS_SENTINELS": info.data["redis_sentinels"],
            "REDIS_SENTINEL_MASTER": info.data.get("redis_sentinel_master") or "",
        }
        return effective_url(env)  # its messages never contain the password

    @field_validator("effort", mode="before")
    @classmethod
    def _blank_is_unset(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("allowed_models_list")
    @classmethod
    def _model_names(cls, v: str) -> str:
        bad = [m for m in v.split(",") if m.strip() and not _MODEL_ID.match(m.strip())]
        if bad:
            raise ValueError(f"not model ids: {', '.join(b.strip() for b in bad)}")
        return v

    @field_validator("agent_backends_list")
    @classmethod
    def _backends(cls, v: str) -> str:
        known = ("builtin", "claude-code", "opencode", "codex")
        bad = [b.strip() for b in v.split(",") if b.strip() and b.strip() not in known]
        if bad:
            raise ValueError(
                f"unknown agent backends: {', '.join(bad)} (known: {', '.join(known)})"
            )
        return v

    @field_validator("github_private_key_path")
    @classmethod
    def _key_file_readable(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_file():
            raise ValueError(f"no such file: {v}")
        return v

    @field_validator("trusted_proxy")
    @classmethod
    def _proxy_count(cls, v: bool | int) -> bool | int:
        # Checked here, not first in the web app: the start-up check must refuse it
        # before gunicorn binds its port.
        if not isinstance(v, bool) and v < 0:
            raise ValueError("must be true, false or a count >= 0")
        return v

    @model_validator(mode="after")
    def _exactly_one_key(self) -> Settings:
        if self.github_private_key is None and self.github_private_key_path is None:
            raise ValueError("set GITHUB_PRIVATE_KEY or GITHUB_PRIVATE_KEY_PATH")
        if self.github_private_key is not None and self.github_private_key_path is not None:
            raise ValueError("set only one of GITHUB_PRIVATE_KEY and GITHUB_PRIVATE_KEY_PATH")
        _check_key(self)
        if self.effort is not None and rank(self.effort) > rank(self.max_effort):
            raise ValueError(
                f"LOOPBOT_EFFORT={self.effort} is above LOOPBOT_MAX_EFFORT={self.max_effort}"
            )
        return self

    @property
    def allowed_models(self) -> frozenset[str]:
        """What a loop.yml may choose: the list, plus the models configured here."""
        listed = {m.strip() for m in self.allowed_models_list.split(",") if m.strip()}
        configured = {self.model, self.critic_model, self.fallback_model}
        if "codex" in self.agent_backends:
            configured.add(self.codex_model)
        return frozenset(m for m in listed | configured if m)

    @property
    def agent_backends(self) -> frozenset[str]:
        """What a loop.yml may choose as ``agent.backend``; builtin always."""
        return frozenset(
            {"builtin"} | {b.strip() for b in self.agent_backends_list.split(",") if b.strip()}
        )

    def spend_caps(self) -> dict[tuple[Scope, Period], float]:
        """The operator's four spend caps, by scope and period."""
        return {
            (Scope.REPOSITORY, Period.DAY): self.spend_repo_day_usd,
            (Scope.REPOSITORY, Period.MONTH): self.spend_repo_month_usd,
            (Scope.INSTALLATION, Period.DAY): self.spend_installation_day_usd,
            (Scope.INSTALLATION, Period.MONTH): self.spend_installation_month_usd,
        }

    def private_key_pem(self) -> str:
        if self.github_private_key is not None:
            # Operators often paste the key with literal "\n" into one-line env files.
            return self.github_private_key.get_secret_value().replace("\\n", "\n")
        assert self.github_private_key_path is not None
        return self.github_private_key_path.read_text()

    @property
    def api_url(self) -> str:
        return str(self.github_api_url).rstrip("/")

    def require(self, role: Role) -> Settings:
        """Check what only some processes need; workers call the model, the web does not."""
        if role == "worker" and self.anthropic_api_key is None:
            raise SettingsError(
                ["ANTHROPIC_API_KEY: required by the worker (the agent and critic)"]
            )
        if role == "worker" and "codex" in self.agent_backends and self.openai_api_key is None:
            raise SettingsError(
                ["OPENAI_API_KEY: required by a worker when LOOPBOT_AGENT_BACKENDS allows codex"]
            )
        return self


def _check_key(settings: Settings) -> None:
    """The App key read as the GitHub client will: a file that cannot be read stops the
    process at start with the variable named (only its shape is checked here; parsing it
    costs tens of milliseconds, and ``loopbot doctor --github`` signs with it)."""
    name = "GITHUB_PRIVATE_KEY" if settings.github_private_key else "GITHUB_PRIVATE_KEY_PATH"
    try:
        pem = settings.private_key_pem()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{name}: cannot be read ({exc})") from None
    if "BEGIN" not in pem:
        raise ValueError(f"{name}: not a PEM key (expected '-----BEGIN ...')")


def _alias_of(field: str) -> str:
    info = Settings.model_fields.get(field)
    return info.alias if info is not None and info.alias else field.upper()


ENV_FILE_VARIABLE = "LOOPBOT_ENV_FILE"


def env_file_path(environ: Mapping[str, str] | None = None) -> Path:
    """The env file a process reads: ``$LOOPBOT_ENV_FILE``, else ``.env`` here."""
    source = os.environ if environ is None else environ
    return Path(source.get(ENV_FILE_VARIABLE) or ".env")


def read_env_file(path: Path) -> dict[str, str]:
    """The variables a dotenv file sets (python-dotenv's syntax: ``KEY=value``, quotes,
    ``\\n`` in double quotes); a missing file sets none. Unreadable is an error."""
    if not path.exists():
        return {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError([f"{ENV_FILE_VARIABLE} ({path}): cannot be read: {exc}"]) from None
    # python-dotenv skips a line it cannot parse with a warning; a setting the operator
    # wrote must not vanish so quietly (a half-read file starts with other values).
    bad = [b.original.line for b in parse_stream(io.StringIO(text)) if b.error]
    if bad:
        lines = ", ".join(str(n) for n in bad)
        raise SettingsError([f"{ENV_FILE_VARIABLE} ({path}): cannot parse line {lines}"])
    values = dotenv_values(stream=io.StringIO(text), interpolate=False)
    return {k: v for k, v in values.items() if v is not None}


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables settings are built from: the env file's, under the process's own."""
    source = dict(os.environ if environ is None else environ)
    return read_env_file(env_file_path(source)) | source


def load_settings(env: Mapping[str, str] | None = None, role: Role = "cli") -> Settings:
    """Build settings from ``env`` (default: the process environment over its env file)."""
    try:
        settings = Settings.model_validate(environment() if env is None else dict(env))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = [str(p) for p in err["loc"] if p != "__root__"]
            name = ", ".join(_alias_of(p) for p in loc) if loc else "configuration"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                msg = "is required but not set"
            problems.append(f"{name}: {msg}")
        raise SettingsError(problems) from None
    return settings.require(role)
