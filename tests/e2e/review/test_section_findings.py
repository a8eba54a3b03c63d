"""A section audit's findings are findings: in the loop's one finding log, dismissible by
a writer, under the critic's rules (a request for changes without a sev1 asks a person,
the repeat limit), its transient API errors retried, and a resumed loop that audits the
verified head before it codes again.

Real RQ workers, real git, the local GitHub and model servers (as test_milestones.py).
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
from jobs.review import critic
from tests.conftest import Web
from tests.e2e.intake.test_milestones import (
    ADD,
    KEY,
    SUB,
    YML,
    agent_requests,
    events,
    is_audit,
    record,
    report,
    sev1,
)
from tests.e2e.intake.test_milestones import start as start_loop
from tests.helpers import REPO, comment

TWO = "Two parts.\n\n- [ ] Fix add\n- [ ] Add sub\n"
ONE_ROUND = YML + "critic:\n  max_rounds: 1\n"
FIVE_ROUNDS = YML.replace("max_turns: 3", "max_turns: 6") + "critic:\n  max_rounds: 5\n"
OVERLOADED = m.Fail(529, "Overloaded", "overloaded_error")
NO_RETRY = {"LOOPBOT_MODEL_RETRIES": "0"}  # a 529 reaches the audit's own retries at once


def audits(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if is_audit(b)]


def replies(github: GitHubServer) -> list[str]:
    return [c["body"] for c in github.repo(REPO).comments.values() if "dismiss" in c["body"]]


def test_a_writer_dismisses_the_section_sev1_that_stopped_the_loop_and_it_goes_on(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The section's sev1 gets an id in the finding log; a reader's dismissal changes
    nothing; a writer's lets the stopped loop go on: its last audit judged this very
    head, so the section passes without another audit, and the next one is coded."""
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report("request_changes", [sev1("add overflows")]),
    )
    start_loop(github, drain, TWO, ONE_ROUND)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    f1 = r.finding_log[0]
    assert (f1["id"], f1["section"], f1["severity"], f1["status"]) == ("F1", 0, "sev1", "open")
    assert "needs-human" in github.repo(REPO).issues[1].labels or r.detail
    model.reset()
    comment(github, "reader", 1, "/loop-dismiss F1 not a problem")
    drain()
    assert (
        record(redis).status == Status.REFUSED and record(redis).finding_log[0]["status"] == "open"
    )
    model.play(m.write_file("calc.py", SUB), m.text("Added sub."), report(), report())
    comment(github, "writer", 1, "/loop-dismiss F1 Python integers do not overflow")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert (
        r.finding_log[0]["status"] == "dismissed" and r.finding_log[0]["dismissed_by"] == "writer"
    )
    # Section 1 was not audited again: the writer overrode its audit on the same head.
    assert [a["section"] for a in events(redis, "section_audited")] == [1, 2]
    done = events(redis, "section_done")
    assert done[0]["dismissed"] == ["F1"] and "dismissed" not in done[1]
    assert [e["reason"] for e in events(redis, "loop_resumed")] == ["dismissed"]
    first = agent_requests(model)[0]
    assert "Work on section 2 of 2" in str(first["messages"][-1])
    assert any("the loop goes on" in body for body in replies(github))


def test_a_section_audit_that_requests_changes_without_a_sev1_asks_a_person(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The critic's rule: changes requested without a blocking finding are not an
    approval. Before, the section passed on to the next one as if approved."""
    nit = sev1("add lacks a docstring") | {"severity": "sev2"}
    model.play(m.write_file("calc.py", ADD), m.text("Fixed add."), report("request_changes", [nit]))
    start_loop(github, drain, TWO)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "requested changes without a blocking finding" in r.detail
    assert not r.sections[0].get("done") and r.pr_number is None
    assert r.finding_log[0]["severity"] == "sev2" and r.finding_log[0]["section"] == 0
    assert len(agent_requests(model)) == 2  # section 2 was never started


def test_the_same_section_sev1_in_three_audits_asks_a_person_before_the_rounds_run_out(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The repeat limit: an agent that does not converge on one sev1 is not given all
    of ``critic.max_rounds`` (5 here) to keep failing at it."""
    still = [{"id": "F1", "status": "open", "why": "not fixed"}]
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report("request_changes", [sev1("add overflows")]),
        m.write_file("calc.py", "# v2\n" + ADD),
        m.text("Tried again."),
        report("request_changes", [sev1("add overflows")], earlier_findings=still),
        m.write_file("calc.py", "# v3\n" + ADD),
        m.text("And again."),
        report("request_changes", [sev1("Add overflows!")], earlier_findings=still),
    )
    start_loop(github, drain, TWO, FIVE_ROUNDS)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "raised in 3 audits" in r.detail and "Add overflows!" in r.detail
    assert [a["round"] for a in events(redis, "section_audited")] == [1, 2, 3]
    assert [f["id"] for f in r.finding_log] == ["F1"]  # one finding, raised three times
    assert r.finding_log[0]["rounds"] == 3


@pytest.mark.parametrize("env_extra", [NO_RETRY])
def test_a_transient_api_error_in_a_section_audit_is_retried_not_coded_past(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An overloaded API during the audit is retried as the critic's review is. Before,
    the loop job failed, and its retry went on coding a turn past the unaudited head."""
    monkeypatch.setattr(critic, "ERROR_BACKOFF", (0.0,))
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        OVERLOADED,
        report(),  # the same audit, asked again
        m.write_file("calc.py", SUB),
        m.text("Added sub."),
        report(),
        report(),
    )
    start_loop(github, drain, TWO)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    errors = events(redis, "section_audit_error")
    assert len(errors) == 1 and errors[0]["retry"] is True and "529" in errors[0]["error"]
    assert len(agent_requests(model)) == 4  # two turns per section, none in between
    assert [a["section"] for a in events(redis, "section_audited")] == [1, 2]
    assert r.error_count == 0


@pytest.mark.parametrize("env_extra", [NO_RETRY])
def test_a_section_audit_that_keeps_failing_ends_the_loop_and_a_restart_audits_first(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attempts used up: the loop ends with the reason (no pull request, nothing coded
    past the head). A restart audits that verified head before any turn: coding on
    would leave section 1's work unaudited behind section 2's."""
    monkeypatch.setattr(critic, "ERROR_BACKOFF", (0.0,))
    model.play(m.write_file("calc.py", ADD), m.text("Fixed add."), *[OVERLOADED] * 3)
    start_loop(github, drain, TWO)
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "critic_error"), r
    assert "audit of section 1 failed 3 time(s)" in r.detail and "/loop-restart" in r.detail
    assert r.pr_number is None and not r.sections[0].get("audited_sha")
    model.reset()
    model.play(report(), m.write_file("calc.py", SUB), m.text("Added sub."), report(), report())
    comment(github, "writer", 1, "/loop-restart")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert is_audit(model.requests[0])  # the audit, before any turn
    assert "Section 1 of 2 passed its audit" in str(agent_requests(model)[0]["messages"][-1])
    assert len(agent_requests(model)) == 2
    assert events(redis, "section_audit_resumed")[0]["section"] == 1


def test_section_findings_an_earlier_release_kept_apart_are_read_into_the_log(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A loop stopped on a section's sev1 by the release before, whose record keeps the
    audit's findings in ``section_findings`` (ids like ``S1.1.1``) and knows no
    ``audited_sha``: after the upgrade, its restart audits the head first and asks the
    auditor about that finding, now ``F1`` in the one log."""
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report("request_changes", [sev1("add overflows")]),
    )
    start_loop(github, drain, TWO, ONE_ROUND)
    store = Store(redis)

    def as_before(r: Any) -> None:  # what the release before wrote
        entry = r.finding_log[0]
        r.section_findings = [
            {k: entry[k] for k in ("severity", "category", "path", "line", "title", "body")}
            | {"id": "S1.1.1", "section": 0, "round": 1, "sha": entry["first_sha"]}
        ]
        r.finding_log, r.next_finding, r.sev1_rounds = [], 1, {}
        r.sections[0].pop("audited_sha")

    store.update(KEY, as_before)
    model.reset()
    model.play(
        report(earlier_findings=[{"id": "F1", "status": "resolved", "why": "ints are big"}]),
        m.write_file("calc.py", SUB),
        m.text("Added sub."),
        report(),
        report(),
    )
    comment(github, "writer", 1, "/loop-restart")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.section_findings == []
    assert [(e["id"], e["section"], e["status"]) for e in r.finding_log] == [("F1", 0, "resolved")]
    assert is_audit(model.requests[0]) and '"F1"' in json.dumps(model.requests[0]["output_config"])
