"""opencode as the loop's agent (``agent.backend: opencode``), inside the sandbox.

One headless run (``opencode run --format json``) per loopbot turn, driven as every
backend CLI is (``jobs/agents/cli.py``): the sandbox, a private HOME, the model gateway
as its Anthropic API (``provider.anthropic.options.baseURL``) with a placeholder key.

* **Session.** opencode names its session (``ses_…``) in its first event; loopbot saves
  opencode's database (``~/.local/share/opencode/opencode.db``, which holds the session)
  after every turn and resumes it with ``--session`` on any worker. opencode runs a
  session in the directory it was created in, so the worktree is shown to it at one
  fixed path (``INSIDE_WORKTREE``) on every worker.
* **Rules, not prompts.** loopbot's config, written into the private HOME and named by
  ``OPENCODE_CONFIG``, is the only one: no project config from the worktree
  (``OPENCODE_DISABLE_PROJECT_CONFIG``), no Claude Code files or external skills, no
  default plugins, no model list fetched, no update, no sharing, no snapshots of the
  worktree into HOME; every permission is allowed (nothing outside the sandbox is
  reachable); the loop's model is the only model, for the title and subagents too; the
  step cap is the ``build`` agent's ``steps``. loopbot's system text and the maintainers'
  instructions (default branch) are its ``instructions``.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from bot.core.repo_config import McpServer
from jobs.agents import mcp
from jobs.agents.agent import Limits
from jobs.agents.cli import CliAgent, Run, Turn, cli_extra, stage_home
from jobs.agents.session import pack, unpack
from jobs.gateway import messages
from jobs.sandbox.bwrap import INSIDE_HOME
from jobs.sandbox.home import HomeLink

VERSION = "1.18.33"  # the opencode-ai npm package, as tested (scripts/setup installs it)
INSTALL_DIR = Path(sys.prefix) / "opt" / "opencode"  # npm install --prefix (scripts/setup)
INSIDE_CLI = "/opt/loopbot/opencode/opencode"
INSIDE_WORKTREE = "/work/repo"
DATA = ".local/share/opencode"  # under HOME: opencode's database
SESSION_FILES = ("opencode.db", "opencode.db-wal", "opencode.db-shm")
TITLE = "loopbot"  # a fixed session title: no model call to make one


def cli_path(base: Path = INSTALL_DIR) -> Path | None:
    """opencode's binary for this machine, from the ``opencode-ai`` npm package's
    platform package (npm installs the one that fits), or None when not installed."""
    arch = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine())
    if arch is None:
        return None
    for name in (f"opencode-linux-{arch}", f"opencode-linux-{arch}-baseline"):
        path = base / "node_modules" / name / "bin" / "opencode"
        if path.is_file():
            return path
    return None


def cli_version(base: Path = INSTALL_DIR) -> str | None:
    if cli_path(base) is None:
        return None
    try:
        meta = json.loads((base / "node_modules" / "opencode-ai" / "package.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    return str(meta.get("version", "unknown"))


def config(
    model: str,
    window: int,
    max_output: int,
    placeholder: str,
    steps: int,
    servers: dict[str, McpServer] | None = None,
) -> dict[str, Any]:
    """opencode's whole configuration for a loop's turn."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "model": f"anthropic/{model}",
        "small_model": f"anthropic/{model}",
        "provider": {
            "anthropic": {
                "options": {"baseURL": f"{messages.BASE_URL}/v1", "apiKey": placeholder},
                # The loop's model with the window and output limit the API gives it:
                # opencode compacts by these, and knows a model it was not built with.
                "models": {
                    model: {
                        "name": model,
                        "limit": {"context": window, "output": max_output},
                        "tool_call": True,
                        "reasoning": True,
                    }
                },
            }
        },
        "enabled_providers": ["anthropic"],
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "permission": {"*": "allow"},
        "agent": {"build": {"steps": steps, "model": f"anthropic/{model}"}},
        "instructions": [f"{INSIDE_HOME}/.loopbot/system.md"],
        "mcp": mcp.opencode_config(servers or {}),
    }


def environment(placeholder: str) -> dict[str, str]:
    """What opencode's process gets: its config, and nothing from the worktree or the
    network that loopbot did not choose."""
    return {
        "OPENCODE_CONFIG": f"{INSIDE_HOME}/.loopbot/opencode.json",
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "ANTHROPIC_API_KEY": placeholder,
        "ANTHROPIC_BASE_URL": messages.BASE_URL,  # as Claude Code has it (the config wins)
    }


def command(session: str | None) -> str:
    """The shell command that runs one headless turn inside the sandbox."""
    argv = [INSIDE_CLI, "run", "--format", "json", "--title", TITLE]
    if session:
        argv += ["--session", session]
    return shlex.join(argv) + f' -- "$(cat {INSIDE_HOME}/.loopbot/prompt.txt)" < /dev/null'


class OpenCodeAgent(CliAgent):
    """The ``opencode`` backend."""

    name = "opencode"
    label = "opencode"
    install = "./scripts/setup --opencode"

    def binary(self) -> Path | None:
        return cli_path()

    def start(
        self,
        binary: Path,
        home: HomeLink,
        gw: messages.ModelGateway,
        prompt: str,
        saved: tuple[str, bytes] | None,
        limits: Limits,
    ) -> Run:
        session = ""
        if saved is not None:
            session = saved[0]
            unpack(saved[1], home.seed, DATA)
        settings = config(
            self.model,
            self.spec.window,
            min(self.max_tokens, self.spec.max_output),
            gw.placeholder,
            max(1, limits.step_cap),
            self.mcp_servers,
        )
        stage_home(
            home.seed,
            {
                "prompt.txt": prompt,
                "system.md": self.system,
                "opencode.json": json.dumps(settings, indent=1),
            },
        )
        inside = str(Path(INSIDE_CLI).parent)
        env = environment(gw.placeholder)
        extra = cli_extra(binary, inside, home, gw, env, worktree_at=INSIDE_WORKTREE)
        return Run(command(session or None), extra, session, saved is not None)

    def save(self, home: int, session: str) -> bytes:
        return pack(home, DATA, INSIDE_WORKTREE, pick=SESSION_FILES.__contains__)

    def event(self, state: Turn, event: dict[str, Any]) -> None:
        if not state.session and isinstance(event.get("sessionID"), str):
            state.session = event["sessionID"]
        kind = event.get("type")
        part = event.get("part") if isinstance(event.get("part"), dict) else {}
        part = part or {}
        if kind == "text" and str(part.get("text", "")).strip():
            self.said(state, str(part["text"]))
        elif kind == "tool_use":
            name = str(part.get("tool", ""))
            call = str(part.get("callID", part.get("id", "")))
            status = part.get("state") if isinstance(part.get("state"), dict) else {}
            status = status or {}
            given = status.get("input") if isinstance(status.get("input"), dict) else {}
            self.called(state, call, name, given or {}, tool_title(name, given or {}))
            if status.get("status") in ("completed", "error"):
                failed = status.get("status") == "error"
                output = status.get("error") if failed else status.get("output")
                self.answered(state, call, str(output or ""), failed)
        elif kind == "step_finish" and part.get("reason") == "length":
            pass  # cut at the output limit: opencode goes on by itself
        elif kind == "error":
            error = event.get("error")
            if isinstance(error, dict):
                data = error.get("data") if isinstance(error.get("data"), dict) else {}
                error = (data or {}).get("message") or error.get("name") or error
            state.error = str(error)[:500]


def tool_title(name: str, given: dict[str, Any]) -> str:
    """A tool call as one line: a command's text, an edited file's path."""
    if name == "bash":
        return str(given.get("command", ""))[:300]
    for key in ("filePath", "path", "pattern", "description", "prompt"):
        if given.get(key):
            return f"{name} {str(given[key])[:300]}"
    return name
