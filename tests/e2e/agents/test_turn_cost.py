"""A turn's orchestration work does not grow with the loop's history: the Redis commands,
the bytes Redis sends back and the redactions of five turns near turn 30 are those of
five from turn 3, within the margin that timing gives them. Counted, not timed: a slow
machine cannot make it fail, and a per-turn cost that grows (re-reading and re-redacting
every event on each status update) cannot pass."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from redis import Redis

from bot.core import repo_config
from bot.core.text import redact
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.dispatch import start_loop
from jobs.runtime import Runtime
from tests.conftest import run_worker

REPO = "acme/cost"
TURNS = 30


@pytest.mark.parametrize("env_extra", [{"LOOPBOT_MAX_TURNS": str(TURNS)}])
def test_turn_30_costs_what_turn_3_costs(
    github: GitHubServer,
    model: AnthropicServer,
    redis: Redis,
    rt: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    yml = (
        f"verify: exit 1\nmax_turns: {TURNS}\ncritic:\n  enabled: false\nmerge:\n  enabled: false\n"
    )
    iid = github.add_installation("acme")
    github.add_repo(
        REPO,
        {".github/loop.yml": yml, "app.py": "x = 0\n"},
        installation_id=iid,
        collaborators={"writer": "write"},
    )
    with github.as_user("writer") as u:
        n = u.post(f"/repos/{REPO}/issues", json={"title": "t", "body": "b"}).json()["number"]
        u.post(f"/repos/{REPO}/issues/{n}/labels", json={"labels": ["loop:ready"]})

    redactions = {"built": 0, "strings": 0}
    real_init, real_call = redact.Redactor.__init__, redact.Redactor.__call__

    def counting_init(self: redact.Redactor, *a: Any, **kw: Any) -> None:
        redactions["built"] += 1
        real_init(self, *a, **kw)

    def counting_call(self: redact.Redactor, text: str) -> str:
        redactions["strings"] += 1
        return real_call(self, text)

    monkeypatch.setattr(redact.Redactor, "__init__", counting_init)
    monkeypatch.setattr(redact.Redactor, "__call__", counting_call)

    snapshots: list[dict[str, int]] = []

    def snapshot() -> None:
        """What Redis and the redactor have done so far, taken as each turn starts."""
        stats = redis.info("commandstats")
        calls = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
        sent = int(redis.info("stats")["total_net_output_bytes"])
        snapshots.append({"commands": calls, "bytes": sent, **redactions})

    turn = {"n": 0}

    def respond(body: dict[str, Any]) -> m.Item:
        last = body["messages"][-1]["content"]
        if any(block.get("type") == "tool_result" for block in last):
            return m.text("edited")
        snapshot()
        turn["n"] += 1
        # The same size every turn: a turn's own data must not differ with its number.
        return m.write_file("app.py", f"x = {turn['n']:04d}\n")

    model.responder = respond
    start_loop(rt, REPO, n, iid, "writer", repo_config.parse(yml))
    run_worker(redis)
    assert len(snapshots) == TURNS, f"the loop ran {len(snapshots)} turns"

    def per_turn(first: int, last: int) -> dict[str, int]:
        """The median turn of ``first``..``last``: each turn's work from its start to the
        next one's, the middle one by each measure."""
        return {
            name: statistics.median_low(
                snapshots[t][name] - snapshots[t - 1][name] for t in range(first, last + 1)
            )
            for name in snapshots[0]
        }

    # Seven turns early against seven late, each side's median turn, with a margin: the
    # check runs, the status comment and the push's report are written by threads of their
    # own, so a turn's writes can land in the next turn's count, and how many status edits
    # coalesce (the latest state wins) depends on timing. Sums over five turns swung by
    # 12% under CI's load (1,150 commands early against 1,289 late, where a quiet run
    # counts 1,220 on both sides); a median turn does not move with one slow turn, and
    # what this test is for grows every turn: re-reading and re-redacting every event on
    # each update took a turn from 45 to 101 KB and from 586 redactions to 4,018.
    early, late = per_turn(3, 9), per_turn(TURNS - 7, TURNS - 1)
    assert late["built"] == early["built"] == 0, (early, late)  # one redactor per token
    assert late["strings"] <= early["strings"] * 1.1 + 1, (early, late)
    assert late["commands"] <= early["commands"] * 1.1, (early, late)
    assert late["bytes"] <= early["bytes"] * 1.1 + 256, (early, late)


def test_a_timeline_held_in_the_process_is_dropped_when_redis_lost_it(
    redis: Redis, rt: Runtime
) -> None:
    """The process keeps the timeline it built; when Redis no longer has it (flushed, a
    failover, a loop whose history began again), the copy is not reused: the comment
    shows the loop's own events, not a past one's."""
    from jobs import status_comment

    key = "acme/cost#9"
    rt.store.event(key, "turn_started", turn=1)
    rt.store.event(key, "verify", turn=1, passed=True)
    first = status_comment._timeline(rt.store, key, str).render(12)
    assert first == ["turn 1 — verify passed"]
    redis.delete(f"loopbot:timeline:{key}", f"loopbot:events:{key}")  # Redis lost both
    rt.store.event(key, "turn_started", turn=1)
    assert status_comment._timeline(rt.store, key, str).render(12) == ["turn 1 — coding…"]
