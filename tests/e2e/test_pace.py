"""A pace per repository, end to end: five labelled issues under ``max_parallel: 2``
never have more than two loops admitted at once, a priority-labelled issue goes before
older ones, the waiting loops show their place, and all five are merged in the end.

Real webhooks, dispatch, RQ worker, git, sandbox, critic and merge gate; the scripted
model adds one file (and its test) per issue, so the five pull requests never conflict,
though each merge leaves the others behind the base (the gate merges it in and verify
runs again before it merges them).
"""

from __future__ import annotations

import json
import re
from typing import Any

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.io.pace import Pace
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web, run_control_jobs
from tests.helpers import CALC, REPO, label, open_issue, sample_repo

YML = """\
verify: python3 -m unittest -q
max_turns: 3
max_parallel: 2
merge:
  max_fix_turns: 10
"""
# add() is right on the base, so verify passes there: each issue asks for a new function
# with its test, in a file of its own.
FIXED_CALC = CALC.replace("a - b", "a + b")
ISSUE = re.compile(r"Resolve issue #(\d+)")
NL = "\\n"


def files_for(n: int) -> str:
    """The agent's one command for issue ``n``: its function and a test of it."""
    code = f"def value():\n    return {n}\n"
    test = (
        "import unittest\n\n"
        f"from feature_{n} import value\n\n\n"
        f"class Feature{n}Test(unittest.TestCase):\n"
        "    def test_value(self):\n"
        f"        self.assertEqual(value(), {n})\n"
    )
    # printf turns each backslash-n into a newline; neither text has a quote or a "%".
    return (
        f"printf '{code.replace(chr(10), NL)}' > feature_{n}.py && "
        f"printf '{test.replace(chr(10), NL)}' > test_feature_{n}.py"
    )


def status_body(github: GitHubServer, n: int) -> str:
    (body,) = [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if c["_issue"] == n and "<!-- loopbot:status -->" in c["body"]
    ]
    return str(body)


def test_five_issues_two_at_a_time_priority_first_all_merged(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML, extra={"calc.py": FIXED_CALC})
    store, pace = Store(redis), Pace(redis)
    numbers = [
        open_issue(github, f"value {i}", f"Add feature_{i}.value() returning {i}.")
        for i in range(1, 6)
    ]
    keys = {n: LoopId(REPO, n).key for n in numbers}
    peak: list[int] = []
    first_call: dict[int, dict[int, tuple[str, int | None]]] = {}

    def respond(body: dict[str, Any]) -> m.Item:
        # Sampled at every model call, from any loop: the slots never pass the cap.
        peak.append(len(pace.state().slots))
        if (body.get("output_config") or {}).get("format"):
            return m.structured({"verdict": "approve", "summary": "Fine.", "findings": []})
        n = int(ISSUE.search(json.dumps(body["messages"][0])).group(1))  # type: ignore[union-attr]
        if n not in first_call:
            # Where the others stood when this loop was first called.
            first_call[n] = {
                k: (r.status.value, r.waiting.place if r.waiting else None)
                for k, r in ((k, store.get(keys[k])) for k in numbers)
                if r is not None
            }
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return m.text(f"Added feature_{n}.value() and its test.")
        return m.bash(files_for(n))

    model.responder = respond
    for n in numbers[:4]:
        label(github, "writer", n)
    # The newest issue carries the priority label before it is made ready.
    label(github, "writer", numbers[4], "loop:priority-high")
    label(github, "writer", numbers[4])
    github.wait_for_webhooks()
    run_control_jobs(redis)  # every start decided; no loop has run yet

    one, two, three, four, five = numbers
    assert set(pace.state().slots) == {keys[one], keys[two]}
    assert [w.key for w in sorted(pace.state().line.values(), key=lambda w: w.since)] == [
        keys[three],
        keys[four],
        keys[five],
    ]
    # Each waiting loop is queued, says where it stands, and has no job yet.
    places = {n: store.get(keys[n]).waiting.place for n in (three, four, five)}  # type: ignore[union-attr]
    assert places == {five: 1, three: 2, four: 3}
    assert "1st in line" in status_body(github, five)
    assert "Priority label" in status_body(github, five)
    body = status_body(github, three)
    assert "⏳ **queued**" in body and "phase `waiting (place 2)`" in body
    assert "2nd in line; 2 loops of this repository are running (`max_parallel` 2)" in body
    assert "3rd in line" in status_body(github, four)
    assert redis.llen("rq:queue:loopbot-loops") == 2

    drain(rounds=30)

    for n in numbers:
        r = store.get(keys[n])
        assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), r
        assert github.file_at(REPO, "main", f"feature_{n}.py") == f"def value():\n    return {n}\n"
        assert github.repo(REPO).issues[n].state == "closed"
    assert pace.state().slots == {} and pace.state().line == {}
    # Never more than two admitted, from the events: +1 admitted, -1 ended.
    admitted_order, running, most = [], 0, 0
    for e in store.events(None, count=100_000):
        if e["kind"] == "admitted":
            admitted_order.append(LoopId.parse(e["loop"]).issue)
            running += 1
        elif e["kind"] == "loop_finished":
            running -= 1
        most = max(most, running)
    assert most == 2 and max(peak) == 2
    # The priority issue, labelled last, started before the two older ones.
    assert admitted_order == [one, two, five, three, four]
    # When #5 was let in (one of the first two had merged), #3 and #4 had moved up.
    assert first_call[five][three] == ("queued", 1) and first_call[five][four] == ("queued", 2)
    assert "completed" in (first_call[five][one][0], first_call[five][two][0])
    # The waiting loops' comments now show how they ended, not a place in line.
    assert all("in line" not in status_body(github, n) for n in numbers)
