"""``loopbot doctor``: one line per thing loopbot needs, and what to do when it fails.

The host's facts behind the sandbox check's fix are read in bot/ops/doctor_host.py;
``--config`` is bot/ops/doctor_config.py, ``--github`` bot/ops/doctor_github.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anthropic

from bot.core.models import EFFORTS, ModelSpec, standing, thinking_params
from bot.core.redis_url import effective_url, is_sentinel, mask_url, scrub
from bot.core.settings import (
    Settings,
    SettingsError,
    env_file_path,
    environment,
    load_settings,
)
from bot.io.redis import connect, sentinel_view
from bot.ops.doctor_host import HostFacts, host_facts, sandbox_fix

if TYPE_CHECKING:
    from jobs.models import ModelCatalog


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # works, but the operator should know

    def line(self) -> str:
        mark = "FAIL" if not self.ok else ("warn" if self.warn else "ok  ")
        text = f"[{mark}] {self.name}: {self.detail}"
        return text + (f"\n       → {self.fix}" if not self.ok and self.fix else "")


REQUIRED = (
    ("GITHUB_APP_ID", "the App's id, from its settings page"),
    ("GITHUB_WEBHOOK_SECRET", "the webhook secret you gave the App"),
    ("GITHUB_PRIVATE_KEY or GITHUB_PRIVATE_KEY_PATH", "the App's private key (PEM)"),
    ("ANTHROPIC_API_KEY", "an Anthropic API key, for the agent and the critic"),
)


def run_checks(env: Mapping[str, str] | None = None) -> list[Check]:
    try:
        source = environment() if env is None else env
    except SettingsError as exc:
        return [Check("env file", False, "; ".join(exc.problems), "fix or remove the file")]
    checks: list[Check] = []
    settings: Settings | None = None
    missing = [
        (name, what)
        for name, what in REQUIRED
        if not any(source.get(n.strip()) for n in name.split(" or "))
    ]
    for name, what in missing:
        checks.append(Check(f"setting {name}", False, "not set", f"set it to {what}"))
    if not missing:
        try:
            settings = load_settings(env, role="worker")
            checks.append(Check("settings", True, "every variable is set and well-formed"))
        except SettingsError as exc:
            for problem in exc.problems:
                name, _, detail = problem.partition(":")
                checks.append(
                    Check(
                        f"setting {name}", False, detail.strip(), "see docs/operating.md#configure"
                    )
                )
    checks.extend(_env_file(env_file_path(source)))
    checks.append(_tool("git", ["git", "--version"], "apt-get install git"))
    bwrap = _tool("bubblewrap", ["bwrap", "--version"], "apt-get install bubblewrap")
    if not bwrap.ok and settings is not None and settings.allow_unsandboxed:
        bwrap = Check("bubblewrap", True, "missing; LOOPBOT_ALLOW_UNSANDBOXED=true (no sandbox!)")
    checks.append(bwrap)
    if settings is None:
        # Redis needs only REDIS_URL (or REDIS_SENTINELS): still worth knowing while other
        # settings are missing.
        try:
            url = effective_url(source)
        except ValueError as exc:  # names the variables; never a password
            checks.append(Check("redis", False, str(exc), "see docs/operating.md#configure"))
            return checks
        checks.append(_redis_url(url))
        return checks
    checks.append(_redis_url(settings.redis_url))
    checks.append(_github(settings))
    checks.extend(model_checks(settings))
    checks.extend(backend_checks(settings))
    checks.append(_data_dir(settings))
    checks.append(ceilings_check(settings))
    checks.append(_worker_user(settings))
    checks.append(_sandbox(settings))
    checks.append(_cgroups())
    checks.append(_egress())
    return checks


def _env_file(path: Path) -> list[Check]:
    """The env file holds the App's key and secrets: only its owner may read it."""
    if not path.exists():
        return []
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return [
            Check(
                "env file",
                False,
                f"{path} is readable by others (mode {mode:04o}); it holds the App's secrets",
                f"chmod 600 {path}",
            )
        ]
    detail = f"{path} (mode {mode:04o}): read under the environment's own variables"
    return [Check("env file", True, detail)]


def ceilings_check(settings: Settings) -> Check:
    """What any repository's loop.yml may ask for at most; shown so the operator knows."""
    return Check(
        "ceilings",
        True,
        f"a loop.yml may ask for at most ${settings.max_cost_usd:g} "
        f"(LOOPBOT_MAX_COST_USD), {settings.max_turns} turns (LOOPBOT_MAX_TURNS), "
        f"{settings.max_tool_budget} tool calls a turn (LOOPBOT_MAX_TOOL_BUDGET), "
        f"{settings.max_wall_hours:g} h (LOOPBOT_MAX_WALL_HOURS), "
        f"{settings.max_wait_checks_minutes} min waiting for checks "
        "(LOOPBOT_MAX_WAIT_CHECKS_MINUTES), "
        f"{settings.max_tokens:,} tokens (LOOPBOT_MAX_TOKENS), "
        f"{settings.max_total_turns} turns over an issue's life (LOOPBOT_MAX_TOTAL_TURNS) "
        f"and {settings.max_parallel} loops at once (LOOPBOT_MAX_PARALLEL); "
        "more is lowered to these",
    )


def _cgroups() -> Check:
    from jobs.sandbox import cgroups

    why = cgroups.available()
    if why is None:
        return Check("sandbox cgroups", True, "each command gets its own memory and pids limit")
    return Check(
        "sandbox cgroups",
        True,
        f"not used ({why}): memory is bounded per process and processes per uid only",
        warn=True,
    )


def _worker_user(settings: Settings) -> Check:
    if os.geteuid() != 0:
        return Check("worker user", True, f"uid {os.geteuid()} (not root)")
    return Check(
        "worker user",
        True,
        "running as root: loopbot drops it for every sandboxed command (host uid "
        f"{settings.sandbox_uid}, uid 1000 inside, no capabilities), but the harness itself "
        "(git, the GitHub and model clients) keeps root",
        warn=True,
    )


def _sandbox(settings: Settings, facts: HostFacts | None = None) -> Check:
    """Start a real sandbox: bubblewrap can be installed and still be refused user
    namespaces (sysctl, AppArmor, a container's seccomp profile), which only a trial run
    shows; the fix is read off the host's facts."""
    from jobs.sandbox.bwrap import Extra, Sandbox, SandboxUnavailable
    from jobs.sandbox.home import HomeLink

    facts = facts or host_facts()
    where = f" (in a {facts.container} container)" if facts.container else ""
    back = b""
    with tempfile.TemporaryDirectory(prefix="loopbot-doctor-") as tmp:
        try:
            with (
                Sandbox(Path(tmp), settings=settings, timeout=20) as box,
                HomeLink(Path(tmp), box.file_owner) as home,
            ):
                # A backend CLI's HOME: seeded by the harness through /proc/<pid>/root
                # before the command runs, read back through its descriptor after.
                (home.seed / "seeded").write_text("seeded\n")
                r = box.run(
                    "id -u; grep CapEff /proc/self/status; cat ~/seeded; stat -f -c %T ~; "
                    "echo back > ~/back",
                    extra=Extra(home=home),
                )
                if home.fd is not None:
                    with contextlib.suppress(OSError):
                        fd = os.open("back", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=home.fd)
                        back = os.read(fd, 16)
                        os.close(fd)
        except (SandboxUnavailable, OSError) as exc:
            return Check("sandbox", False, str(exc) + where, sandbox_fix(facts))
    if settings.allow_unsandboxed and box.bwrap is None:
        return Check("sandbox", True, "none: LOOPBOT_ALLOW_UNSANDBOXED=true", warn=True)
    lines = r.output.split()
    trial_ok = r.passed and lines[:1] == ["1000"] and "0000000000000000" in lines
    if trial_ok and lines[-2:] == ["seeded", "tmpfs"] and back == b"back\n":
        return Check(
            "sandbox",
            True,
            "commands run as uid 1000 with no capabilities; a CLI's HOME is the sandbox's "
            f"/tmp, a {settings.sandbox_tmp_mb} MiB tmpfs (LOOPBOT_SANDBOX_TMP_MB)" + where,
        )
    if trial_ok or (r.exit_code == 126 and "HOME" in r.output):
        return Check(
            "sandbox",
            False,
            f"the worker cannot reach a sandbox's HOME{where}: {r.output.strip()[-300:]}",
            "the worker opens /proc/<pid>/root of its sandboxes (as the same uid, or as "
            "root): nothing (an LSM, a container profile) may deny it ptrace read access",
        )
    return Check(
        "sandbox",
        False,
        f"a trial command failed{where}: {r.output.strip()[-300:]}",
        sandbox_fix(facts),
    )


def _egress() -> Check:
    from jobs.sandbox.egress import availability_problem

    problem = availability_problem()
    if problem is None:
        return Check("egress proxy", True, "squid and socat found (for sandbox.network)")
    return Check(
        "egress proxy",
        True,
        f"{problem}: repositories that set sandbox.network will fail to start",
        warn=True,
    )


def _tool(name: str, argv: list[str], fix: str) -> Check:
    if shutil.which(argv[0]) is None:
        return Check(name, False, f"{argv[0]} not found on PATH", fix)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    return Check(name, out.returncode == 0, (out.stdout or out.stderr).strip().splitlines()[0])


def _redis_url(url: str) -> Check:
    shown = mask_url(url)  # never the password
    sentinel = is_sentinel(url)
    try:
        conn = connect(url, retries=0, timeout=2)
        info = conn.info("server")
        view = sentinel_view(conn) if sentinel else None
    except Exception as exc:  # noqa: BLE001 - any failure is reported as the check's answer
        return Check(
            "redis",
            False,
            f"{shown}: {scrub(str(exc), url)}",
            "check REDIS_SENTINELS, REDIS_SENTINEL_MASTER and the sentinels"
            if sentinel
            else "start redis-server, or set REDIS_URL",
        )
    answers = f"{shown} answers (Redis {info['redis_version']})"
    if view is not None:
        master, replicas, sentinels = view
        answers += f"; master {master}, {replicas} replica(s), {sentinels} sentinel(s)"
    try:
        aof = int(conn.info("persistence").get("aof_enabled", 0))
        save = conn.config_get("save").get("save", "")
    except Exception:  # noqa: BLE001 - managed Redis often forbids CONFIG: cannot tell
        return Check("redis", True, answers + "; persistence unknown (CONFIG not allowed)")
    check = redis_persistence(answers, bool(aof), str(save))
    if view is not None and view[1] == 0 and check.ok:
        return Check(
            "redis",
            True,
            check.detail + "; no replica in sync: a failover would have nothing to promote",
            "start a replica (replicaof the master); "
            "see docs/operating.md#redis-sentinel-and-failover",
            warn=True,
        )
    return check


def redis_persistence(answers: str, aof: bool, save: str) -> Check:
    """Loop records, conversations and leases live in Redis: a restart must keep them."""
    if aof:
        return Check("redis", True, answers + "; append-only file on")
    if save.strip():
        return Check(
            "redis",
            True,
            answers + f"; RDB snapshots only ({save}): a crash loses the last minutes of "
            "loop state; appendonly yes is safer",
        )
    return Check(
        "redis",
        False,
        answers + " but keeps nothing on disk: a restart loses every loop",
        "run redis-server with --appendonly yes (or set save points)",
    )


def _github(settings: Settings) -> Check:
    from bot.io.github.client import GitHubApp

    try:
        app = GitHubApp(settings, sleep=lambda s: None)
        info = app.app_info()
        installs = app.installation_ids()
        return Check(
            "github app",
            True,
            f"authenticated as '{info.get('slug')}' at "
            f"{settings.api_url}, {len(installs)} installation(s)",
        )
    except Exception as exc:  # noqa: BLE001
        return Check(
            "github app",
            False,
            f"{settings.api_url}: {exc}",
            "check GITHUB_APP_ID and the private key (app settings → private keys)",
        )


def _client(settings: Settings) -> anthropic.Anthropic:
    key = settings.anthropic_api_key
    base = settings.anthropic_base_url
    return anthropic.Anthropic(
        api_key=key.get_secret_value() if key else None,
        base_url=str(base).rstrip("/") if base else None,
        max_retries=1,
        timeout=10,
    )


def model_checks(settings: Settings, now: datetime | None = None) -> list[Check]:
    """The model endpoint accepts the key; then each model loopbot is set to use, by
    ``GET /v1/models/{id}``: unknown or retired fails, deprecated or retiring within 60
    days warns, naming the date; the window and output limit are shown."""
    from jobs.models import ModelCatalog, UnknownModel

    base = str(settings.anthropic_base_url or "https://api.anthropic.com").rstrip("/")
    catalog = ModelCatalog(_client(settings), settings)
    try:
        active = catalog.active()
    except anthropic.APIStatusError as exc:
        return [
            Check(
                "model endpoint",
                False,
                f"{base}: HTTP {exc.status_code}",
                "check ANTHROPIC_API_KEY (and ANTHROPIC_BASE_URL if you use a proxy)",
            )
        ]
    except anthropic.APIError as exc:
        return [
            Check(
                "model endpoint",
                False,
                f"{base}: {exc}",
                "check the network path to the Anthropic API",
            )
        ]
    checks = [Check("model endpoint", True, f"{base} accepts the key")]
    now = now or datetime.now(UTC)
    roles = [("LOOPBOT_MODEL", settings.model), ("LOOPBOT_CRITIC_MODEL", settings.critic_model)]
    if settings.fallback_model:
        roles.append(("LOOPBOT_FALLBACK_MODEL", settings.fallback_model))
    choose = f"one of: {', '.join(active)}" if active else "a model the Models API lists"
    for env, model in roles:
        name = f"model {env}"
        try:
            spec = catalog.spec(model)
        except UnknownModel:
            checks.append(
                Check(name, False, f"{model}: unknown to {base}", f"set {env} to {choose}")
            )
            continue
        if not spec.known:
            checks.append(
                Check(
                    name,
                    False,
                    f"{model}: the Models API did not answer (see the log)",
                    "check the network path to the Anthropic API",
                )
            )
            continue
        stands = standing(spec, now)
        detail = (
            f"{model}: {stands.why}; window {spec.window:,} tokens, "
            f"max output {spec.max_output:,}, {_thinking(spec)}"
        )
        effort = settings.effort
        warn = stands.warn
        sent = thinking_params(spec, effort).get("output_config", {}).get("effort")
        if effort is not None and sent != effort:
            detail += f"; LOOPBOT_EFFORT={effort} is not a level it takes: it is not sent"
            warn = True
        checks.append(Check(name, not stands.fail, detail, f"set {env} to {choose}", warn=warn))
    checks.append(_allowed(settings, catalog, {m for _, m in roles}, now))
    return checks


def backend_checks(settings: Settings) -> list[Check]:
    """Each agent backend the operator allows (LOOPBOT_AGENT_BACKENDS): its version and,
    for one that runs inside the sandbox, a trial turn through the model gateway."""
    checks = []
    for backend in sorted(settings.agent_backends):
        name = f"agent backend {backend}"
        if backend == "builtin":
            detail = f"the built-in agent (Messages API, anthropic {anthropic.__version__})"
            checks.append(Check(name, True, detail))
        elif backend in ("claude-code", "opencode"):
            checks.append(_cli_backend(settings, name, backend))
        elif backend == "codex":
            checks.append(_codex_backend(settings, name))
        else:  # the settings refuse unknown names; kept so a new one is never silent
            fix = "see docs/operating.md#agent-backends"
            checks.append(Check(name, False, "unknown backend", fix))
    return checks


def _cli_backend(settings: Settings, name: str, backend: str) -> Check:
    """A backend CLI (Claude Code, opencode): its version, then a trial turn in the
    sandbox through the model gateway (``jobs.agents.cli.trial``)."""
    from jobs.agents import claude_code, opencode
    from jobs.agents.backends import run_trial
    from jobs.models import ModelCatalog, UnknownModel

    if backend == "claude-code":
        label, version = "Claude Code", claude_code.cli_version()
        install = "./scripts/setup --claude-code (or pip install 'loopbot[claude-code]')"
    else:
        label, version = "opencode", opencode.cli_version()
        install = "./scripts/setup --opencode (the opencode-ai npm package, pinned)"
    if version is None:
        return Check(name, False, f"{label} is not installed on this worker", install)
    client = _client(settings).with_options(timeout=60)
    try:
        spec = ModelCatalog(client, settings).spec(settings.model)
    except UnknownModel:
        return Check(name, False, f"{label} {version}; {settings.model} is unknown")
    result = run_trial(backend, client, settings, settings.model, spec)
    fix = "see the line above for the sandbox and the model; docs/operating.md#agent-backends"
    return Check(name, result.ok, f"{label} {version}: {result.detail}", fix)


def _codex_backend(settings: Settings, name: str) -> Check:
    """Codex: its version, the codex model known to OPENAI_BASE_URL with OPENAI_API_KEY,
    then a trial turn in the sandbox through the gateway's OpenAI side."""
    from bot.core import openai_models
    from jobs.agents import codex
    from jobs.agents.backends import run_trial
    from jobs.gateway.responses import OpenAIUpstream

    version = codex.cli_version()
    if version is None:
        return Check(name, False, "Codex is not installed on this worker", codex.CodexAgent.install)
    if settings.openai_api_key is None:
        return Check(name, False, f"Codex {version}; OPENAI_API_KEY is not set", "set it")
    upstream = OpenAIUpstream(settings, timeout=60)
    model = settings.codex_model
    known, why = upstream.model_exists(model)
    if not known:
        fix = "check OPENAI_API_KEY, OPENAI_BASE_URL and LOOPBOT_CODEX_MODEL"
        return Check(name, False, f"Codex {version}; {model}: {why}", fix)
    spec = openai_models.spec(model, settings.context_window)
    result = run_trial("codex", upstream, settings, model, spec)
    fix = "see the line above for the sandbox; docs/operating.md#agent-backends"
    return Check(name, result.ok, f"Codex {version}: {result.detail}", fix)


def _thinking(spec: ModelSpec) -> str:
    if not spec.adaptive:
        return "no adaptive thinking (no thinking or effort is asked of it)"
    levels = [e for e in EFFORTS if e in spec.efforts]
    return f"adaptive thinking, effort {', '.join(levels)}" if levels else "adaptive thinking"


def _allowed(settings: Settings, catalog: ModelCatalog, checked: set[str], now: datetime) -> Check:
    """Every other model a loop.yml may choose (LOOPBOT_ALLOWED_MODELS) must exist too."""
    from bot.core.pricing import is_openai
    from jobs.models import UnknownModel

    # OpenAI's models (the codex backend's) are not Anthropic's to describe: doctor's
    # codex check asks OpenAI about LOOPBOT_CODEX_MODEL.
    others = sorted(m for m in settings.allowed_models - checked if not is_openai(m))
    bad = []
    for model in others:
        try:
            if standing(catalog.spec(model), now).fail:
                bad.append(f"{model} (retired)")
        except UnknownModel:
            bad.append(f"{model} (unknown)")
    if bad:
        return Check(
            "allowed models",
            False,
            f"LOOPBOT_ALLOWED_MODELS names models the API cannot run: {', '.join(bad)}",
            "remove them from LOOPBOT_ALLOWED_MODELS",
        )
    listed = ", ".join(sorted(settings.allowed_models))
    return Check(
        "allowed models",
        True,
        f"a loop.yml may choose {listed}; effort up to {settings.max_effort} (LOOPBOT_MAX_EFFORT)",
    )


def _data_dir(settings: Settings) -> Check:
    d = settings.data_dir
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".doctor"
        probe.write_text("ok")
        probe.unlink()
        free = shutil.disk_usage(d).free / 2**30
        return Check("data dir", True, f"{d} is writable, {free:.1f} GiB free")
    except OSError as exc:
        return Check("data dir", False, f"{d}: {exc}", "set LOOPBOT_DATA_DIR to a writable dir")
