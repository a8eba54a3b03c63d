"""Red team on milestones: a stubborn agent with a flip-flopping auditor, a critic model
the Models API does not know, a post-action that slips a binary past its size check, and
a restart after a section ran out of audit rounds.

Real RQ workers, real git, the local GitHub and model servers (as
tests/e2e/intake/test_milestones.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.intake.test_milestones import (
    ADD,
    KEY,
    POST,
    SUB,
    YML,
    events,
    is_audit,
    record,
    report,
    sev1,
)
from tests.e2e.intake.test_milestones import start as start_loop
from tests.helpers import REPO, comment

TWO = "Two parts.\n\n- [ ] Fix add\n- [ ] Add sub\n"
ROUNDS2 = YML + "critic:\n  max_rounds: 2\n"


def audits(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if is_audit(b)]


def test_a_section_audit_is_not_asked_again_on_the_same_head(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A sev1 in a section audit, then an agent that changes nothing ("the finding is
    wrong"): asking the auditor again about the very same commit is how a flip-flopping
    auditor overrides its own sev1. The findings stand until the head changes, as the
    critic's verdict on a pull request head does."""
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report("request_changes", [sev1("add overflows")]),  # section 1: dirty
        m.text("The finding is wrong; nothing to change."),  # a stubborn agent
        # Asked again on the same head, the auditor flips and lets section 1 through.
        report(earlier_findings=[{"id": "F1", "status": "resolved", "why": "fine"}]),
        m.write_file("calc.py", SUB),
        m.text("Added sub."),
        report(),
        report(),
    )
    start_loop(github, drain, TWO, ROUNDS2)
    r = record(redis)
    assert len(audits(model)) == 1, [a["messages"][0] for a in audits(model)]
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert not r.sections[0]["done"]
    assert r.pr_number is None  # nothing reached a pull request past the standing sev1
    stood = events(redis, "section_audited")
    assert [(a["round"], a["sev1"]) for a in stood] == [(1, 1), (2, 1)]
    assert stood[1].get("stands") is True


@pytest.mark.parametrize("env_extra", [{"LOOPBOT_CRITIC_MODEL": "claude-nonesuch-9"}])
def test_an_unknown_critic_model_ends_a_sectioned_loop_with_a_clear_reason(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The section audit runs the critic's model inside the loop job: a model the Models
    API does not know is a setting to fix, said once, not a crash that the
    worker retries and the reconciler resumes, each time paying for another turn."""
    model.play(m.write_file("calc.py", ADD), m.text("Fixed add."))
    start_loop(github, drain, TWO)
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "bad_config"), r
    assert "claude-nonesuch-9" in r.detail
    assert audits(model) == []
    assert len([b for b in model.requests if "output_config" not in b]) == 2  # one turn


def test_a_post_action_cannot_slip_a_binary_past_its_size_limit(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A post-action is never reviewed: its small-change limit counted a binary file as
    one line, so any amount of unreviewable bytes (a compiled tool, a blob) went in."""
    blob = "python3 -c \"import os; open('tool.bin','wb').write(bytes(range(256)) * 4000)\""
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report(),
        m.bash(blob),
        m.text("Added the release tool."),
    )
    start_loop(github, drain, "add(2, 3) should be 5.", POST)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.post_action["status"] == "dropped", r.post_action
    assert "binary" in r.post_action["why"]
    assert github.file_at(REPO, "main", "tool.bin") is None
    assert r.head_sha == r.reviewed_sha


def test_a_restart_after_a_section_ran_out_of_rounds_gives_it_rounds_again(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A section that used all of ``critic.max_rounds`` asks a person; the person's
    ``/loop-restart`` must give it audit rounds again (as a restart gives the critic its
    rounds back), not end the loop at the first sev1 after it."""
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report("request_changes", [sev1("add overflows")]),
        m.write_file("calc.py", "# v2\n" + ADD),
        m.text("Tried again."),
        report(
            "request_changes",
            [sev1("still overflows")],
            earlier_findings=[{"id": "F1", "status": "resolved", "why": "ok"}],
        ),
    )
    start_loop(github, drain, TWO, ROUNDS2)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    model.reset()
    model.play(
        m.write_file("calc.py", "# v3\n" + ADD),
        m.text("Another way."),
        report(  # the first audit after the restart
            "request_changes",
            [sev1("overflows a third way")],
            earlier_findings=[{"id": "F2", "status": "resolved", "why": "ok"}],
        ),
        m.write_file("calc.py", "# v4\n" + ADD),
        m.text("Fixed for good."),
        report(earlier_findings=[{"id": "F3", "status": "resolved", "why": "ok"}]),
        m.write_file("calc.py", SUB),
        m.text("Added sub."),
        report(),
        report(),
    )
    comment(github, "writer", 1, "/loop-restart")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert [a["round"] for a in events(redis, "section_audited")] == [1, 2, 3, 4, 1]


def test_a_request_on_the_pull_request_during_the_post_action_is_not_merged_away(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The critic approved and the post-action turn runs (the loop holds its lease), when
    a maintainer comments ``/loop also add sub`` on the pull request: the request waits
    for the running loop (``queued for the running loop``). The post-action never reads
    it, so the loop went straight to the gate and merged without it."""
    later: list[m.Item] = [
        m.write_file("CHANGELOG.md", "- add() adds\n"),
        m.text("Noted the fix in CHANGELOG.md."),
        m.write_file("calc.py", SUB),
        m.text("Added sub as asked."),
        report(),  # the review of the head with the maintainer's request in it
    ]

    def respond(body: dict[str, Any]) -> m.Item:
        if len(later) == 5:  # the post-action's first call: the request lands meanwhile
            # What jobs/dispatch.py's _feedback does while the loop holds its lease.
            Store(redis).push_feedback(KEY, {"from": "writer", "body": "/loop also add sub"})
        return later.pop(0)

    model.play(m.write_file("calc.py", ADD), m.text("Fixed add."), report())
    model.responder = respond
    start_loop(github, drain, "add(2, 3) should be 5.", POST)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert "def sub" in github.file_at(REPO, "main", "calc.py")  # type: ignore[operator]
    assert any("also add sub" in json.dumps(b["messages"][-1]) for b in model.requests)
    assert r.head_sha == r.reviewed_sha  # the gate merged what the critic reviewed last
    assert later == []


def test_a_post_action_over_its_line_limit_is_dropped(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A post-action is never reviewed, so it must stay small: 301 changed lines are one
    too many, and the gate merges the reviewed head without them."""
    big = "".join(f"NOTE_{i} = {i}\n" for i in range(301))
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report(),
        m.write_file("notes.py", big),
        m.text("Added notes."),
    )
    start_loop(github, drain, "add(2, 3) should be 5.", POST)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.post_action["status"] == "dropped", r.post_action
    assert "300" in r.post_action["why"], r.post_action
    assert github.file_at(REPO, "main", "notes.py") is None
    assert r.head_sha == r.reviewed_sha
