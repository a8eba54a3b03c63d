"""Review rounds end to end: a verdict belongs to a commit, findings persist and are
answered by id, and /loop-dismiss. Real RQ worker, real git, local GitHub and model; the
model plays a critic that flip-flops and an agent that does nothing."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.review.test_receipt import receipt_body
from tests.e2e.review.test_review_merge import FIX, KEY, YML, finding, is_critic, main_log, record
from tests.helpers import REPO, comment, content_text, label, open_issue, sample_repo

SEV1 = finding("sev1", "calc.py", 2, "add() overflows on big ints")


def answer(verdict: str, findings: list[dict[str, Any]], earlier: list[dict[str, Any]]) -> m.Reply:
    return m.structured(
        {"verdict": verdict, "summary": "s", "findings": findings, "earlier_findings": earlier}
    )


def start(github: GitHubServer, drain: Any) -> None:
    sample_repo(github, loop_yml=YML)
    label(github, "writer", open_issue(github))
    drain()


def critic_requests(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if is_critic(b)]


def replies(github: GitHubServer, number: int) -> list[str]:
    """loopbot's comments on issue or pull request ``number``."""
    return [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if c["_issue"] == number and c["user"]["type"] == "Bot"
    ]


def test_a_sev1_on_an_unchanged_head_stands_and_only_a_writers_dismissal_lifts_it(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The critic blocks X, then would approve the very same X if asked again; the agent,
    # sent back with the finding, changes nothing and says it is fine.
    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            if len(critic_requests(model)) == 1:
                return answer("request_changes", [SEV1], [])
            return answer("approve", [], [{"id": "F1", "status": "resolved", "why": "fine"}])
        return m.text("The code is correct as it is; nothing to change.")

    model.play(FIX, m.text("Fixed."))
    model.responder = play
    start(github, drain)
    r = record(redis)
    head = github.ref(REPO, "loop/issue-1")
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "F1" in r.detail and "no change was pushed" in r.detail
    assert len(critic_requests(model)) == 1  # X was never reviewed again
    assert r.verdicts == {head: "request_changes"}
    assert len(main_log(github)) == 1  # nothing merged
    reviews = github.repo(REPO).reviews[r.pr_number]
    assert [(v["commit_id"], "changes requested" in v["body"]) for v in reviews] == [(head, True)]
    assert "**F1**" in reviews[0]["body"]
    skipped = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "review_skipped"]
    assert skipped == [{"sha": head, "verdict": "request_changes", "plan": "NeedsHuman"}]

    # A reader cannot dismiss it; a writer must name an open finding and give a reason.
    with github.as_user("reader") as u:
        said = u.post(
            f"/repos/{REPO}/issues/{r.pr_number}/comments", json={"body": "/loop-dismiss F1 meh"}
        ).json()["id"]
    comment(github, "writer", 1, "/loop-dismiss F9 not a problem")
    comment(github, "writer", 1, "/loop-dismiss F1")
    drain()
    r = record(redis)
    assert (r.status, r.finding_log[0]["status"]) == (Status.REFUSED, "open"), r
    assert not any("F1" in b for b in replies(github, r.pr_number))
    assert all(x["comment_id"] != said for x in github.repo(REPO).reactions)
    errors = [b for b in replies(github, 1) if "nothing was dismissed" in b]
    assert len(errors) == 2
    assert "there is no finding F9 (open findings: F1)" in errors[0]
    assert "a reason is required" in errors[1]

    # A writer's dismissal, on the pull request, is recorded and lets X go to the gate.
    with github.as_user("writer") as u:
        u.post(
            f"/repos/{REPO}/issues/{r.pr_number}/comments",
            json={"body": "/loop-dismiss F1 add() only ever sees small ints here"},
        )
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert len(critic_requests(model)) == 1  # still: the dismissal asked no model
    f1 = r.finding_log[0]
    assert (f1["status"], f1["dismissed_by"], f1["dismissed_sha"]) == ("dismissed", "writer", head)
    assert f1["dismissed_reason"] == "add() only ever sees small ints here"
    assert any("dismissed **F1**" in b and "merge gate" in b for b in replies(github, r.pr_number))
    assert len(main_log(github)) == 2 and len(github.repo(REPO).reviews[r.pr_number]) == 1
    events = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "finding_dismissed"]
    assert [(e["id"], e["actor"], e["unblocked"]) for e in events] == [("F1", "writer", True)]
    # The critic's verdict on X is still its own; the receipt says who overrode it.
    assert r.verdicts[head] != "approve"
    receipt = receipt_body(github, r.pr_number)  # in the status comment's last edit
    assert receipt is not None and "critic verdict approve" in receipt
    assert "dismissed by @" in receipt and "writer" in receipt


def test_round_two_is_asked_about_round_ones_findings_and_must_answer_them(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    new_test = m.write_file(
        "test_big.py",
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        "    def test_big(self):\n        self.assertEqual(add(2**70, 1), 2**70 + 1)\n",
    )
    model.play(
        FIX,
        m.text("Fixed."),
        answer("request_changes", [SEV1], []),
        new_test,
        m.text("Added a test for big ints."),
        # Round 2: first it forgets F1 altogether, as a model does; asked again, it answers.
        answer("approve", [], []),
        answer("approve", [], [{"id": "F1", "status": "resolved", "why": "test_big covers it"}]),
    )
    start(github, drain)
    r = record(redis)
    assert (r.status, r.reason, r.critic_round) == (Status.COMPLETED, "merged", 2), r
    first, second, again = critic_requests(model)
    prompt = content_text(second["messages"][0])
    assert "F1 [sev1] calc.py:2 add() overflows on big ints" in prompt
    assert "What changed since your last review" in prompt and "test_big.py" in prompt
    assert "verify failed on the base" in prompt
    ids = second["output_config"]["format"]["schema"]["properties"]["earlier_findings"]
    assert ids["items"]["properties"]["id"]["enum"] == ["F1"]
    assert "no answer for F1" in json.dumps(again["messages"][-1])
    assert "F1" not in content_text(first["messages"][0])
    f1 = r.finding_log[0]
    assert (f1["id"], f1["status"], f1["resolved_round"]) == ("F1", "resolved", 2)
    assert f1["resolved_sha"] == r.reviewed_sha != f1["first_sha"]
    reviews = github.repo(REPO).reviews[r.pr_number]
    assert [v["commit_id"] for v in reviews] == [f1["first_sha"], r.reviewed_sha]
    assert r.verdicts == {f1["first_sha"]: "request_changes", r.reviewed_sha: "approve"}
    assert (
        "**Resolved:**\n- **F1**" in reviews[1]["body"]
        and "test_big covers it" in reviews[1]["body"]
    )


def test_an_approval_that_keeps_its_own_sev1_open_does_not_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # A flip-flopping critic on a new head: "approve", yet F1 is still open by its answer.
    model.play(
        FIX,
        m.text("Fixed."),
        answer("request_changes", [SEV1], []),
        m.write_file("NOTES.md", "big ints are fine\n"),
        m.text("Documented it."),
        answer("approve", [], [{"id": "F1", "status": "open", "why": "still overflows"}]),
        m.text("Nothing more to do."),  # the agent changes nothing after that
    )
    start(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert len(critic_requests(model)) == 2 and len(main_log(github)) == 1
    reviews = github.repo(REPO).reviews[r.pr_number]
    assert len(reviews) == 2 and "**Still open:**\n- **F1**" in reviews[1]["body"]
    assert "will address them" in reviews[1]["body"]
    assert r.finding_log[0]["status"] == "open" and r.finding_log[0]["rounds"] == 2


def test_the_critic_reads_the_code_and_runs_the_tests_on_the_head_before_judging(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """In a real loop the critic's tools work on a checkout of the PR head: what it reads
    is the agent's fixed file, and run_tests is verify's result on that head."""
    model.play(
        FIX,
        m.text("Fixed add()."),
        m.tool("read_file", {"path": "calc.py"}),
        m.tool("run_tests", {}),
        answer("approve", [], []),
    )
    start(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    calls = critic_requests(model)
    assert len(calls) == 3 and all(c.get("tools") for c in calls)
    results = [
        b
        for c in calls
        for msg in c["messages"]
        if isinstance(msg["content"], list)
        for b in msg["content"]
        if b.get("type") == "tool_result"
    ]
    shown = [json.dumps(b.get("content")) for b in results]
    assert any("return a + b" in s for s in shown), shown  # the head, not the base
    assert any("passed" in s.lower() or "exit 0" in s.lower() for s in shown), shown
    looked = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "critic_looked"]
    assert looked and looked[0]["tool_calls"] == 2 and looked[0]["stopped"] == "answered"
    assert all(u.messages for k, u in r.usage.items() if k.endswith("/critic"))


def test_a_dismissal_after_a_review_that_saw_part_of_the_diff_asks_a_new_round_first(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The loop stops at critic_rounds_exhausted over one sev1, on a change whose diff is
    past what the critic reads (it was cut). A writer dismisses that sev1: that does not
    send the unread rest of the change to the gate. The critic's round judges the head
    again with the dismissal standing; its diff is still cut, so a person is asked, and
    nothing is merged (before: straight to the gate, and merged)."""
    big = "".join(f"row {i:06d} " + "x" * 60 + "\n" for i in range(2_600))  # ~180 KB
    model.play(FIX, m.write_file("data.txt", big), m.text("Fixed, with the data."))

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            if len(critic_requests(model)) == 1:
                return answer("request_changes", [SEV1], [])
            return answer("approve", [], [])
        return m.text("Nothing to change.")

    model.responder = play
    sample_repo(github, loop_yml="verify: python3 -m unittest -q\ncritic:\n  max_rounds: 1\n")
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "critic_rounds_exhausted"), r
    assert r.reviewed_whole is False
    comment(github, "writer", 1, "/loop-dismiss F1 add() only ever sees small ints here")
    drain()
    r = record(redis)
    # The critic's round on the head, not the gate: the head keeps its verdict (a head is
    # never asked again), judged again with the dismissal standing and the diff still cut.
    assert len(critic_requests(model)) == 1
    skipped = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "review_skipped"]
    assert [s["plan"] for s in skipped] == ["NeedsHuman"]
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "too large for the critic to read whole" in r.detail
    assert len(main_log(github)) == 1  # nothing merged
    said = [b for b in replies(github, 1) if "dismissed **F1**" in b]
    assert len(said) == 1 and "judges it once more" in said[0]
    events = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "finding_dismissed"]
    assert [(e["then"], e["unblocked"]) for e in events] == [("review", True)]
