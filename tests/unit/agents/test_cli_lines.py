"""The CLI's stream as ``jobs/agents/cli.py`` reads it: a line past ``MAX_LINE`` (a process
in the sandbox writing into the CLI's stdout through ``/proc/<cli>/fd/1``) is dropped as it
comes, never held whole nor parsed, and the lines after it are read (issue 37, item 1).
Pure: the reader of each backend, fed as the sandbox's pump feeds it (64 KiB chunks)."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from jobs.agents import cli

MiB = 1 << 20
SAID = {
    "claude_code": lambda t: {
        "type": "assistant",
        "message": {"content": [{"type": "text", "text": t}]},
    },
    "opencode": lambda t: {"type": "text", "part": {"text": t}},
    "codex": lambda t: {"type": "item.completed", "item": {"type": "agent_message", "text": t}},
}


def reader(backend: str) -> tuple[cli.CliAgent, list[tuple[str, dict[str, Any]]]]:
    module = importlib.import_module(f"jobs.agents.{backend}")
    cls = next(
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, cli.CliAgent) and v is not cli.CliAgent
    )
    seen: list[tuple[str, dict[str, Any]]] = []
    agent = cls.__new__(cls)
    agent.on_event = lambda kind, data: seen.append((kind, data))
    agent.on_step = lambda step, name: None
    return agent, seen


class Held:
    """The largest buffer the reader held between chunks."""

    def __init__(self) -> None:
        self.most = 0


def feed(agent: cli.CliAgent, state: cli.Turn, stream: bytes, held: Held) -> None:
    for at in range(0, len(stream), 1 << 16):
        agent._read(state, stream[at : at + (1 << 16)])
        held.most = max(held.most, len(state.buffer))


@pytest.mark.parametrize("backend", sorted(SAID))
def test_an_8_mib_line_is_dropped_unparsed_and_the_next_line_read(backend: str) -> None:
    agent, seen = reader(backend)
    state, held = cli.Turn(), Held()
    huge = json.dumps(SAID[backend]("A" * (8 * MiB))).encode()
    near = json.dumps(SAID[backend]("B" * (cli.MAX_LINE + 10))).encode()
    ok = json.dumps(SAID[backend]("fixed it")).encode()
    feed(agent, state, huge + b"\n" + near + b"\n" + huge + b"\n" + ok + b"\n", held)
    assert seen == [("agent_text", {"backend": agent.name, "text": "fixed it"})]
    assert state.text == "fixed it"
    assert held.most <= cli.MAX_LINE


@pytest.mark.parametrize("backend", sorted(SAID))
def test_a_line_just_under_the_limit_is_read(backend: str) -> None:
    agent, seen = reader(backend)
    state = cli.Turn()
    line = json.dumps(SAID[backend]("C" * (cli.MAX_LINE - 200))).encode()
    assert len(line) <= cli.MAX_LINE
    feed(agent, state, line + b"\n", Held())
    assert [k for k, _ in seen] == ["agent_text"] and len(state.text) == cli.MAX_LINE - 200


def test_a_long_line_whole_in_one_chunk_is_dropped_too() -> None:
    agent, seen = reader("opencode")
    state = cli.Turn()
    huge = json.dumps(SAID["opencode"]("D" * (2 * MiB))).encode()
    ok = json.dumps(SAID["opencode"]("ok")).encode()
    agent._read(state, ok + b"\n" + huge + b"\n" + ok + b"\n" + huge)
    agent._read(state, b"\n" + ok + b"\n")
    assert [d["text"] for _, d in seen] == ["ok", "ok", "ok"]


@pytest.mark.parametrize("backend", ["claude_code", "codex"])
def test_forged_tool_calls_leave_what_the_reader_remembers_bounded(backend: str) -> None:
    """3,000 forged tool calls with 20 KiB ids and names (Claude Code stops at its own step
    cap, so the harness does not kill it for steps its stream claims): the reader keeps at
    most ``TOOLS_KEPT`` of them, each cut, where it kept all 117 MiB before; a result still
    finds its call's name."""
    agent, _ = reader(backend)
    agent.on_event = lambda kind, data: None
    state = cli.Turn()
    for n in range(3000):
        ident, name = f"{n}-" + "i" * (20 << 10), "n" * (20 << 10)
        line = {
            "claude_code": {
                "type": "assistant",
                "message": {"content": [{"type": "tool_use", "id": ident, "name": name}]},
            },
            "codex": {
                "type": "item.started",
                "item": {"type": "command_execution", "id": ident, "command": name},
            },
        }[backend]
        agent._read(state, json.dumps(line).encode() + b"\n")
    kept = sum(len(k) + len(v) for k, v in state.tools.items())
    assert len(state.tools) <= 4096 and kept < 2 * MiB, (len(state.tools), kept)
    assert state.tool_of("2999-" + "i" * (20 << 10)) is not None
