"""Codex as the loop's agent (``agent.backend: codex``), inside the sandbox.

One headless run (``codex exec --json``) per loopbot turn, driven as every backend CLI
is (``jobs/agents/cli.py``): the sandbox, a private HOME, and the model gateway's OpenAI
side (``jobs/gateway/responses.py``) as its Responses API, named by a model provider of
loopbot's with a placeholder key. The real ``OPENAI_API_KEY`` stays in the worker.

* **Session.** Codex names its thread (``thread.started``) and writes it as a rollout
  file under ``$CODEX_HOME/sessions``; loopbot saves that directory after every turn and
  resumes with ``codex exec resume <thread id>`` on any worker. The worktree is shown at
  one fixed path (``INSIDE_WORKTREE``), so the history's paths stay true.
* **Rules, not prompts.** loopbot's ``config.toml`` in the private ``CODEX_HOME`` is the
  only user config, checked strictly (``--strict-config``); a project's ``.codex/`` is
  read only for a project the user trusted, and no project is trusted here; no
  ``AGENTS.md`` (``project_doc_max_bytes = 0``), no execpolicy rules (``--ignore-rules``),
  no skills (the worktree's skills were offered until ``skills.include_instructions`` was
  off: the e2e test plants one), no hooks, plugins, apps, memories, goals, subagents, web
  search or image generation, no update check, no analytics, no history file. Codex's own
  sandbox is off (``--dangerously-bypass-approvals-and-sandbox``): it runs inside loopbot's,
  which has
  no privileges to nest one. loopbot's system text and the maintainers' instructions
  (default branch) are its ``developer_instructions``.
* **Limits.** Codex has no step limit of its own: the harness counts its tool calls (the
  stream's, and at the gateway the model's) and stops the run past the cap.
"""

from __future__ import annotations

import contextlib
import json
import platform
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bot.core.repo_config import McpServer
from jobs.agents.agent import Limits
from jobs.agents.cli import CliAgent, Run, Turn, cli_extra, stage_home
from jobs.agents.session import pack, unpack
from jobs.gateway import messages as gateway
from jobs.gateway.responses import ResponsesGateway
from jobs.sandbox.bwrap import INSIDE_HOME
from jobs.sandbox.home import HomeLink

VERSION = "0.169.0"  # the @openai/codex npm package, as tested (scripts/setup installs it)
INSTALL_DIR = Path(sys.prefix) / "opt" / "codex"  # npm install --prefix (scripts/setup)
INSIDE_ROOT = "/opt/loopbot/codex"  # the platform package's vendor directory
INSIDE_CLI = f"{INSIDE_ROOT}/bin/codex"
INSIDE_WORKTREE = "/work/repo"
CODEX_HOME = ".codex"  # under HOME
SESSIONS = "sessions"  # under CODEX_HOME: the rollout files
PROVIDER = "loopbot"
# Codex runs its code mode's JavaScript in a V8 host that reserves far more address space
# than it uses: under the sandbox's 8 GiB limit it failed to start ("gRPC code-mode
# session closed"); 16 GiB was enough. Real memory stays bounded by the sandbox's cgroup.
ADDRESS_SPACE = 32 << 30
# Codex features that reach beyond the worktree or steer it from files loopbot did not
# write (all off; ``--strict-config`` makes a renamed one an error, not a silent no-op).
FEATURES_OFF = (
    "unbounded_connection_retries",
    "apps",
    "plugins",
    "goals",
    "hooks",
    "image_generation",
    "tool_suggest",
    "skill_search",
    "computer_use",
    "browser_use",
    "in_app_browser",
    "memories",
    "shell_snapshot",
)


def _triple() -> tuple[str, str] | None:
    return {
        "x86_64": ("x64", "x86_64-unknown-linux-musl"),
        "aarch64": ("arm64", "aarch64-unknown-linux-musl"),
        "arm64": ("arm64", "aarch64-unknown-linux-musl"),
    }.get(platform.machine())


def vendor_dir(base: Path = INSTALL_DIR) -> Path | None:
    """The platform package's vendor directory (the binary, and the ``rg`` it uses), or
    None when Codex is not installed."""
    found = _triple()
    if found is None:
        return None
    arch, triple = found
    path = base / "node_modules" / "@openai" / f"codex-linux-{arch}" / "vendor" / triple
    return path if (path / "bin" / "codex").is_file() else None


def cli_path(base: Path = INSTALL_DIR) -> Path | None:
    vendor = vendor_dir(base)
    return vendor / "bin" / "codex" if vendor is not None else None


def cli_version(base: Path = INSTALL_DIR) -> str | None:
    if cli_path(base) is None:
        return None
    try:
        package = base / "node_modules" / "@openai" / "codex" / "package.json"
        meta = json.loads(package.read_text())
    except (OSError, ValueError):
        return "unknown"
    return str(meta.get("version", "unknown"))


def _toml(value: Any) -> str:
    """``value`` as TOML (strings, numbers, booleans, lists and tables of them). JSON's
    string escapes are TOML's basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not TOML: {type(value).__name__}")


def config(
    model: str,
    window: int,
    effort: str | None,
    system: str,
    servers: dict[str, McpServer] | None = None,
) -> str:
    """Codex's whole ``config.toml`` for a loop's turn."""
    top: dict[str, Any] = {
        "model": model,
        "model_provider": PROVIDER,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "web_search": "disabled",
        "check_for_update_on_startup": False,
        "project_doc_max_bytes": 0,
        "developer_instructions": system,
        "model_context_window": window,
    }
    if effort is not None:
        top["model_reasoning_effort"] = effort
    tables: dict[str, dict[str, Any]] = {
        "features": {name: False for name in FEATURES_OFF},
        "agents": {"enabled": False},
        # No skills block: a skill in the worktree (.agents/skills, .codex/skills) would
        # be the agent's own text in the developer role.
        "skills": {"include_instructions": False},
        "skills.bundled": {"enabled": False},
        "analytics": {"enabled": False},
        "history": {"persistence": "none"},
        f"model_providers.{PROVIDER}": {
            "name": "loopbot model gateway",
            "base_url": f"{gateway.BASE_URL}/v1",
            "env_key": "OPENAI_API_KEY",
            "wire_api": "responses",
            # A refused call is retried a few times, not without end (the gateway counts
            # each; a down API ends the turn, not the budget of the stall timeout).
            "request_max_retries": 4,
            "stream_max_retries": 4,
        },
    }
    for name, server in (servers or {}).items():
        tables[f"mcp_servers.{name}"] = {
            "command": server.command,
            "args": list(server.args),
            "env": dict(server.env),
        }
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines += ["", f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


def environment(placeholder: str) -> dict[str, str]:
    """What Codex's process gets: its home and the gateway's placeholder key."""
    return {
        "CODEX_HOME": f"{INSIDE_HOME}/{CODEX_HOME}",
        "OPENAI_API_KEY": placeholder,
        "OPENAI_BASE_URL": f"{gateway.BASE_URL}/v1",  # as the provider has it
        "NO_COLOR": "1",
        "RUST_LOG": "error",
    }


def command(session: str | None) -> str:
    """The shell command that runs one headless turn inside the sandbox."""
    argv = [INSIDE_CLI, "exec"]
    if session:
        argv += ["resume", session]
    argv += [
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--strict-config",
        "--ignore-rules",
    ]
    return shlex.join(argv) + f' -- "$(cat {INSIDE_HOME}/.loopbot/prompt.txt)" < /dev/null'


class CodexAgent(CliAgent):
    """The ``codex`` backend."""

    name = "codex"
    label = "Codex"
    install = "./scripts/setup --codex"
    # Digests of the ruling texts of the loop's first request (ResponsesGateway), read
    # from the saved session: what a resumed request may carry as developer messages.
    trusted: set[str] | None = None

    def binary(self) -> Path | None:
        return cli_path()

    def make_gateway(self, **kwargs: Any) -> gateway.ModelGateway:
        # ``client`` is the worker's OpenAIUpstream: OPENAI_BASE_URL with the real key;
        # ``trusted``: the ruling texts kept with the session (ResponsesGateway), set
        # again by ``start`` once the saved session is read.
        return ResponsesGateway(self.client, trusted=self.trusted, **kwargs)

    def start(
        self,
        binary: Path,
        home: HomeLink,
        gw: gateway.ModelGateway,
        prompt: str,
        saved: tuple[str, bytes] | None,
        limits: Limits,
    ) -> Run:
        session = ""
        codex_home = home.seed / CODEX_HOME
        codex_home.mkdir(exist_ok=True)
        if saved is not None:
            session = saved[0]
            meta: dict[str, bytes] = {}
            unpack(saved[1], home.seed, f"{CODEX_HOME}/{SESSIONS}", meta)
            with contextlib.suppress(ValueError, TypeError):
                self.trusted = {str(d) for d in json.loads(meta.get("trusted") or b"null")}
            if isinstance(gw, ResponsesGateway) and self.trusted:
                gw.trusted = set(self.trusted)
        (codex_home / "config.toml").write_text(
            config(self.model, self.spec.window, self.effort, self.system, self.mcp_servers)
        )
        stage_home(home.seed, {"prompt.txt": prompt})
        env = environment(gw.placeholder)
        extra = cli_extra(
            binary,
            INSIDE_ROOT,
            home,
            gw,
            env,
            worktree_at=INSIDE_WORKTREE,
            root=binary.parent.parent,
        )
        extra = replace(extra, address_space=ADDRESS_SPACE)
        return Run(command(session or None), extra, session, saved is not None)

    def save(self, home: int, session: str) -> bytes:
        gw = self.gateway_of_turn
        trusted = getattr(gw, "trusted", None) or self.trusted
        meta = {"trusted": json.dumps(sorted(trusted)).encode()} if trusted else None
        return pack(home, f"{CODEX_HOME}/{SESSIONS}", INSIDE_WORKTREE, meta=meta)

    def event(self, state: Turn, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "thread.started" and isinstance(event.get("thread_id"), str):
            state.session = state.session or event["thread_id"]
        elif kind in ("item.started", "item.completed"):
            item = event.get("item") if isinstance(event.get("item"), dict) else None
            if item is not None:
                self._item(state, item, done=kind == "item.completed")
        elif kind == "turn.completed":
            state.result = {"usage": event.get("usage")}
        elif kind == "turn.failed":
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            state.error = str(message or "the turn failed")[:500]
        elif kind == "error":
            state.error = str(event.get("message") or "error")[:500]

    def _item(self, state: Turn, item: dict[str, Any], *, done: bool) -> None:
        kind = item.get("type")
        call = str(item.get("id", ""))
        if kind == "agent_message" and done and str(item.get("text", "")).strip():
            self.said(state, str(item["text"]))
        elif kind == "command_execution":
            command_text = str(item.get("command", ""))
            if state.tool_of(call) is None:
                self.called(state, call, "exec_command", {"cmd": command_text}, command_text)
            if done:
                failed = item.get("exit_code") not in (0, None) or item.get("status") == "failed"
                self.answered(state, call, str(item.get("aggregated_output") or ""), failed)
        elif kind == "file_change" and done:
            changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
            paths = ", ".join(f"{c.get('kind', '')} {c.get('path', '')}" for c in changes)
            if state.tool_of(call) is None:
                self.called(state, call, "apply_patch", {"changes": changes}, f"patch {paths}")
            self.answered(state, call, paths, item.get("status") == "failed")
        elif kind == "mcp_tool_call":
            name = f"mcp__{item.get('server', '')}__{item.get('tool', '')}"
            if state.tool_of(call) is None:
                given = item.get("arguments") if isinstance(item.get("arguments"), dict) else {}
                self.called(state, call, name, given or {}, name)
            if done:
                error = item.get("error")
                output = json.dumps(item.get("result"))[:4000] if not error else str(error)
                self.answered(state, call, output, bool(error))
