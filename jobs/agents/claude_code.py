"""Claude Code as the loop's agent (``agent.backend: claude-code``), inside the sandbox.

One headless CLI run (``claude -p``, stream-json output) per loopbot turn, in the same
sandbox as verify: the worktree writable, a private HOME, no secret in its environment
or on its file system, no network but the model gateway (``jobs/gateway/messages.py``, the only
holder of the key and the budget) and the repository's allowed egress. The loop around
it does not change: it commits, pushes, verifies, audits and merges as for the built-in
agent (``jobs/agents/agent.py``), whose ``run_turn`` this class mirrors.

* **Session.** Turn 1 starts a session with a fixed id (``--session-id``); every later
  turn resumes it (``--resume``), on any worker: the session's transcript is saved with
  the loop (``Store.save_agent_session``) after each turn and written back into the
  private HOME before the next.
* **Rules, not prompts.** No permission prompts (``bypassPermissions``: nothing outside
  the sandbox is reachable); no setting source (``--setting-sources ""``), so no hook,
  permission or CLAUDE.md from the worktree (which the agent controls) applies, and no
  MCP server but none (``--strict-mcp-config``). The maintainers' instructions come from
  the default branch, framed by loopbot, as ``--append-system-prompt``.
* **Limits.** The step cap is the CLI's ``--max-turns``; a cancel, a drain, a stall (no
  output for ``stall_timeout``) or a spent budget (the gateway refused a call) kills the
  CLI's whole process tree (its sandbox) at the next check, about once a second.
* **Shown.** Each stream-json event becomes a session-log event: the text, each tool
  call (a ``Bash`` command or an edited path as its title) and its result.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any

from bot.core.models import ModelSpec
from bot.io.logs import get_logger
from jobs.agents import mcp
from jobs.agents.agent import Limits
from jobs.agents.cli import CliAgent, Run, Trial, Turn, cli_extra, stage_home
from jobs.agents.cli import trial as cli_trial
from jobs.agents.session import MAX_SESSION, moved_note
from jobs.agents.session import pack as pack_files
from jobs.agents.session import unpack as unpack_files
from jobs.gateway import messages as gateway
from jobs.sandbox.bwrap import INSIDE_HOME
from jobs.sandbox.home import HomeLink

log = get_logger("loopbot.claude_code")

INSIDE_CLI = "/opt/loopbot/claude/claude"
SESSION_NAMESPACE = uuid.UUID("7b1f3c1e-5a43-4f55-9d2f-6c3b8e0a9d10")


def cli_path() -> Path | None:
    """The Claude Code CLI that ``claude-agent-sdk`` ships (``pip install
    loopbot[claude-code]``), or None when the extra is not installed."""
    try:
        import claude_agent_sdk
    except ImportError:
        return None
    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    return path if path.is_file() else None


def cli_version() -> str | None:
    path = cli_path()
    if path is None:
        return None
    stamp = path.parent / "claude.version"
    return stamp.read_text().strip() if stamp.is_file() else "unknown"


def project_dir(cwd: str) -> str:
    """Where Claude Code keeps the sessions of a working directory, under
    ``~/.claude/projects`` (every character but letters and digits becomes ``-``)."""
    return re.sub(r"[^A-Za-z0-9]", "-", cwd)


def session_id(key: str) -> str:
    """A loop's session id: fixed per loop (a UUID, as the CLI requires)."""
    return str(uuid.uuid5(SESSION_NAMESPACE, key))


def _projects(cwd: str) -> str:
    """Where the sessions of ``cwd`` are, relative to HOME."""
    return f".claude/projects/{project_dir(cwd)}"


def pack(home: int, cwd: str, session: str, limit: int = MAX_SESSION) -> bytes:
    """The session's transcript (and its subagents') out of the HOME open at ``home``,
    as a tar.gz."""
    return pack_files(home, _projects(cwd), cwd, pick=lambda n: n.startswith(session), limit=limit)


def unpack(data: bytes, seed: Path, cwd: str) -> str | None:
    """``pack``'s archive back into the seed of a fresh HOME, for the working directory
    ``cwd`` (another worker's worktree path may differ: the project directory follows it).
    Returns the working directory the session ran in before (None: not recorded)."""
    return unpack_files(data, seed, _projects(cwd))


def stage(seed: Path, prompt: str, system: str) -> None:
    stage_home(seed, {"prompt.txt": prompt, "system.txt": system})


def cli_command(model: str, max_turns: int, session_args: list[str]) -> str:
    """The shell command that runs one headless turn inside the sandbox."""
    argv = [
        INSIDE_CLI,
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        model,
        "--max-turns",
        str(max_turns),
        "--permission-mode",
        "bypassPermissions",
        "--setting-sources",
        "",
        "--strict-mcp-config",
        "--disable-slash-commands",
        *session_args,
    ]
    return (
        shlex.join(argv)
        + f' --append-system-prompt "$(cat {INSIDE_HOME}/.loopbot/system.txt)"'
        + f" < {INSIDE_HOME}/.loopbot/prompt.txt"
    )


def environment(gw: gateway.ModelGateway, model: str) -> dict[str, str]:
    """Claude Code's environment: the gateway as its API with the placeholder key, the
    loop's model for everything, and nothing phoning home."""
    return {
        "ANTHROPIC_BASE_URL": gateway.BASE_URL,
        "ANTHROPIC_API_KEY": gw.placeholder,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        # Every model Claude Code could pick for itself or a subagent is the loop's:
        # the gateway refuses any other.
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
    }


class ClaudeCodeAgent(CliAgent):
    """The ``claude-code`` backend. One session per loop, with a fixed id
    (``--session-id`` on turn 1, ``--resume`` after); rules, not prompts: no permission
    prompts (``bypassPermissions``: nothing outside the sandbox is reachable), no setting
    source (``--setting-sources ""``: no hook, permission or CLAUDE.md from the worktree,
    which the agent controls), no MCP server but loopbot's (``--strict-mcp-config``); the
    maintainers' instructions come from the default branch, framed by loopbot, as
    ``--append-system-prompt``; the step cap is ``--max-turns``."""

    name = "claude-code"
    label = "Claude Code"
    install = "pip install 'loopbot[claude-code]'"
    stops_at_cap = True  # --max-turns

    def binary(self) -> Path | None:
        return cli_path()

    def start(
        self,
        binary: Path,
        home: HomeLink,
        gw: gateway.ModelGateway,
        prompt: str,
        saved: tuple[str, bytes] | None,
        limits: Limits,
    ) -> Run:
        cwd = str(self.sandbox.worktree)
        session, note = session_id(self.key), ""
        if saved is not None:
            session = saved[0]
            note = moved_note(unpack(saved[1], home.seed, cwd), cwd)
        stage(home.seed, note + prompt, self.system)
        more = ["--session-id", session] if saved is None else ["--resume", session]
        if self.mcp_servers:  # in HOME, never in the worktree: nothing to commit
            config = json.dumps(mcp.claude_code_config(self.mcp_servers))
            stage_home(home.seed, {"mcp.json": config})
            more += ["--mcp-config", f"{INSIDE_HOME}/.loopbot/mcp.json"]
        command = cli_command(self.model, max(1, limits.step_cap), more)
        env = environment(gw, self.model)
        if self.mcp_servers:
            # The servers' tools offered as tools, not behind a search the model must
            # think of first (a loop has few servers, each named in loop.yml).
            env["ENABLE_TOOL_SEARCH"] = "false"
        extra = cli_extra(binary, str(Path(INSIDE_CLI).parent), home, gw, env)
        return Run(command, extra, session, saved is not None)

    def save(self, home: int, session: str) -> bytes:
        return pack(home, str(self.sandbox.worktree), session)

    def event(self, state: Turn, event: dict[str, Any]) -> None:
        kind = event.get("type")
        message = event.get("message") if isinstance(event.get("message"), dict) else {}
        blocks = [b for b in (message or {}).get("content") or [] if isinstance(b, dict)]
        if kind == "assistant":
            for b in blocks:
                if b.get("type") == "text" and str(b.get("text", "")).strip():
                    self.said(state, str(b["text"]))
                elif b.get("type") == "tool_use":
                    name, given = str(b.get("name", "")), b.get("input") or {}
                    self.called(state, str(b.get("id", "")), name, given, tool_title(name, given))
        elif kind == "user":
            for b in blocks:
                if b.get("type") != "tool_result":
                    continue
                content = b.get("content")
                if isinstance(content, list):
                    texts = [str(c.get("text", "")) for c in content if isinstance(c, dict)]
                    content = "\n".join(texts)
                call = str(b.get("tool_use_id", ""))
                self.answered(state, call, str(content or ""), bool(b.get("is_error")))
        elif kind == "result":
            state.result = event
            if event.get("result"):
                state.text = str(event["result"])
            if event.get("subtype") == "error_max_turns":
                state.step_cap = True
            elif event.get("is_error"):
                state.error = str(event.get("result") or "")


def tool_title(name: str, given: dict[str, Any]) -> str:
    """A tool call as one line: a command's text, an edited file's path."""
    if name == "Bash":
        return str(given.get("command", ""))[:300]
    for key in ("file_path", "path", "pattern", "description", "prompt"):
        if given.get(key):
            return f"{name} {str(given[key])[:300]}"
    return name


def trial(
    client: Any, settings: Any, model: str, spec: ModelSpec, *, timeout: float = 180.0
) -> Trial:
    """``loopbot doctor``'s trial turn (``jobs.agents.cli.trial``), with one retry: an
    overloaded API fails the check now, not after the CLI's minutes of backoff."""
    return cli_trial(
        ClaudeCodeAgent,
        client,
        settings,
        model,
        spec,
        timeout=timeout,
        extra_env={"CLAUDE_CODE_MAX_RETRIES": "1"},
    )
