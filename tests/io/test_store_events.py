"""The event streams' bounds (``bot/io/store.py``, ``bot/core/rules/event_size.py``), on a
real redis-server: what the agent's events may cost Redis, however large or many. A red
team filled a deployment's Redis through them (issue 37, item 1): 400 MiB in 2.5 s."""

from __future__ import annotations

import os

from redis import Redis

from bot.core.rules import event_size as es
from bot.io.store import Store

KEY = "o/r#1"
MiB = 1 << 20


def stream_bytes(redis: Redis, name: str) -> int:
    return int(redis.memory_usage(name, samples=0) or 0)


def test_an_8_mib_event_is_stored_cut_in_both_streams(redis: Redis) -> None:
    store = Store(redis)
    store.event(KEY, "agent_text", backend="claude-code", text="A" * (8 * MiB))
    store.event(KEY, "agent_tool", step=1, tool="Bash", title="B" * MiB, input={"cmd": "C" * MiB})
    (said, tool) = store.events(KEY)
    assert said["data"]["text"].startswith("A" * es.FIELD_CHARS + "… [")
    assert said["data"]["text"].endswith(f"[{8 * MiB - es.FIELD_CHARS} more characters cut]")
    assert len(tool["data"]["input"]["cmd"]) < es.FIELD_CHARS + 50
    assert stream_bytes(redis, f"loopbot:events:{KEY}") < 64 << 10
    glob = store.events()
    assert [e["kind"] for e in glob] == ["agent_text", "agent_tool"]
    assert len(glob[0]["data"]["text"]) < es.GLOBAL_FIELD_CHARS + 50
    assert stream_bytes(redis, "loopbot:events") < 8 << 10


def test_the_agents_events_of_a_loop_stop_at_its_budget_and_one_event_says_so(
    redis: Redis,
) -> None:
    """1,000 tool calls with 16 KiB title, input and step (48 MiB offered, and kept whole
    before the fix): the loop's stream holds about its budget, the global one far less;
    the harness's events are kept past the cap."""
    store = Store(redis)
    big = "x" * (16 << 10)
    store.event(KEY, "turn_started", turn=1)
    for step in range(1000):
        store.event(KEY, "agent_tool", step=step, tool="exec", title=big, input={"cmd": big})
        store.event(KEY, "step", step=step, tool=big)
    store.event(KEY, "verify", turn=1, passed=True)
    store.event("o/r#2", "agent_text", text="another loop's budget is its own")
    # Redis's memory for it: the budget's data, with the allocator's rounding (5.2 MiB
    # measured for the 4 MiB budget).
    loop = stream_bytes(redis, f"loopbot:events:{KEY}")
    assert loop < es.LOOP_BUDGET_BYTES * 1.5, loop
    assert stream_bytes(redis, "loopbot:events") < MiB
    kinds = [e["kind"] for e in store.events(KEY, count=100_000)]
    assert kinds.count("events_capped") == 1
    assert kinds[0] == "turn_started" and kinds[-1] == "verify"
    assert 100 < kinds.count("agent_tool") < 1000
    assert [e["kind"] for e in store.events("o/r#2")] == ["agent_text"]
    # A new worker's store (a handover) finds the budget spent, and writes no second notice.
    Store(redis).event(KEY, "agent_text", text="after the cap")
    assert [e["kind"] for e in store.events(KEY, count=100_000)].count("events_capped") == 1
    assert store.events(KEY, count=100_000)[-1]["kind"] == "verify"


def test_a_loops_stream_and_budget_expire_long_after_its_last_event(redis: Redis) -> None:
    store = Store(redis)
    store.event(KEY, "agent_text", text="hi")
    for name in (f"loopbot:events:{KEY}", f"loopbot:event-budget:{KEY}"):
        ttl = redis.ttl(name)
        assert es.EVENTS_TTL_SECONDS - 60 < ttl <= es.EVENTS_TTL_SECONDS, (name, ttl)
    assert redis.ttl("loopbot:events") == -1  # the global stream is capped by length alone


def test_a_saved_session_and_conversation_expire_as_the_loops_events_do(redis: Redis) -> None:
    """The agent writes its session files (64 MiB, incompressible if it likes) and its
    words go into the conversation: kept with no expiry, every finished loop's stayed in
    Redis for ever, 64 MiB a loop (red team, issue 37 item 1)."""
    store = Store(redis)
    store.save_agent_session(KEY, "s1", os.urandom(MiB), "codex")
    store.save_conversation(KEY, [{"role": "assistant", "content": "x" * MiB}])
    for name in (f"loopbot:agent-session:{KEY}", f"loopbot:conv:{KEY}"):
        assert 0 < redis.ttl(name) <= es.EVENTS_TTL_SECONDS, name
    # What is saved still reads back whole.
    saved = store.agent_session(KEY, "codex")
    assert saved is not None and saved[0] == "s1" and len(saved[1]) == MiB
    assert store.conversation(KEY)[0]["content"] == "x" * MiB
