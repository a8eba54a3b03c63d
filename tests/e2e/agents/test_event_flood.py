"""One Codex answer whose code-mode script runs many commands with huge strings, built at no
token cost (issue 37, item 1, reproduction (b): one answer made 12 events and +240 MiB in
Redis, about 3 GiB a turn at the default step cap). The real Codex in the sandbox, through
the gateway, on the local Responses API. Before the fix each event was stored whole, twice.
Reproduction (a), a sandbox process writing into the CLI's stdout, is
tests/io/agents/test_cli_flood.py (a root worker's sandbox cannot reopen the CLI's pipe)."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.rules import event_size as es
from bot.io.store import Store
from bot.standins import openai as o
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.openai import OpenAIServer
from jobs.agents import codex
from tests.conftest import Web
from tests.e2e.agents.test_codex import APPROVE, KEY, YML, env_extra, events, openai, patch, start

__all__ = ["env_extra", "openai"]  # the fixtures, from test_codex
pytestmark = pytest.mark.skipif(codex.cli_path() is None, reason="Codex is not installed")
MiB = 1 << 20

# Thirty commands of 64 KiB (read, and cut to the event's bound), then six of 4 MiB (their
# lines are past the reader's limit: dropped unread; as many run as Codex's code mode
# runs before its own time limit, which a loaded machine reaches sooner), then the fix.
FLOOD = """
const huge = "x".repeat(4 << 20), big = "y".repeat(64 << 10);
for (let i = 0; i < 30; i++) {
  try { await tools.exec_command({cmd: "true #" + i + big}); } catch (e) {}
}
for (let i = 0; i < 6; i++) {
  try { await tools.exec_command({cmd: "true " + huge}); } catch (e) {}
}
text("flooded");
"""


def stream_bytes(redis: Redis, name: str) -> int:
    return int(redis.memory_usage(name, samples=0) or 0)


def test_one_codex_answer_running_commands_of_megabytes_leaves_redis_bounded(
    github: GitHubServer,
    model: AnthropicServer,
    openai: OpenAIServer,
    web: Web,
    redis: Redis,
    drain: Any,
) -> None:
    openai.play(o.cx_exec(FLOOD), o.cx_patch(patch("a - b", "a + b")), o.text("Fixed add."))
    model.play(APPROVE)
    before = int(redis.info("memory")["used_memory"])
    start(github, drain, YML.replace("max_turns: 3", "max_turns: 1"))
    record = Store(redis).get(KEY)
    assert record is not None and record.reason == "merged", events(redis)
    loop = stream_bytes(redis, f"loopbot:events:{KEY}")
    glob = stream_bytes(redis, "loopbot:events")
    grew = int(redis.info("memory")["used_memory"]) - before
    # The bound: about 8 KiB an event in the loop's stream (its title and input, cut), a
    # short copy in the global one. Measured: 0.35 MiB and 0.04 MiB, Redis +1.5 MiB in all;
    # before the fix, 65 MiB in each stream and +131 MiB.
    assert loop < 2 * MiB, loop
    assert glob < MiB, glob
    assert grew < 8 * MiB, grew
    tools = [t for t in events(redis, "agent_tool") if t["tool"] == "exec_command"]
    assert tools  # the 64 KiB commands were read and shown, cut
    assert all(len(t["input"]["cmd"]) < es.FIELD_CHARS + 50 for t in tools)
    assert all(len(t["title"]) < es.FIELD_CHARS + 50 for t in tools)
    assert not any("true xxxx" in t["title"] for t in tools)  # the 4 MiB lines: unread
