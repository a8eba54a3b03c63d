"""Pure decisions as tables, one case per row: the merge gate and what it reads (checks,
protected paths), the review plan, a loop's turns, starting and restarting. No I/O.

Each decision is reduced to ``(kind, detail)`` so that one row names what is decided and
a fragment of why; a row's id says the rule it pins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import pytest

from bot.core.record import LoopRecord, Status, can_restart, should_start
from bot.core.rules.loop import turns as t
from bot.core.rules.pull.merge import (
    AlreadyMerged,
    Decision,
    Facts,
    FixChecks,
    FixConflicts,
    Merge,
    Refuse,
    Review,
    Wait,
    decide,
    protected_changes,
    summarize_checks,
)
from bot.core.rules.pull.review import (
    Category,
    CodeAgain,
    CriticReport,
    Finding,
    MergeNext,
    NeedsHuman,
    Plan,
    Severity,
    StopLoop,
    Verdict,
    fingerprint,
    plan_after_review,
    tally,
)
from tests.helpers import HEAD, merge_facts

FACTS = merge_facts()  # the gate merges HEAD on these
MOVED = "c" * 40  # a head nobody reviewed
PROTECTED = (".github/workflows/ci.yml", "poetry.lock", "scripts/verify.sh")


# -- the merge gate ---------------------------------------------------------------------------


def gate(d: Decision) -> tuple[str, str]:
    """The gate's decision as (kind, detail): the reason and why of a refusal, the sha of a
    merge, the checks to fix, the why of a wait, a review or a conflict fix."""
    match d:
        case Merge(sha=sha):
            return "Merge", sha
        case AlreadyMerged():
            return "AlreadyMerged", ""
        case Refuse(reason=reason, why=why):
            return "Refuse", f"{reason.value}: {why}"
        case FixChecks(failing=failing):
            return "FixChecks", ", ".join(failing)
        case Wait(why=why) | Review(why=why) | FixConflicts(why=why):
            return type(d).__name__, why


@pytest.mark.parametrize(
    ("facts", "kind", "detail"),
    [
        pytest.param(FACTS, "Merge", HEAD, id="merges reviewed green open work"),
        pytest.param(
            replace(FACTS, checks="none"), "Merge", HEAD, id="merges when no check exists"
        ),
        pytest.param(
            replace(FACTS, checks="failure", require_checks=False),
            "Merge",
            HEAD,
            id="checks not required do not hold the merge",
        ),
        pytest.param(
            replace(FACTS, pr_merged=True, issue_open=False),
            "AlreadyMerged",
            "",
            id="a merged pull request is already merged",
        ),
        pytest.param(
            replace(FACTS, issue_open=False),
            "Refuse",
            "issue_closed: the issue was closed",
            id="closed issue refuses",
        ),
        pytest.param(
            replace(FACTS, issue_open=False, head_sha=MOVED, checks="failure", open_sev1=2),
            "Refuse",
            "issue_closed:",
            id="closed issue wins over everything else",
        ),
        pytest.param(
            replace(FACTS, ready_label=False),
            "Refuse",
            "issue_inactive: the ready label was removed",
            id="removed ready label refuses",
        ),
        pytest.param(
            replace(FACTS, pr_open=False),
            "Refuse",
            "pull_closed: the pull request was closed",
            id="closed pull request refuses",
        ),
        pytest.param(
            replace(FACTS, open_sev1=1),
            "Refuse",
            "critic_rounds_exhausted: 1 sev1 finding(s) stand",
            id="an open sev1 refuses",
        ),
        pytest.param(
            replace(FACTS, head_sha=MOVED),
            "Review",
            "the head moved to cccccccccc after the review of bbbbbbbbbb",
            id="a head moved since the review is reviewed again",
        ),
        pytest.param(
            replace(FACTS, reviewed_sha=""),
            "Review",
            "after the review of nothing",
            id="an unreviewed head is reviewed",
        ),
        pytest.param(
            replace(FACTS, verdict="request_changes", dismissed_by="writer"),
            "Merge",
            HEAD,
            id="a writer's dismissal overrides the verdict",
        ),
        pytest.param(
            replace(FACTS, verdict="error", dismissed_by="writer"),
            "Refuse",
            "needs_human: the critic's verdict on bbbbbbbbbb is `error`, not approve",
            id="a dismissal never overrides a failed review",
        ),
        pytest.param(
            replace(FACTS, checks="pending"),
            "Wait",
            "required checks are still running",
            id="pending checks wait",
        ),
        pytest.param(
            replace(FACTS, checks="pending", waited_seconds=4000),
            "Refuse",
            "checks_timeout: checks still pending after 67 minutes",
            id="pending checks past the wait refuse",
        ),
        pytest.param(
            replace(FACTS, checks="failure", failing_checks=("ci",)),
            "FixChecks",
            "ci",
            id="failing checks get a fix turn",
        ),
        pytest.param(
            replace(FACTS, checks="failure", failing_checks=("ci",), fix_turns_used=2),
            "Refuse",
            "checks_failed: required checks fail: ci",
            id="failing checks with no fix turn left refuse",
        ),
        pytest.param(
            replace(FACTS, checks="unknown", failing_checks=("`ci` (check run state `x`)",)),
            "Refuse",
            "needs_human: loopbot cannot tell whether these required checks passed: `ci`",
            id="a check in an unknown state refuses",
        ),
        pytest.param(
            replace(FACTS, mergeable=False),
            "FixConflicts",
            "the pull request conflicts with the default branch",
            id="conflicts get a fix turn",
        ),
        pytest.param(
            replace(FACTS, mergeable=False, fix_turns_used=2),
            "Refuse",
            "not_mergeable: the pull request conflicts",
            id="conflicts with no fix turn left refuse",
        ),
        pytest.param(
            replace(FACTS, mergeable=None),
            "Wait",
            "GitHub is still computing",
            id="unknown mergeability waits",
        ),
        pytest.param(
            replace(FACTS, base_included=False),
            "FixConflicts",
            "the default branch moved to dddddddddd since verify",
            id="a base that moved since verify is merged in",
        ),
        pytest.param(
            replace(FACTS, base_included=False, fix_turns_used=2),
            "Refuse",
            "not_mergeable: the default branch keeps moving",
            id="a base that keeps moving refuses",
        ),
        pytest.param(
            replace(FACTS, base_included=None),
            "Refuse",
            "needs_human: loopbot cannot tell whether the head contains the default branch",
            id="an unknown base refuses",
        ),
        pytest.param(
            replace(FACTS, protected_changes=PROTECTED),
            "Refuse",
            "needs_human: the pull request changes protected paths "
            "(`.github/workflows/ci.yml`, `poetry.lock`, `scripts/verify.sh`)",
            id="protected paths are never merged",
        ),
        pytest.param(
            replace(FACTS, protected_changes=PROTECTED, head_sha=MOVED),
            "Review",
            "the head moved",
            id="a moved head is reviewed before protected paths are judged",
        ),
        pytest.param(
            replace(FACTS, protected_changes=()), "Merge", HEAD, id="no protected path merges"
        ),
    ],
)
def test_merge_gate(facts: Facts, kind: str, detail: str) -> None:
    got_kind, got_detail = gate(decide(facts))
    assert got_kind == kind and detail in got_detail, (got_kind, got_detail)


@pytest.mark.parametrize(
    ("paths", "hits"),
    [
        pytest.param(
            [".github/workflows/ci.yml", "src/app.py", "poetry.lock", "scripts/verify.sh"],
            PROTECTED,
            id="a directory, a glob and a file",
        ),
        pytest.param(["src/.github.py", "github/x"], (), id="look-alikes are not protected"),
        pytest.param(["poetry.lock", "poetry.lock"], ("poetry.lock",), id="each path once"),
    ],
)
def test_protected_changes(paths: list[str], hits: tuple[str, ...]) -> None:
    assert protected_changes(paths, (".github/**", "*.lock", "scripts/verify.sh")) == hits


Run = tuple[str, str, str | None]  # check run: (name, status, conclusion)
CommitStatus = tuple[str, str]  # commit status: (context, state)
REQUIRED = frozenset({"ci/test", "deploy-preview", "loopbot/critic"})
RUNS = [("ci/test", "completed", "success"), ("lint", "completed", "failure")]


@pytest.mark.parametrize(
    ("runs", "statuses", "required", "expected"),
    [
        pytest.param(
            [("loopbot", "in_progress", None)],
            [],
            None,
            ("none", ()),
            id="loopbot's own runs do not count",
        ),
        pytest.param(
            [("ci", "completed", "success")],
            [("lint", "pending")],
            None,
            ("pending", ()),
            id="a pending status is pending",
        ),
        pytest.param(
            [("ci", "completed", "failure")],
            [("lint", "error")],
            None,
            ("failure", ("ci", "lint")),
            id="failing runs and statuses are named",
        ),
        pytest.param(
            [("ci", "completed", "skipped")],
            [],
            None,
            ("success", ()),
            id="skipped is success",
        ),
        pytest.param(
            RUNS,
            [],
            REQUIRED,
            ("pending", ()),
            id="a required check not reported yet is pending",
        ),
        pytest.param(
            RUNS,
            [("deploy-preview", "success")],
            REQUIRED,
            ("success", ()),
            id="a failing check that is not required does not count",
        ),
        pytest.param(
            RUNS,
            [("deploy-preview", "error")],
            REQUIRED,
            ("failure", ("deploy-preview",)),
            id="a failing required check is named",
        ),
        pytest.param(
            [],
            [],
            frozenset({"ci/test"}),
            ("pending", ()),
            id="nothing reported yet is pending not none",
        ),
        pytest.param(
            [],
            [],
            frozenset({"loopbot/critic"}),
            ("none", ()),
            id="requiring only loopbot's own check requires nothing",
        ),
    ],
)
def test_checks_summary(
    runs: list[Run],
    statuses: list[CommitStatus],
    required: frozenset[str] | None,
    expected: tuple[str, tuple[str, ...]],
) -> None:
    assert summarize_checks(runs, statuses, required) == expected


# -- the review plan --------------------------------------------------------------------------


def finding(severity: Severity, title: str = "t", category: Category = "correctness") -> Finding:
    return Finding(severity=severity, category=category, path="a.py", line=1, title=title, body="b")


def report(verdict: Verdict, *severities: Severity) -> CriticReport:
    return CriticReport(
        verdict=verdict,
        summary="bad" if verdict == "error" else "ok",
        findings=[finding(s) for s in severities],
    )


@dataclass(frozen=True)
class ReviewInputs:
    """``plan_after_review``'s inputs, defaulting to a small diff's first of three rounds."""

    report: CriticReport
    round_: int = 1
    max_rounds: int = 3
    diff_lines: int = 10
    large_diff_lines: int = 400
    seen: Mapping[str, int] | None = None
    unread_chars: int = 0

    def plan(self) -> Plan:
        return plan_after_review(
            self.report,
            diff_lines=self.diff_lines,
            round_=self.round_,
            max_rounds=self.max_rounds,
            large_diff_lines=self.large_diff_lines,
            seen=self.seen,
            unread_chars=self.unread_chars,
        )


def planned(p: Plan) -> tuple[str, str]:
    match p:
        case MergeNext():
            return "MergeNext", ""
        case CodeAgain(findings=findings):
            return "CodeAgain", ", ".join(f"{f.severity} {f.title}" for f in findings)
        case NeedsHuman(why=why):
            return "NeedsHuman", why
        case StopLoop(status=status, reason=reason, detail=detail):
            return "StopLoop", f"{status.value}/{reason.value}: {detail}"


SEV1_SEEN_TWICE = {fingerprint(finding("sev1")): 2}


@pytest.mark.parametrize(
    ("review", "kind", "detail"),
    [
        pytest.param(ReviewInputs(report("approve")), "MergeNext", "", id="an approval merges"),
        pytest.param(
            ReviewInputs(report("request_changes", "sev1", "sev3")),
            "CodeAgain",
            "sev1 t",
            id="sev1 findings go back to coding, without the others",
        ),
        pytest.param(
            ReviewInputs(report("request_changes", "sev1"), round_=3),
            "StopLoop",
            "failed/critic_rounds_exhausted: 1 sev1 finding(s) after 3 review rounds",
            id="a sev1 in the last round stops the loop",
        ),
        pytest.param(
            ReviewInputs(report("error")),
            "StopLoop",
            "failed/critic_error: bad",
            id="a failed review stops the loop",
        ),
        pytest.param(
            ReviewInputs(report("approve"), diff_lines=900),
            "NeedsHuman",
            "an approval with no findings on a 900-line diff is not trusted",
            id="a bare approval of a large diff asks a person",
        ),
        pytest.param(
            ReviewInputs(report("approve", "sev2"), diff_lines=900),
            "MergeNext",
            "",
            id="an approval with findings on a large diff merges",
        ),
        pytest.param(
            ReviewInputs(report("request_changes", "sev2")),
            "NeedsHuman",
            "the critic requested changes without a blocking finding",
            id="changes requested without a sev1 asks a person",
        ),
        pytest.param(
            ReviewInputs(report("approve", "sev3"), diff_lines=9000),
            "MergeNext",
            "",
            id="a large diff read whole merges",
        ),
        pytest.param(
            ReviewInputs(report("approve", "sev3"), diff_lines=9000, unread_chars=12_345),
            "NeedsHuman",
            "12,345 characters were not reviewed",
            id="a diff the critic could not read whole is never merged",
        ),
        pytest.param(
            ReviewInputs(report("request_changes", "sev1"), diff_lines=9000, unread_chars=1),
            "CodeAgain",
            "sev1 t",
            id="a sev1 in the part read still goes back to coding first",
        ),
        pytest.param(
            ReviewInputs(
                report("request_changes", "sev1"),
                round_=2,
                max_rounds=10,
                seen={fingerprint(finding("sev1")): 1},
            ),
            "CodeAgain",
            "sev1 t",
            id="a sev1 raised in two rounds goes back to coding",
        ),
        pytest.param(
            ReviewInputs(
                report("request_changes", "sev1"), round_=3, max_rounds=10, seen=SEV1_SEEN_TWICE
            ),
            "NeedsHuman",
            "the same sev1 finding was raised in 3 review rounds",
            id="a sev1 raised in three rounds goes to a person",
        ),
    ],
)
def test_review_plan(review: ReviewInputs, kind: str, detail: str) -> None:
    got_kind, got_detail = planned(review.plan())
    assert got_kind == kind and detail in got_detail, (got_kind, got_detail)


@pytest.mark.parametrize(
    ("seen", "review", "expected"),
    [
        pytest.param({}, report("request_changes", "sev1"), {"a.py|t": 1}, id="a sev1 counts"),
        pytest.param(
            {"a.py|t": 1}, report("request_changes", "sev1"), {"a.py|t": 2}, id="again: twice"
        ),
        pytest.param(
            {"a.py|t": 1},
            report("request_changes", "sev1", "sev1"),
            {"a.py|t": 2},
            id="once per round however often it is reported",
        ),
        pytest.param({}, report("approve", "sev2"), {}, id="a sev2 never counts"),
    ],
)
def test_sev1_tally(seen: dict[str, int], review: CriticReport, expected: dict[str, int]) -> None:
    assert tally(seen, review) == expected


@pytest.mark.parametrize(
    ("other", "same"),
    [
        pytest.param(finding("sev1", "T!", "tests"), True, id="case punctuation category fold"),
        pytest.param(finding("sev2", "t"), True, id="severity is left out"),
        pytest.param(finding("sev1", "u", "tests"), False, id="other words do not fold"),
    ],
)
def test_sev1_fingerprint(other: Finding, same: bool) -> None:
    assert (fingerprint(other) == fingerprint(finding("sev1"))) is same


# -- a loop's turns ---------------------------------------------------------------------------

TurnStep = t.RunTurn | t.Stop | t.Verified | t.Continue


def stepped(d: TurnStep | None) -> tuple[str, str]:
    match d:
        case None:
            return "None", ""
        case t.Stop(status=status, reason=reason, detail=detail):
            return "Stop", f"{status.value}/{reason.value}: {detail}"
        case t.Continue(failure=failure):
            return type(d).__name__, failure
        case t.RunTurn(turn=turn):
            return "RunTurn", str(turn)
        case t.Verified():
            return "Verified", ""


@dataclass(frozen=True)
class BeforeTurn:
    """``before_turn``'s inputs, defaulting to a loop free to run its first turn."""

    turn: int = 0
    max_turns: int = 3
    issue_open: bool = True
    has_label: bool = True
    cancel: str | None = None
    elapsed_hours: float = 0.0
    max_hours: float = math.inf
    intake_edited: bool = False

    def decide(self) -> t.RunTurn | t.Stop:
        return t.before_turn(
            turn=self.turn,
            max_turns=self.max_turns,
            issue_open=self.issue_open,
            has_label=self.has_label,
            cancel=self.cancel,
            elapsed_hours=self.elapsed_hours,
            max_hours=self.max_hours,
            intake_edited=self.intake_edited,
        )


@pytest.mark.parametrize(
    ("before", "kind", "detail"),
    [
        pytest.param(BeforeTurn(), "RunTurn", "1", id="the first turn runs"),
        pytest.param(BeforeTurn(turn=2), "RunTurn", "3", id="the last turn runs"),
        pytest.param(
            BeforeTurn(turn=3),
            "Stop",
            "failed/max_turns_reached: 3 turns without passing verify",
            id="no turn past max_turns",
        ),
        pytest.param(
            BeforeTurn(issue_open=False),
            "Stop",
            "cancelled/issue_inactive: the issue was closed",
            id="a closed issue stops",
        ),
        pytest.param(
            BeforeTurn(has_label=False),
            "Stop",
            "cancelled/issue_inactive: the ready label was removed",
            id="a removed label stops",
        ),
        pytest.param(
            BeforeTurn(cancel="cancelled"),
            "Stop",
            "cancelled/cancelled: ",
            id="a cancel stops",
        ),
        pytest.param(
            BeforeTurn(cancel="issue_inactive", issue_open=False),
            "Stop",
            "cancelled/issue_inactive: ",
            id="a cancel keeps its reason and wins over the issue state",
        ),
        pytest.param(
            BeforeTurn(cancel="issue_edited"),
            "Stop",
            "cancelled/issue_edited: ",
            id="a cancel for an edit keeps its reason",
        ),
        pytest.param(
            BeforeTurn(cancel="something else"),
            "Stop",
            "cancelled/cancelled: ",
            id="any other cancel reason is a cancel",
        ),
        pytest.param(
            BeforeTurn(intake_edited=True),
            "Stop",
            "cancelled/issue_edited: the issue's title or body changed after a writer",
            id="an edit nobody approved stops",
        ),
        pytest.param(
            BeforeTurn(elapsed_hours=5, max_hours=4),
            "Stop",
            "failed/budget_exhausted: wall-clock budget: 5.0 h of 4 h used",
            id="the hours budget stops",
        ),
    ],
)
def test_before_turn(before: BeforeTurn, kind: str, detail: str) -> None:
    got_kind, got_detail = stepped(before.decide())
    assert got_kind == kind and detail in got_detail, (got_kind, got_detail)


@dataclass(frozen=True)
class AfterTurn:
    """``after_turn``'s inputs, defaulting to a finished turn whose change passes verify."""

    end: str = "finished"
    verify_passed: bool = True
    has_changes: bool = True
    cost: float = 0.1
    max_cost: float = 1.0
    verify_tail: str = "x"
    idle_turns: int = 0
    base_passed: bool | None = None
    tests_changed: tuple[str, ...] = ()
    test_asked: bool = True

    def decide(self) -> t.Verified | t.Continue | t.Stop:
        return t.after_turn(
            end=self.end,
            verify_passed=self.verify_passed,
            has_changes=self.has_changes,
            cost=self.cost,
            max_cost=self.max_cost,
            verify_tail=self.verify_tail,
            idle_turns=self.idle_turns,
            base_passed=self.base_passed,
            tests_changed=self.tests_changed,
            test_asked=self.test_asked,
        )


@pytest.mark.parametrize(
    ("after", "kind", "detail"),
    [
        pytest.param(AfterTurn(), "Verified", "", id="a passing change is verified"),
        pytest.param(
            AfterTurn(verify_passed=False),
            "Continue",
            "verify failed:\nx",
            id="a failing change continues with verify's output",
        ),
        pytest.param(
            AfterTurn(has_changes=False, idle_turns=1),
            "Continue",
            "Your last turn left the branch identical to the base commit",
            id="a turn that changed nothing continues",
        ),
        pytest.param(
            AfterTurn(has_changes=False, idle_turns=2),
            "Stop",
            "failed/no_changes: 2 turns in a row left the branch identical",
            id="two turns that changed nothing stop",
        ),
        pytest.param(
            AfterTurn(cost=1.0),
            "Stop",
            "failed/budget_exhausted: $1.00 spent of $1.00",
            id="the cost cap stops even a passing change",
        ),
        pytest.param(
            AfterTurn(end="cost_cap"),
            "Stop",
            "failed/budget_exhausted: ",
            id="a turn cut by the cost cap stops",
        ),
        pytest.param(
            AfterTurn(end="stalled"),
            "Stop",
            "stalled/stall_timeout: the model stopped answering",
            id="a stalled model stops",
        ),
        pytest.param(
            AfterTurn(end="cancelled"), "Stop", "cancelled/cancelled: ", id="a cancel stops"
        ),
        pytest.param(
            AfterTurn(end="step_cap", verify_passed=False),
            "Continue",
            "You reached the step limit for one turn. verify failed:\nx",
            id="a step cap is named in the next prompt",
        ),
        pytest.param(
            AfterTurn(end="tool_budget", verify_passed=False),
            "Continue",
            "You used the whole tool-call budget for one turn. verify failed:\nx",
            id="a tool budget is named in the next prompt",
        ),
        pytest.param(
            AfterTurn(end="doom_loop", verify_passed=False),
            "Continue",
            "You repeated the same tool call three times; try something else. verify failed:\nx",
            id="a doom loop is named in the next prompt",
        ),
        pytest.param(
            AfterTurn(end="doom_loop"),
            "Verified",
            "",
            id="a capped turn whose change passes is verified",
        ),
        pytest.param(
            AfterTurn(base_passed=True, test_asked=False),
            "AskForTest",
            "Add a test that captures the issue",
            id="a pass that passed on the base too asks for a test once",
        ),
        pytest.param(
            AfterTurn(base_passed=True, test_asked=True),
            "Verified",
            "",
            id="asked once: verified",
        ),
        pytest.param(
            AfterTurn(base_passed=True, test_asked=False, tests_changed=("test_calc.py",)),
            "Verified",
            "",
            id="a pass with a changed test is verified",
        ),
    ],
)
def test_after_turn(after: AfterTurn, kind: str, detail: str) -> None:
    got_kind, got_detail = stepped(after.decide())
    assert got_kind == kind and detail in got_detail, (got_kind, got_detail)


@pytest.mark.parametrize(
    ("end", "kind", "detail"),
    [
        pytest.param("cancelled", "Stop", "cancelled/cancelled: ", id="cancelled"),
        pytest.param(
            "stalled", "Stop", "stalled/stall_timeout: the model stopped answering", id="stalled"
        ),
        pytest.param("resource_limit", "Stop", "failed/resource_limit: ", id="resource limit"),
        pytest.param("budget_exhausted", "Stop", "failed/budget_exhausted: ", id="budget"),
        pytest.param("finished", "None", "", id="finished goes on to verify"),
        pytest.param("step_cap", "None", "", id="a step cap goes on to verify"),
    ],
)
def test_a_turn_cut_short(end: str, kind: str, detail: str) -> None:
    got_kind, got_detail = stepped(t.cut_short(end))
    assert got_kind == kind and detail in got_detail, (got_kind, got_detail)


# -- starting and restarting ------------------------------------------------------------------


def loop(status: Status, cost_usd: float = 0.0) -> LoopRecord:
    return LoopRecord(repo="a/b", issue=1, installation_id=1, status=status, cost_usd=cost_usd)


SPENT = loop(Status.FAILED, cost_usd=10.0)


@pytest.mark.parametrize(
    ("record", "max_cost_usd", "ok", "why"),
    [
        pytest.param(None, None, True, "", id="no loop yet: start"),
        pytest.param(
            loop(Status.QUEUED),
            None,
            False,
            "a loop is already queued for this issue",
            id="one loop per issue",
        ),
        pytest.param(
            loop(Status.RUNNING), None, False, "already running", id="a running loop is kept"
        ),
        pytest.param(
            loop(Status.COMPLETED),
            None,
            False,
            "this issue's loop already completed",
            id="a completed loop is history",
        ),
        pytest.param(loop(Status.FAILED), None, True, "restarting", id="a failed loop is resumed"),
    ],
)
def test_should_start(
    record: LoopRecord | None, max_cost_usd: float | None, ok: bool, why: str
) -> None:
    assert max_cost_usd is None  # a spent budget is may_start's out_of_budget (test_budget)
    got_ok, got_why = should_start(record)
    assert got_ok is ok and why in got_why, (got_ok, got_why)
    assert bool(got_why) is bool(why)  # no reason given where none is expected


@pytest.mark.parametrize(
    ("record", "lease_alive", "max_cost_usd", "ok", "why"),
    [
        pytest.param(
            loop(Status.COMPLETED),
            False,
            None,
            False,
            "this loop completed; it is history",
            id="a completed loop is history",
        ),
        pytest.param(loop(Status.FAILED), False, None, True, "", id="a failed loop restarts"),
        pytest.param(
            loop(Status.CANCELLED), True, None, True, "", id="a stopped loop restarts whatever"
        ),
        pytest.param(
            loop(Status.RUNNING),
            True,
            None,
            False,
            "this loop is running and its worker is alive",
            id="a running loop with a live worker is kept",
        ),
        pytest.param(
            loop(Status.RUNNING), False, None, True, "", id="a running loop whose worker died"
        ),
    ],
)
def test_can_restart(
    record: LoopRecord, lease_alive: bool, max_cost_usd: float | None, ok: bool, why: str
) -> None:
    assert max_cost_usd is None  # a spent budget is may_start's out_of_budget (test_budget)
    got_ok, got_why = can_restart(record, lease_alive)
    assert got_ok is ok and why in got_why, (got_ok, got_why)
    assert bool(got_why) is bool(why)
