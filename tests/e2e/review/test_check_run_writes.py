"""A turn does not wait for its check run: the ``in_progress`` update on the head a turn
pushed is written beside the next turn (jobs/check_runs.py). Real RQ worker, git and
sandbox; the local GitHub answers every check-run create slowly, as GitHub does when the
installation's line for writes is long."""

from __future__ import annotations

from typing import Any

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.loop.test_loop import config
from tests.helpers import REPO, label, open_issue, sample_repo

SLOW = 2.5  # seconds GitHub takes to create a check run


def test_a_turn_goes_on_while_its_check_run_is_written(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.write_file("NOTES.md", "Looked at calc.py.\n"),
        m.text("Notes written."),  # turn 1: a change, verify still fails
        m.replace("calc.py", "return a - b", "return a + b"),
        m.text("Fixed add."),  # turn 2: verify passes, the pull request opens
    )
    sample_repo(github, loop_yml=config())
    n = open_issue(github)
    github.inject("POST", r"/check-runs$", 0, delay=SLOW, times=10)
    label(github, "writer", n)
    drain()
    key = LoopId(REPO, n).key
    record = Store(redis).get(key)
    assert record is not None and record.status == Status.COMPLETED, record
    events = Store(redis).events(key)
    pushed = next(e["at"] for e in events if e["kind"] == "pushed" and e["data"]["turn"] == 1)
    second = next(e["at"] for e in events if e["kind"] == "turn_started" and e["data"]["turn"] == 2)
    # Turn 1's head was pushed; its check run took SLOW seconds to create, beside turn 2.
    assert second - pushed < SLOW - 0.5, second - pushed
    runs = [r for r in github.repo(REPO).check_runs.values() if r["name"] == "loopbot"]
    by_head: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_head.setdefault(run["head_sha"], []).append(run)
    assert all(len(v) == 1 for v in by_head.values()), by_head  # never two on one head
    (final,) = by_head[record.head_sha]
    assert (final["status"], final["conclusion"]) == ("completed", "success")
