"""Findings that persist across review rounds (bot/core/rules/pull/findings.py) and the pure
rules in bot/core/rules/pull/review.py that use them: ids, fingerprints, answers,
dismissals, stored verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.commands import DismissFinding
from bot.core.record import Reason, Status
from bot.core.rules.pull import findings as flog
from bot.core.rules.pull.review import (
    NO_TEST,
    AfterDismissal,
    CodeAgain,
    CriticReport,
    Finding,
    MergeNext,
    NeedsHuman,
    after_dismissal,
    check_answers,
    evidence,
    evidence_finding,
    output_schema,
    plan_after_review,
    plan_for_reviewed_head,
    review_body,
)
from bot.core.rules.routing import Enqueue, Ignore, route


def f(
    title: str = "off by one", sev: str = "sev1", path: str = "a.py", cat: str = "correctness"
) -> Finding:
    return Finding(severity=sev, category=cat, path=path, line=3, title=title, body="b")  # type: ignore[arg-type]


def round1(*raised: Finding) -> flog.RoundResult:
    return flog.merge_round([], 1, list(raised), {}, round_=1, sha="sha1")


def test_fingerprint_folds_case_and_punctuation_but_keeps_path_and_category() -> None:
    fp = flog.fingerprint
    assert fp("a.py", "correctness", "Off-by-one!") == fp("a.py", "correctness", "off by ONE")
    assert fp("a.py", "correctness", "x") != fp("b.py", "correctness", "x")
    assert fp("a.py", "correctness", "x") != fp("a.py", "tests", "x")


def test_new_findings_get_ids_and_the_same_one_twice_in_a_report_is_one() -> None:
    r = round1(f("one"), f("two", "sev2"), f("One."))
    assert [e["id"] for e in r.log] == ["F1", "F2"] and r.next_id == 3
    assert r.new == ["F1", "F2"] and not (r.still_open or r.resolved or r.recurring)
    assert r.entry("F1")["first_sha"] == "sha1" and r.entry("F1")["status"] == "open"


@pytest.mark.parametrize(
    ("answer", "raised_again", "status", "bucket"),
    [
        ("resolved", False, "resolved", "resolved"),
        ("open", False, "open", "still_open"),
        # Raised again with the same fingerprint: the same finding, still open, same id.
        ("open", True, "open", "still_open"),
        # Called resolved and raised again in one answer: the blocking statement wins.
        ("resolved", True, "open", "still_open"),
    ],
)
def test_round_two_marks_each_earlier_finding(
    answer: str, raised_again: bool, status: str, bucket: str
) -> None:
    first = round1(f("one"))
    again = [f("ONE")] if raised_again else []
    r = flog.merge_round(
        first.log, first.next_id, again, {"F1": (answer, "why")}, round_=2, sha="sha2"
    )  # type: ignore[dict-item]
    assert [e["id"] for e in r.log] == ["F1"] and r.next_id == 2  # no new id for it
    assert r.entry("F1")["status"] == status
    assert getattr(r, bucket) == ["F1"]
    assert r.entry("F1")["why"] == "why"


def test_a_resolved_finding_raised_again_recurs_with_its_id() -> None:
    first = round1(f("one"))
    second = flog.merge_round(first.log, 2, [], {"F1": ("resolved", "fixed")}, round_=2, sha="sha2")
    third = flog.merge_round(second.log, 2, [f("One!")], {}, round_=3, sha="sha3")
    assert third.recurring == ["F1"] and third.new == []
    e = third.entry("F1")
    assert (e["status"], e["resolved_sha"], e["last_sha"], e["rounds"]) == ("open", None, "sha3", 2)


def test_a_dismissed_finding_stays_dismissed_when_raised_again() -> None:
    first = round1(f("one"))
    log = flog.dismiss(first.log, "F1", by="writer", reason="n <= 10", sha="sha1", at=1.0)
    r = flog.merge_round(log, 2, [f("one")], {}, round_=2, sha="sha2")
    assert r.dismissed == ["F1"] and flog.blocking(r.log) == []
    assert r.entry("F1")["dismissed_by"] == "writer" and r.entry("F1")["last_sha"] == "sha2"


@pytest.mark.parametrize(
    ("fid", "reason", "error"),
    [
        ("F9", "because", "there is no finding F9 (open findings: F1)"),
        ("F1", "  ", "a reason is required"),
    ],
)
def test_dismiss_refuses_an_unknown_id_or_no_reason(fid: str, reason: str, error: str) -> None:
    log = round1(f("one")).log
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)")):
        flog.dismiss(log, fid, by="w", reason=reason, sha="s", at=0)
    twice = flog.dismiss(log, "F1", by="w", reason="r", sha="s", at=0)
    with pytest.raises(ValueError, match="already dismissed"):
        flog.dismiss(twice, "F1", by="w", reason="r", sha="s", at=0)
    assert log[0]["status"] == "open"  # the input is never changed


def report(**kw: Any) -> CriticReport:
    return CriticReport.model_validate({"verdict": "approve", "summary": "s", **kw})


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ([], "no answer for F1, F2"),
        ([{"id": "F1", "status": "open", "why": ""}], "no answer for F2"),
        (
            [
                {"id": "F1", "status": "open", "why": ""},
                {"id": "F1", "status": "resolved", "why": ""},
                {"id": "F2", "status": "open", "why": ""},
            ],
            "more than one answer for F1",
        ),
        (
            [
                {"id": "F1", "status": "open", "why": ""},
                {"id": "F2", "status": "open", "why": ""},
                {"id": "F7", "status": "open", "why": ""},
            ],
            "unknown finding ids F7",
        ),
    ],
)
def test_every_open_finding_is_answered_exactly_once(
    given: list[dict[str, Any]], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        check_answers(report(earlier_findings=given), ["F1", "F2"])


def test_the_schema_names_the_ids_to_answer() -> None:
    schema = output_schema(["F1", "F3"])
    assert "earlier_findings" in schema["required"]
    answer = schema["properties"]["earlier_findings"]["items"]
    assert answer["properties"]["id"]["enum"] == ["F1", "F3"]
    assert (
        "enum" not in output_schema()["properties"]["earlier_findings"]["items"]["properties"]["id"]
    )


def test_a_sev1_the_critic_keeps_open_blocks_even_if_it_approves() -> None:
    # Round 2 of a flip-flopping critic: "approve", but F1 still open by its own answer.
    kw = {"diff_lines": 10, "round_": 2, "max_rounds": 3, "large_diff_lines": 400}
    plan = plan_after_review(report(), blocking=[f("one")], **kw)  # type: ignore[arg-type]
    assert isinstance(plan, CodeAgain)
    # And a re-raised sev1 a writer dismissed does not block.
    sev1 = report(findings=[f("one").model_dump()])
    assert plan_after_review(sev1, blocking=[], **kw) == MergeNext()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("verdict", "dismiss", "expected"),
    [
        ("request_changes", False, NeedsHuman),  # the sev1 stands: a person decides
        ("request_changes", True, NeedsHuman),  # changes asked, nothing blocks: a person
        ("approve", False, NeedsHuman),  # an approval cannot lift a standing sev1
        ("approve", True, MergeNext),
    ],
)
def test_a_reviewed_head_is_judged_by_its_stored_verdict(
    verdict: str, dismiss: bool, expected: type
) -> None:
    log = round1(f("one")).log
    if dismiss:
        log = flog.dismiss(log, "F1", by="w", reason="r", sha="sha1", at=0)
    plan = plan_for_reviewed_head(verdict, log, "sha1", diff_lines=5, large_diff_lines=400)
    assert isinstance(plan, expected)
    if not dismiss:
        assert "F1" in plan.why and "/loop-dismiss" in plan.why  # type: ignore[union-attr]


def gate_kw(**over: Any) -> dict[str, Any]:
    log = flog.dismiss(round1(f("one")).log, "F1", by="w", reason="r", sha="h", at=0)
    return {
        "status": Status.REFUSED,
        "reason": Reason.NEEDS_HUMAN.value,
        "severity": "sev1",
        "log": log,
        "head": "h",
        "reviewed_sha": "h",
        "reviewed_whole": True,
        "verdicts": {"h": "request_changes"},
    } | over


GATE, REVIEW, NOTHING = AfterDismissal.GATE, AfterDismissal.REVIEW, AfterDismissal.NOTHING


@pytest.mark.parametrize(
    ("over", "then"),
    [
        ({}, GATE),
        ({"reason": Reason.CRITIC_ROUNDS.value, "status": Status.FAILED}, GATE),
        ({"severity": "sev2"}, NOTHING),
        ({"head": "moved"}, REVIEW),  # a new head needs its own review first
        ({"status": Status.RUNNING, "reason": ""}, NOTHING),  # coding: the next round sees it
        ({"status": Status.CANCELLED, "reason": Reason.CANCELLED.value}, NOTHING),
        ({"verdicts": {}}, REVIEW),
        ({"verdicts": {"h": "error"}}, REVIEW),
        ({"log": round1(f("one"), f("two")).log}, NOTHING),  # another sev1 stands
        # The last round's diff was cut: the writer overrode a review of part of it.
        ({"reviewed_whole": False}, REVIEW),
        (
            {
                "reviewed_whole": False,
                "reason": Reason.CRITIC_ROUNDS.value,
                "status": Status.FAILED,
            },
            REVIEW,
        ),
        ({"head": ""}, NOTHING),  # no pull request head to review
        # A section audit's sev1 that stopped a loop with no pull request yet: it goes on.
        ({"section": 0, "pull": False}, AfterDismissal.RESUME),
        ({"section": 0, "pull": False, "severity": "sev2"}, NOTHING),
        ({"section": 0, "pull": False, "log": round1(f("one"), f("two")).log}, NOTHING),
        ({"section": 0, "pull": False, "status": Status.RUNNING, "reason": ""}, NOTHING),
        ({"section": 0, "pull": True}, GATE),  # past the sections: the critic's rule
    ],
)
def test_what_a_dismissal_leads_to(over: dict[str, Any], then: AfterDismissal) -> None:
    assert after_dismissal(**gate_kw(**over)) is then


def test_evidence_and_loopbots_own_no_test_finding() -> None:
    passed = {"sha": "b" * 40, "passed": True, "exit_code": 0}
    failed = {"sha": "b" * 40, "passed": False, "exit_code": 1}
    assert evidence_finding(passed, []) and not evidence_finding(passed, ["test_x.py"])
    assert not evidence_finding(failed, []) and not evidence_finding({}, [])
    lines = evidence(passed, {"passed": True, "sha": "h"}, [], "h")
    assert "already passed on the base" in lines[0] and "passes on this head" in lines[1]
    assert "none" in lines[2] and "sev1" in lines[3]
    lines = evidence(failed, {"passed": True, "sha": "h"}, ["test_x.py"], "h")
    assert "failed on the base" in lines[0] and "`test_x.py`" in lines[2] and len(lines) == 3
    assert NO_TEST.severity == "sev2"  # a docs issue may rightly change no test


def test_the_review_body_shows_every_finding_by_id() -> None:
    first = round1(f("one"), f("two", "sev2"))
    log = flog.dismiss(first.log, "F2", by="writer", reason="not ours", sha="s", at=0)
    r = flog.merge_round(
        log, 3, [f("three", "sev3")], {"F1": ("resolved", "guarded now")}, round_=2, sha="s2"
    )
    body = review_body(report(findings=[f("three", "sev3").model_dump()]), [], 2, None, r)
    assert "**New:**\n- **F3** sev3 three" in body
    assert "**Resolved:**\n- **F1** sev1 one `a.py:3` — guarded now" in body
    assert "**Dismissed by a writer:**\n- **F2**" in body and "not ours" in body


def comment_payload(body: str, on_pull: bool = False) -> dict[str, Any]:
    issue: dict[str, Any] = {"number": 5}
    if on_pull:
        issue["pull_request"] = {"url": "x"}
    return {
        "action": "created",
        "sender": {"login": "writer", "type": "User"},
        "installation": {"id": 1},
        "repository": {"full_name": "acme/widgets"},
        "issue": issue,
        "comment": {"id": 77, "body": body},
    }


@pytest.mark.parametrize(
    ("body", "on_pull", "finding", "reason", "issue", "pull"),
    [
        ("/loop-dismiss F3 n is at most 10 here", False, "F3", "n is at most 10 here", 5, 0),
        ("/loop-dismiss f1 not reachable", True, "f1", "not reachable", 0, 5),
        ("/loop-dismiss F3", False, "F3", "", 5, 0),  # routed; the job answers the error
        ("/loop-dismiss", False, "", "", 5, 0),
    ],
)
def test_loop_dismiss_routes_with_its_id_and_reason(
    body: str, on_pull: bool, finding: str, reason: str, issue: int, pull: int
) -> None:
    routed = route("issue_comment", comment_payload(body, on_pull), app_id=1)
    assert isinstance(routed, Enqueue) and isinstance(routed.command, DismissFinding)
    cmd = routed.command
    assert (cmd.finding, cmd.reason, cmd.issue, cmd.pull) == (finding, reason, issue, pull)


def test_loop_dismiss_from_a_bot_is_ignored() -> None:
    payload = comment_payload("/loop-dismiss F1 fine")
    payload["sender"]["type"] = "Bot"
    assert isinstance(route("issue_comment", payload, app_id=1), Ignore)


def test_a_dismissed_nit_raised_again_as_sev1_reopens() -> None:
    """Red team: a writer dismissed F2 as a sev3 nit; later the critic raises the same
    fingerprint as a sev1. That is a new judgement: it reopens and blocks."""
    from bot.core.rules.pull import findings as flog
    from bot.core.rules.pull.review import Finding

    nit = Finding(
        severity="sev3",
        category="correctness",
        path="calc.py",
        line=2,
        title="integer overflow",
        body="b",
    )
    first = flog.merge_round([], 1, [nit], {}, round_=1, sha="a" * 40)
    log = flog.dismiss(first.log, "F1", by="writer", reason="just a nit", sha="a" * 40, at=1.0)
    same = flog.merge_round(log, first.next_id, [nit], {}, round_=2, sha="b" * 40)
    assert [e["status"] for e in same.log] == ["dismissed"]
    worse = nit.model_copy(update={"severity": "sev1", "title": "Integer overflow!"})
    again = flog.merge_round(log, first.next_id, [worse], {}, round_=2, sha="b" * 40)
    assert [(e["id"], e["status"], e["severity"]) for e in again.log] == [("F1", "open", "sev1")]
    assert [e["id"] for e in flog.blocking(again.log)] == ["F1"]


def test_a_section_round_marks_its_findings_and_takes_over_one_raised_again() -> None:
    """Section audits write the one log: their new findings carry ``section``; a finding
    an earlier section left open (a sev2), raised again by this section's audit, is this
    section's to answer now (else its sev1 would block nothing: not asked, not counted)."""
    first = flog.merge_round([], 1, [f("nit", "sev2")], {}, round_="S1.1", sha="a", section=0)
    assert first.entry("F1")["section"] == 0 and first.entry("F1")["first_round"] == "S1.1"
    second = flog.merge_round(
        first.log,
        first.next_id,
        [f("nit", "sev1"), f("new")],
        {},
        round_="S2.1",
        sha="b",
        section=1,
    )
    assert [e["id"] for e in flog.of_section(second.log, 1)] == ["F1", "F2"]
    assert flog.of_section(second.log, 0) == [] and second.entry("F1")["severity"] == "sev1"
    # A critic round (no section) leaves the section where it was.
    third = flog.merge_round(second.log, second.next_id, [f("new")], {}, round_=1, sha="c")
    assert third.entry("F2")["section"] == 1 and third.entry("F2")["rounds"] == 2
