"""Red team across the issue-13 features and the pace: real webhooks, dispatch, RQ worker,
git, critic and gate, the local GitHub and model.

- A writer's ``/loop-dismiss`` sends an ended (refused) loop back to the merge gate: an
  active loop again, which must hold a slot, or the line admits another loop on top of
  it (and of the fix turns the gate may send it to) past ``max_parallel``.
- A loop that triage refuses gives its slot to the next in line, and its
  ``/loop-accept-spec`` restart waits in line while the slot is taken, never starting
  past the cap; it starts when the slot frees.
"""

from __future__ import annotations

from typing import Any

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.io.pace import Pace
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web, run_control_jobs, run_worker
from tests.e2e.review.test_review_merge import FIX, finding, is_critic
from tests.helpers import REPO, comment, label, open_issue, sample_repo

SEV1 = finding("sev1", "calc.py", 2, "add() overflows on big ints")
ONE_AT_A_TIME = "verify: python3 -m unittest -q\nmax_turns: 3\nmax_parallel: 1\n"


def key(n: int) -> str:
    return LoopId(REPO, n).key


def answer(verdict: str, findings: list[dict[str, Any]], earlier: list[dict[str, Any]]) -> m.Reply:
    return m.structured(
        {"verdict": verdict, "summary": "s", "findings": findings, "earlier_findings": earlier}
    )


def test_a_dismissal_that_sends_an_ended_loop_to_the_gate_takes_a_slot(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    critic_calls: list[int] = []

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            critic_calls.append(1)
            return answer("request_changes", [SEV1], [])
        return m.text("The code is correct as it is; nothing to change.")

    model.play(FIX, m.text("Fixed."))
    model.responder = play
    sample_repo(github, loop_yml=ONE_AT_A_TIME)
    one = open_issue(github)
    label(github, "writer", one)
    drain()
    store, pace = Store(redis), Pace(redis)
    r = store.get(key(one))
    assert r is not None and (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert not pace.holds_slot(key(one))  # ended: its slot went back

    # The writer overrides the critic: the loop is active again, on its way to the gate.
    comment(github, "writer", one, "/loop-dismiss F1 add() only ever sees small ints here")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    r = store.get(key(one))
    assert r is not None and r.status is Status.MERGING, r
    assert pace.holds_slot(key(one)), pace.state().slots

    # A second issue labelled meanwhile waits: max_parallel is 1.
    two = open_issue(github, "value 2", "Add value() returning 2.")
    label(github, "writer", two)
    github.wait_for_webhooks()
    run_control_jobs(redis)
    r2 = store.get(key(two))
    assert r2 is not None and r2.status is Status.QUEUED and r2.waiting is not None, r2
    assert set(pace.state().slots) == {key(one)}

    drain()
    r = store.get(key(one))
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    r2 = store.get(key(two))
    assert r2 is not None and r2.waiting is None and r2.status is not Status.QUEUED, r2
    assert pace.state().slots == {} and pace.state().line == {}  # nothing leaked


TRIAGED = """\
verify: python3 -m unittest -q
max_turns: 2
max_parallel: 1
critic:
  enabled: false
merge:
  enabled: false
"""
VAGUE = m.triage_answer(
    "needs_spec",
    reasons=("The issue asks for nicer code without saying what must hold.",),
    criteria=("add(2, 3) returns 5",),
)


def test_a_triage_refusal_frees_its_slot_and_an_accepted_spec_waits_its_turn(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=TRIAGED)
    store, pace = Store(redis), Pace(redis)
    # Issue 1 is triaged first (not ready); issue 2 waits behind it, then is admitted,
    # triaged ready, and its one coding turn is held back until issue 1 restarts.
    one = open_issue(github, "nicer code", "Make calc nicer.")
    two = open_issue(github, "value 2", "add(2, 3) should be 5. Fix calc.add.")
    label(github, "writer", one)
    github.wait_for_webhooks()
    label(github, "writer", two)
    github.wait_for_webhooks()
    run_control_jobs(redis)
    r2 = store.get(key(two))
    assert r2 is not None and r2.waiting is not None, r2  # behind issue 1

    # Issue 1 is refused and hands its slot to issue 2, whose job then runs in the
    # same burst (triage says ready when nothing else is scripted).
    model.play_triage(VAGUE)
    model.play(FIX, m.text("Fixed."))
    run_worker(redis)
    r1 = store.get(key(one))
    assert r1 is not None and (r1.status, r1.reason) == (Status.REFUSED, "needs_spec"), r1
    r2 = store.get(key(two))
    assert r2 is not None and r2.status is Status.COMPLETED, r2  # admitted once 1 ended
    assert pace.state().slots == {}

    # Now a third issue takes the one slot; the accepted spec's restart must wait for it.
    three = open_issue(github, "value 3", "add(2, 3) should be 5. Fix calc.add.")
    label(github, "writer", three)
    github.wait_for_webhooks()
    run_control_jobs(redis)
    assert pace.holds_slot(key(three))
    comment(github, "writer", one, "/loop-accept-spec")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    r1 = store.get(key(one))
    assert r1 is not None and r1.status is Status.QUEUED and r1.waiting is not None, r1
    assert set(pace.state().slots) == {key(three)}

    model.play(FIX, m.text("Fixed."), FIX, m.text("Fixed."))
    drain()
    for n in (one, three):
        r = store.get(key(n))
        assert r is not None and not r.active, r
    assert pace.state().slots == {} and pace.state().line == {}
