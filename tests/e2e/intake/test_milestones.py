"""Milestones end to end: real RQ workers, real git, the local GitHub and model servers.

A sectioned issue is coded section by section, each section audited (the critic's model
on the section's diff) before the next; a final audit (the critic job) reviews the whole
pull request; a post-action turn runs after it; ``/loop-plan`` proposes sections.
"""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, comment, content_text, label, open_issue, sample_repo

YML = "verify: python3 -m unittest -q\nmax_turns: 3\ntriage:\n  enabled: false\n"
KEY = f"{REPO}#1"
BODY = "Make calc complete.\n\n- [ ] Fix add\n- [ ] Add sub\n- [ ] Add mul\n"
ADD = "def add(a, b):\n    return a + b\n"
SUB = ADD + "\n\ndef sub(a, b):\n    return a - b\n"
MUL = SUB + "\n\ndef mul(a, b):\n    return a * b\n"


def report(verdict: str = "approve", findings: list[Any] | None = None, **kw: Any) -> m.Reply:
    answer: dict[str, Any] = {"verdict": verdict, "summary": "ok", "findings": findings or []}
    return m.structured(answer | kw)


def sev1(title: str) -> dict[str, Any]:
    return {
        "severity": "sev1",
        "category": "correctness",
        "path": "calc.py",
        "line": 1,
        "title": title,
        "body": f"{title} body",
    }


def start(github: GitHubServer, drain: Any, body: str = BODY, yml: str = YML) -> None:
    sample_repo(github, loop_yml=yml)
    n = open_issue(github, "calc is incomplete", body)
    label(github, "writer", n)
    drain()


def record(redis: Redis) -> Any:
    return Store(redis).get(KEY)


def events(redis: Redis, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in Store(redis).events(KEY) if e["kind"] == kind]


def is_audit(body: dict[str, Any]) -> bool:
    return "output_config" in body and "This is a section audit" in content_text(
        body["messages"][0]
    )


def agent_requests(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if "output_config" not in b]


def last_prompt(body: dict[str, Any]) -> str:
    return json.dumps([b for b in body["messages"] if b["role"] == "user"][-1])


def test_three_sections_audited_in_order_one_sent_back_then_final_audit_and_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report("request_changes", [sev1("add has no docstring")]),  # section 1: dirty
        m.write_file("calc.py", '"""calc."""\n' + ADD),
        m.text("Documented."),
        report(earlier_findings=[{"id": "F1", "status": "resolved", "why": "done"}]),
        m.write_file("calc.py", '"""calc."""\n' + SUB),
        m.text("Added sub."),
        report(),  # section 2: clean
        m.write_file("calc.py", '"""calc."""\n' + MUL),
        m.text("Added mul."),
        report(),  # section 3: clean
        report(),  # the final audit (the critic job, on the pull request)
    )
    start(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert [s["done"] for s in r.sections] == [True, True, True]
    assert [s["audit_rounds"] for s in r.sections] == [2, 1, 1]
    audits = events(redis, "section_audited")
    assert [(a["section"], a["round"], a["sev1"]) for a in audits] == [
        (1, 1, 1),
        (1, 2, 0),
        (2, 1, 0),
        (3, 1, 0),
    ]
    assert [d["title"] for d in events(redis, "section_done")] == ["Fix add", "Add sub", "Add mul"]
    # The section's finding is in the loop's one finding log, answered resolved.
    f1 = r.finding_log[0]
    assert (f1["id"], f1["section"], f1["severity"], f1["status"]) == ("F1", 0, "sev1", "resolved")
    assert r.section_findings == []
    # The audits were the critic's structured calls on each section's own diff.
    audit_reqs = [b for b in model.requests if is_audit(b)]
    assert len(audit_reqs) == 4
    second = content_text(audit_reqs[2]["messages"][0])
    assert "Section 2: Add sub" in second and "+def sub" in second and "+def add" not in second
    assert '"F1"' in json.dumps(audit_reqs[1]["output_config"])  # answer for the sev1
    # The dirty audit sent the agent back to section 1 with the finding; then section 2.
    prompts = [last_prompt(b) for b in model.requests if "output_config" not in b]
    assert "Work on section 1 of 3" in prompts[0]
    sent_back = next(p for p in prompts if "add has no docstring" in p)
    assert "section 1 of 3" in sent_back
    assert any("Work on section 2 of 3" in p for p in prompts)
    assert any("Work on section 3 of 3" in p for p in prompts)
    # The final audit: the critic job on the whole pull request, said so.
    started = events(redis, "review_started")
    assert len(started) == 1 and started[0]["final_audit"] is True
    review = github.repo(REPO).reviews[r.pr_number][0]["body"]
    assert review.startswith("**Final audit**")
    assert "mul" in github.file_at(REPO, "main", "calc.py")  # type: ignore[operator]
    # The status comment ticks the sections.
    status = next(
        c["body"] for c in github.repo(REPO).comments.values() if "### loopbot" in c["body"]
    )
    assert "add — audited (2 rounds)" in status  # "Fix" is defused: it closes issues
    assert "- [x] 2. Add sub — audited (1 round)" in status
    assert "- [x] 3. Add mul — audited (1 round)" in status
    assert "- [x] section 2 done: Add sub" in status
    assert "- [x] final audit round 1 — no findings" in status


def test_restart_resumes_at_the_persisted_section(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def cancel_midway(body: dict[str, Any]) -> m.Item:
        # A cancel lands while section 2's turn runs (as /loop-cancel flags it).
        Store(redis).request_cancel(KEY, "cancelled")
        return m.bash("true")

    body = "Two parts.\n\n- [ ] Fix add\n- [ ] Add sub\n"
    model.play(m.write_file("calc.py", ADD), m.text("Fixed add."), report())
    model.responder = cancel_midway  # section 2's first call: a writer cancels
    start(github, drain, body)
    r = record(redis)
    assert r.status == Status.CANCELLED, r
    assert r.section_index == 1 and r.sections[0]["done"] and not r.sections[1]["done"]
    model.responder = None
    model.reset()
    model.play(m.write_file("calc.py", SUB), m.text("Added sub."), report(), report())
    comment(github, "writer", 1, "/loop-restart")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    first = next(b for b in model.requests if "output_config" not in b)
    assert "Work on section 2 of 2" in last_prompt(first)  # resumed there, not at 1
    assert "Work on section 1 of 2" not in last_prompt(first)
    audits = events(redis, "section_audited")
    assert [a["section"] for a in audits] == [1, 2]  # section 1 is not audited again


def test_final_audit_sev1_is_a_final_audit_fix_without_rewinding(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    body = "Two parts.\n\n- [ ] Fix add\n- [ ] Add sub\n"
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report(),
        m.write_file("calc.py", SUB),
        m.text("Added sub."),
        report(),
        report("request_changes", [sev1("sub is untested")]),  # the final audit: dirty
        m.write_file("test_sub.py", "import unittest\n"),
        m.text("Added a test file."),
        report(earlier_findings=[{"id": "F1", "status": "resolved", "why": "ok"}]),
    )
    start(github, drain, body)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    fix = [b for b in model.requests if "output_config" not in b][-2]
    assert "Final-audit fix" in last_prompt(fix) and "sub is untested" in last_prompt(fix)
    assert "Work on section" not in last_prompt(fix)
    assert r.section_index == 1 and all(s["done"] for s in r.sections)
    assert len(events(redis, "section_audited")) == 2  # no section audited again
    assert [e.get("final_audit") for e in events(redis, "review_started")] == [True, True]


POST = YML + "post_action:\n  prompt: Add a line about this change to CHANGELOG.md.\n"


def test_post_action_runs_after_the_clean_final_audit_and_the_gate_merges_it(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report(),  # the critic (no sections: one piece)
        m.write_file("CHANGELOG.md", "- add() adds\n"),
        m.text("Noted the fix in CHANGELOG.md."),
    )
    start(github, drain, "add(2, 3) should be 5.", POST)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    pa = r.post_action
    assert pa["status"] == "kept" and pa["base"] == r.reviewed_sha and pa["sha"] != r.reviewed_sha
    assert "CHANGELOG" in pa["summary"]
    assert github.file_at(REPO, "main", "CHANGELOG.md") == "- add() adds\n"
    post_prompt = last_prompt([b for b in model.requests if "output_config" not in b][-2])
    assert "Add a line about this change to CHANGELOG.md" in post_prompt
    log = gitrepo.git(github.repo(REPO).path, "log", "--format=%s", pa["sha"]).splitlines()
    assert log[0].startswith("loop(post-action): ")
    assert len([b for b in model.requests if "output_config" in b]) == 1  # not re-audited
    pull = github.repo(REPO).issues[r.pr_number].body
    assert "Post-action (committed as" in pull and "Noted the fix" in pull
    gate = events(redis, "gate")[-1]
    assert gate["head"] == pa["sha"] and gate["reviewed"] == r.reviewed_sha


def test_post_action_touching_github_or_breaking_verify_is_dropped(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report(),
        m.write_file(".github/workflows/x.yml", "on: push\n"),
        m.text("Added a workflow."),
    )
    start(github, drain, "add(2, 3) should be 5.", POST)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.post_action["status"] == "dropped" and "protected" in r.post_action["why"]
    assert github.file_at(REPO, "main", ".github/workflows/x.yml") is None
    assert r.head_sha == r.reviewed_sha  # the gate merged exactly what was reviewed


def test_post_action_that_breaks_verify_is_dropped(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        report(),
        m.write_file("calc.py", "def add(a, b):\n    return 0\n"),
        m.text("Tidied calc."),
    )
    start(github, drain, "add(2, 3) should be 5.", POST)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.post_action["status"] == "dropped" and "failed" in r.post_action["why"]
    assert "return a + b" in github.file_at(REPO, "main", "calc.py")  # type: ignore[operator]


def test_loop_plan_proposes_sections_and_a_reader_gets_nothing(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    n = open_issue(github, "calc is incomplete", "Add sub and mul to calc.")
    comment(github, "reader", n, "/loop-plan")
    drain()
    assert model.requests == []
    model.play(
        m.structured(
            {
                "sections": [
                    {"title": "Add sub", "text": "sub(a, b) with a test."},
                    {"title": "Add mul", "text": "mul(a, b) with a test."},
                ]
            }
        )
    )
    comment(github, "writer", n, "/loop-plan")
    drain()
    reply = [c["body"] for c in github.repo(REPO).comments.values() if "proposed" in c["body"]]
    assert len(reply) == 1
    assert "## Milestone 1: Add sub" in reply[0] and "## Milestone 2: Add mul" in reply[0]
    assert "**To accept:**" in reply[0] and "Planning cost $" in reply[0]
    req = model.requests[0]
    assert req["output_config"]["format"]["type"] == "json_schema"
    assert "<untrusted-issue>" in content_text(req["messages"][0])
    # Asked again about the same text: the same proposal, no second call (there is no
    # loop, so no issue budget to charge for it).
    comment(github, "writer", n, "/loop-plan")
    drain()
    assert len(model.requests) == 1
    again = [c["body"] for c in github.repo(REPO).comments.values() if "proposed" in c["body"]]
    assert len(again) == 2 and "no new model call" in again[1]
    assert "## Milestone 2: Add mul" in again[1]
    # An issue with sections already: said so, no model call.
    m2 = open_issue(github, "two", "- [ ] one\n- [ ] two\n")
    comment(github, "writer", m2, "/loop-plan")
    drain()
    assert len(model.requests) == 1
    assert any("already has 2 milestones" in c["body"] for c in github.repo(REPO).comments.values())


def test_with_the_critic_off_sections_pace_the_work_unaudited(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # critic.enabled: false is the repository saying "no model reviews": sections still
    # go one at a time, but no audit call is made for them (nor a final audit).
    model.play(
        m.write_file("calc.py", ADD),
        m.text("Fixed add."),
        m.write_file("calc.py", SUB),
        m.text("Added sub."),
        m.write_file("calc.py", MUL),
        m.text("Added mul."),
    )
    yml = YML + "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
    start(github, drain, yml=yml)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "pr_opened"), r
    assert [s["done"] for s in r.sections] == [True, True, True]
    assert not [b for b in model.requests if "output_config" in b]  # no audit, no critic
    audited = events(redis, "section_audited")
    assert [a["verdict"] for a in audited] == ["approve"] * 3
    assert all("Not audited" in a["summary"] for a in audited)
    prompts = [last_prompt(b) for b in agent_requests(model)]
    assert any("Work on section 3 of 3" in p for p in prompts)
    # Nothing public claims an audit that never ran.
    status = next(
        c["body"] for c in github.repo(REPO).comments.values() if "### loopbot" in c["body"]
    )
    assert "Add mul — done (not audited: the critic is off)" in status and "audited (" not in status
    body = github.repo(REPO).issues[r.pr_number].body  # type: ignore[index]
    assert "3 of 3 done, 0 of them audited" in body
