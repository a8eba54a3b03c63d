"""MCP servers per worktree (``agent.mcp_servers`` in loop.yml): checked, then handed to
the backend in its own config.

A server is a stdio program of the repository's (``command``, ``args``, ``env``). The
backend CLI starts it inside the sandbox, as its child, in the worktree, with the
sandbox's network and nothing more; its config is written into the backend's private
HOME (``--mcp-config`` for Claude Code, the ``mcp`` key of opencode's config), never into
the worktree, so it is never committed.

Before the first turn loopbot starts each server once in the sandbox and asks it what
MCP asks first (``initialize``, then ``tools/list``): a server that does not answer
within ``CHECK_SECONDS`` is a clear error on the issue, not a backend that silently runs
without it (opencode drops a failed server without a word) or hangs on it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from bot.core.repo_config import McpServer
from jobs.sandbox.bwrap import Extra, Sandbox

CHECK_SECONDS = 20.0
EXITED = "loopbot-mcp-exited:"  # the check's own line once the server ended
PROTOCOL = "2025-06-18"
_HANDSHAKE = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "loopbot-check", "version": "1"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
]


@dataclass(frozen=True)
class Checked:
    name: str
    tools: tuple[str, ...] = ()
    problem: str | None = None


def check_command(server: McpServer) -> str:
    """The shell command that feeds the handshake to the server and keeps its stdin open
    (a server may stop reading at end of input before it answers) until it is killed."""
    lines = " ".join(shlex.quote(json.dumps(m)) for m in _HANDSHAKE)
    run = shlex.join([server.command, *server.args])
    # A server that ends prints the sentinel with its status: the check stops at once
    # instead of waiting for the sleep that holds its stdin open.
    return (
        f"{{ printf '%s\\n' {lines}; sleep {int(CHECK_SECONDS) + 5}; }} | "
        f'{{ {run} 2>&1; echo "{EXITED}$?"; }}'
    )


def answers(output: str) -> dict[int, dict[str, Any]]:
    """The JSON-RPC answers in a server's output, by id."""
    found: dict[int, dict[str, Any]] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and isinstance(msg.get("id"), int):
            found[msg["id"]] = msg
    return found


def judge(name: str, output: str, exit_code: int, seconds: float) -> Checked:
    """What a server's answer to the handshake says of it (pure: the test's and the
    check's one reading)."""
    got = answers(output)
    ended = re.search(rf"^{EXITED}(\d+)$", output, re.M)
    if ended:
        exit_code = int(ended.group(1))
        output = output.replace(ended.group(0), "")
    listed = got.get(2, {}).get("result")
    if isinstance(listed, dict) and isinstance(listed.get("tools"), list):
        names = tuple(
            str(t.get("name")) for t in listed["tools"] if isinstance(t, dict) and t.get("name")
        )
        return Checked(name, names)
    error = got.get(1, {}).get("error") or got.get(2, {}).get("error")
    said = [
        ln for ln in output.splitlines() if ln.strip() and not ln.startswith(("{", "[loopbot:"))
    ]
    tail = " / ".join(said[-3:])[-300:]
    if error:
        why = f"it answered with an error: {json.dumps(error)[:300]}"
    elif 1 in got:
        why = "it answered initialize but not tools/list"
    elif exit_code not in (0, 137, 124) or tail:
        why = f"it exited ({exit_code}) without answering" + (f": {tail}" if tail else "")
    else:
        why = f"it did not answer within {CHECK_SECONDS:.0f} s"
    return Checked(name, problem=f"the MCP server `{name}` (`agent.mcp_servers`) {why}")


def check(sandbox: Sandbox, servers: dict[str, McpServer]) -> list[Checked]:
    """Each server started in ``sandbox``, asked for its tools, and stopped."""
    out = []
    for name, server in sorted(servers.items()):
        seen = bytearray()

        def over(seen: bytearray) -> str | None:
            text = seen.decode(errors="replace")
            if 2 in answers(text):
                return "answered"  # stop it now, not at the end of its sleep
            return "exited" if EXITED in text else None

        def done(chunk: bytes, seen: bytearray = seen) -> bool:
            seen.extend(chunk[: 1 << 20])  # what a check needs; the rest is the sandbox's
            return over(seen) is not None

        def watch(seen: bytearray = seen) -> str | None:
            return over(seen)

        result = sandbox.run(
            check_command(server),
            timeout=CHECK_SECONDS,
            extra=Extra(env=dict(server.env)),
            watch=watch,
            on_output=done,
        )
        out.append(judge(name, result.output, result.exit_code, result.seconds))
    return out


def claude_code_config(servers: dict[str, McpServer]) -> dict[str, Any]:
    """Claude Code's ``--mcp-config`` file."""
    return {
        "mcpServers": {
            name: {
                "type": "stdio",
                "command": s.command,
                "args": list(s.args),
                "env": dict(s.env),
            }
            for name, s in servers.items()
        }
    }


def opencode_config(servers: dict[str, McpServer]) -> dict[str, Any]:
    """The ``mcp`` key of opencode's config."""
    return {
        name: {
            "type": "local",
            "command": [s.command, *s.args],
            "environment": dict(s.env),
            "enabled": True,
            "timeout": int(CHECK_SECONDS * 1000),
        }
        for name, s in servers.items()
    }
