"""A process in the sandbox writing huge "assistant" lines into the CLI's stdout (issue 37,
item 1, reproduction (a): as a non-root worker any sandbox process can reopen the pipe
through ``/proc/<cli>/fd/1``; before the fix 400 MiB reached Redis in 2.5 s). Here the
"CLI" is a script that does it itself, run as Claude Code is (``CliAgent.drive``: the real
sandbox, gateway, pipe and reader, Claude Code's stream parsing), its events stored by the
real ``Store`` on a real redis-server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anthropic
from redis import Redis

from bot.core.models import ModelSpec
from bot.core.rules import event_size as es
from bot.core.rules.loop import budget
from bot.io.store import Store
from jobs.agents import cli
from jobs.agents.agent import Limits
from jobs.agents.claude_code import ClaudeCodeAgent
from jobs.sandbox.bwrap import Sandbox
from tests.helpers import worker_settings

KEY = "acme/widgets#1"
MiB = 1 << 20
# Six lines of 7 MiB (under the old 8 MiB line limit), then 1,500 of 16 KiB (each under the
# line limit: parsed, and cut to its event's bound), then the CLI's own last words.
FLOOD = """\
import json, sys
out = sys.stdout.buffer
def said(text):
    event = {"type": "assistant", "message": {"content": [{"type": "text", "text": text}]}}
    out.write((json.dumps(event) + "\\n").encode())
for n in range(6):
    said(str(n) * (7 << 20))
for n in range(1500):
    said("B" * (16 << 10))
said("Done.")
out.flush()
"""


class FloodingCli(ClaudeCodeAgent):
    """Claude Code's backend, running the flood script in its place."""

    script = Path("/nonexistent")

    def binary(self) -> Path | None:
        return self.script

    def start(
        self, binary: Path, home: Any, gw: Any, prompt: str, saved: Any, limits: Any
    ) -> cli.Run:
        extra = cli.cli_extra(binary, "/opt/flood", home, gw, {})
        return cli.Run("python3 /opt/flood/flood.py", extra, "s-1", False)

    def save(self, home: int, session: str) -> bytes:
        return b""  # no session of Claude Code's in this HOME


def flooding(box: Sandbox, store: Store, script: Path) -> FloodingCli:
    agent = FloodingCli(
        client=anthropic.Anthropic(api_key="sk-x", base_url="http://127.0.0.1:9"),
        model="claude-x",
        spec=ModelSpec("claude-x", 200_000, 8_000, False, frozenset()),
        effort=None,
        max_tokens=1000,
        sandbox=box,
        store=store,
        key=KEY,
        guard=lambda request: budget.Call(tokens=1, usd=0.0),
        verify="true",
        network=False,
        cancelled=lambda: False,
        draining=lambda: False,
        on_event=lambda kind, data: store.event(KEY, kind, **data),
        on_step=lambda n, what: store.event(KEY, "step", step=n, tool=what),
    )
    agent.script = script
    return agent


def stream_bytes(redis: Redis, name: str) -> int:
    return int(redis.memory_usage(name, samples=0) or 0)


def test_huge_lines_on_the_cli_s_stdout_leave_redis_bounded(tmp_path: Path, redis: Redis) -> None:
    script = tmp_path / "flood" / "flood.py"
    script.parent.mkdir()
    script.write_text(FLOOD)
    worktree = tmp_path / "data" / "worktrees" / "issue-1"
    worktree.mkdir(parents=True)
    store = Store(redis)
    before = int(redis.info("memory")["used_memory"])
    with Sandbox(worktree, settings=worker_settings(tmp_path), timeout=120) as box:
        agent = flooding(box, store, script)
        done = agent.drive(
            script,
            "go",
            None,
            Limits(step_cap=10, tool_budget=10, stall_timeout=120),
            lambda model, used: None,
            time.monotonic(),
        )
        done.home.close()
    assert done.result.exit_code == 0, done.result.output[-500:]
    assert done.state.text == "Done."  # the stream was read to its end
    events = store.events(KEY, count=100_000)
    kinds = [e["kind"] for e in events]
    texts = [e["data"]["text"] for e in events if e["kind"] == "agent_text"]
    assert not any(t.startswith("0" * 100) for t in texts)  # no 7 MiB line was parsed
    assert texts and all(len(t) < es.FIELD_CHARS + 50 for t in texts)
    assert kinds.count("events_capped") == 1
    # The bound: the loop's stream holds its budget of the agent's events (Redis's memory
    # for it under 1.5 times that, the allocator's rounding), the global stream a short
    # copy of each. Measured: 5.3 MiB and 0.4 MiB, Redis +5.4 MiB in all; before the fix,
    # 78 MiB in each stream and +155 MiB.
    assert stream_bytes(redis, f"loopbot:events:{KEY}") < es.LOOP_BUDGET_BYTES * 1.5
    assert stream_bytes(redis, "loopbot:events") < 2 * MiB
    grew = int(redis.info("memory")["used_memory"]) - before
    assert grew < es.LOOP_BUDGET_BYTES * 1.5 + 4 * MiB, grew


def test_the_agents_closing_words_are_kept_cut_in_the_conversation(
    tmp_path: Path, redis: Redis
) -> None:
    """The turn's text (loopbot's view of the conversation, saved each turn; the pull
    request's summary) is cut to ``TEXT_KEPT`` characters, however long the CLI's last
    line said it was."""
    script = tmp_path / "flood" / "flood.py"
    script.parent.mkdir()
    script.write_text(
        FLOOD.replace("range(6)", "range(0)")
        .replace("range(1500)", "range(0)")
        .replace('said("Done.")', 'said("Done. " + "C" * 500_000)')
    )
    worktree = tmp_path / "data" / "worktrees" / "issue-1"
    worktree.mkdir(parents=True)
    messages: list[dict[str, Any]] = []
    with Sandbox(worktree, settings=worker_settings(tmp_path), timeout=120) as box:
        outcome = flooding(box, Store(redis), script).run_turn(
            messages, "go", Limits(step_cap=10, tool_budget=10, stall_timeout=120)
        )
    assert outcome.text.startswith("Done. CCC")
    assert len(outcome.text) < 16_050  # cli.TEXT_KEPT and its marker
    assert outcome.text.endswith(f"[{500_006 - 16_000} more characters cut]")
    assert messages[-1] == {"role": "assistant", "content": outcome.text}
