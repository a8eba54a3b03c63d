"""Shared set-up for the benchmarks: private Redis, local GitHub and model, a runtime;
the ``loopbot`` processes they start and the process trees they watch; the scripted
model of the fleet and chaos runs."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis

from bot.core.settings import load_settings
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer
from jobs.runtime import Runtime, install


@dataclass
class Bench:
    root: Path
    redis_server: RedisServer
    github: GitHubServer
    model: AnthropicServer
    env: dict[str, str]
    rt: Runtime

    def close(self) -> None:
        self.github.stop()
        self.model.stop()
        self.redis_server.stop()


def standin_env(github: GitHubServer, model: AnthropicServer) -> dict[str, str]:
    """The settings that make loopbot the local GitHub's App and the local model's client."""
    return {
        "GITHUB_APP_ID": str(github.app_id),
        "GITHUB_PRIVATE_KEY": github.private_key_pem,
        "GITHUB_WEBHOOK_SECRET": github.webhook_secret,
        "GITHUB_API_URL": github.url,
        "ANTHROPIC_API_KEY": "sk-ant-bench",
        "ANTHROPIC_BASE_URL": model.url,
    }


def start(extra: dict[str, str] | None = None) -> Bench:
    root = Path(tempfile.mkdtemp(prefix="loopbot-bench-"))
    redis_server = RedisServer().start()
    github = GitHubServer(root / "github").start()
    model = AnthropicServer().start()
    env = {
        "REDIS_URL": redis_server.url,
        **standin_env(github, model),
        "LOOPBOT_DATA_DIR": str(root / "data"),
        "LOOPBOT_LOG_FORMAT": "json",
        # The local GitHub has no secondary limit here: a pause between writes would be
        # counted as orchestration overhead (the pace is measured on its own).
        "LOOPBOT_GITHUB_WRITE_GAP": "0",
        **(extra or {}),
    }
    settings = load_settings(env, role="worker")
    rt = install(Runtime(settings, Redis.from_url(redis_server.url)))
    return Bench(root, redis_server, github, model, env, rt)


# -- loopbot processes ---------------------------------------------------------------------


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``loopbot ARGS`` (this venv's), its output appended to ``log``, in a session of its
    own (a benchmark stops its whole tree, not the benchmark)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "loopbot"), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def children_of() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    """``pid`` and every process below it (RQ's work horses call setsid(): a process
    group would miss them)."""
    out, todo = [pid], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


# -- the scripted model --------------------------------------------------------------------


def scripted_answer(body: dict[str, Any], note: Callable[[str], tuple[str, bool]]) -> m.Reply:
    """A loop's whole work in a model: the critic approves; a tool's result is answered
    "Written."; else the turn writes the loop's note. ``note`` reads the conversation
    (as JSON) and gives the note's path and whether the first turn leaves it a draft
    (verify refuses a draft: the second turn finishes it)."""
    if (body.get("output_config") or {}).get("format"):
        return m.structured({"verdict": "approve", "summary": "Fine.", "findings": []})
    path, drafts = note(json.dumps(body["messages"]))
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last
    ):
        return m.text("Written.")
    second = any(  # the draft was written: this is the second turn
        msg["role"] == "assistant" and "draft" in json.dumps(msg["content"])
        for msg in body["messages"]
    )
    return m.write_file(path, "done\n" if second or not drafts else "draft\n")
