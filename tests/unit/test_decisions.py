"""Pure decisions: loop transitions, the review plan, the merge gate. No I/O."""

from __future__ import annotations

from dataclasses import replace

from bot.core.record import LoopRecord, Reason, Status, can_restart, should_start
from bot.core.rules import turns as t
from bot.core.rules.merge import (
    AlreadyMerged,
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
from bot.core.rules.review import (
    CodeAgain,
    CriticReport,
    Finding,
    MergeNext,
    NeedsHuman,
    StopLoop,
    fingerprint,
    plan_after_review,
    tally,
)

FACTS = Facts(
    issue_open=True,
    pr_open=True,
    pr_merged=False,
    head_sha="b" * 40,
    reviewed_sha="b" * 40,
    open_sev1=0,
    checks="success",
    failing_checks=(),
    mergeable=True,
    require_checks=True,
    fix_turns_used=0,
    max_fix_turns=2,
    waited_seconds=0,
    max_wait_seconds=3600,
    verify_sha="b" * 40,
    base_included=True,
    base_sha="d" * 40,
    verify_passed=True,
    verdict="approve",
    changed_lines=2,
    changed_files=1,
)


def test_gate_merges_only_reviewed_green_open_work() -> None:
    assert decide(FACTS) == Merge("b" * 40)
    assert decide(replace(FACTS, checks="none")) == Merge("b" * 40)
    assert isinstance(decide(replace(FACTS, issue_open=False)), Refuse)
    assert decide(replace(FACTS, issue_open=False)).reason == Reason.ISSUE_CLOSED  # type: ignore[union-attr]
    assert isinstance(decide(replace(FACTS, pr_open=False)), Refuse)
    assert isinstance(decide(replace(FACTS, open_sev1=1)), Refuse)
    assert isinstance(decide(replace(FACTS, head_sha="c" * 40)), Review)
    assert isinstance(decide(replace(FACTS, reviewed_sha="")), Review)
    assert isinstance(decide(replace(FACTS, checks="pending")), Wait)
    assert isinstance(decide(replace(FACTS, checks="pending", waited_seconds=4000)), Refuse)
    assert decide(replace(FACTS, checks="failure", failing_checks=("ci",))) == FixChecks(("ci",))
    assert isinstance(decide(replace(FACTS, checks="failure", fix_turns_used=2)), Refuse)
    assert decide(replace(FACTS, mergeable=False)) == FixConflicts()
    assert isinstance(decide(replace(FACTS, mergeable=False, fix_turns_used=2)), Refuse)
    assert isinstance(decide(replace(FACTS, mergeable=None)), Wait)
    assert decide(replace(FACTS, checks="failure", require_checks=False)) == Merge("b" * 40)
    assert decide(replace(FACTS, pr_merged=True, issue_open=False)) == AlreadyMerged()


def test_changes_to_protected_paths_are_never_merged() -> None:
    patterns = (".github/**", "*.lock", "scripts/verify.sh")
    paths = [".github/workflows/ci.yml", "src/app.py", "poetry.lock", "scripts/verify.sh"]
    hits = protected_changes(paths, patterns)
    assert hits == (".github/workflows/ci.yml", "poetry.lock", "scripts/verify.sh")
    assert protected_changes(["src/.github.py", "github/x"], patterns) == ()
    refused = decide(replace(FACTS, protected_changes=hits))
    assert isinstance(refused, Refuse) and refused.reason == Reason.NEEDS_HUMAN
    assert "`.github/workflows/ci.yml`" in refused.why
    # The head moving still comes first: the files were read for a head nobody reviewed.
    moved = replace(FACTS, protected_changes=hits, head_sha="c" * 40)
    assert isinstance(decide(moved), Review)
    assert decide(replace(FACTS, protected_changes=())) == Merge("b" * 40)


def test_closed_issue_wins_over_everything_else() -> None:
    bad = replace(FACTS, issue_open=False, head_sha="c" * 40, checks="failure", open_sev1=2)
    assert decide(bad).reason == Reason.ISSUE_CLOSED  # type: ignore[union-attr]


def test_checks_summary_ignores_loopbots_own_runs() -> None:
    assert summarize_checks([("loopbot", "in_progress", None)], []) == ("none", ())
    assert summarize_checks([("ci", "completed", "success")], [("lint", "pending")])[0] == "pending"
    assert summarize_checks([("ci", "completed", "failure")], [("lint", "error")]) == (
        "failure",
        ("ci", "lint"),
    )
    assert summarize_checks([("ci", "completed", "skipped")], [])[0] == "success"


def test_required_checks_count_alone_and_missing_ones_are_pending() -> None:
    required = frozenset({"ci/test", "deploy-preview", "loopbot/critic"})
    runs = [("ci/test", "completed", "success"), ("lint", "completed", "failure")]
    # deploy-preview has not reported: GitHub would say "expected", so the gate waits.
    assert summarize_checks(runs, [], required) == ("pending", ())
    # Once it has, a failing check that is not required does not hold the merge.
    assert summarize_checks(runs, [("deploy-preview", "success")], required) == ("success", ())
    assert summarize_checks(runs, [("deploy-preview", "error")], required) == (
        "failure",
        ("deploy-preview",),
    )
    # Nothing has reported yet: pending, not "none" (which would let the gate merge).
    assert summarize_checks([], [], frozenset({"ci/test"})) == ("pending", ())
    # Requiring only loopbot's own check is requiring nothing the gate waits for.
    assert summarize_checks([], [], frozenset({"loopbot/critic"})) == ("none", ())


def f(sev: str) -> Finding:
    return Finding(severity=sev, category="correctness", path="a.py", line=1, title="t", body="b")  # type: ignore[arg-type]


def test_a_sev1_raised_in_three_rounds_goes_to_a_human() -> None:
    kw = {"diff_lines": 10, "max_rounds": 10, "large_diff_lines": 400}
    sev1 = CriticReport(verdict="request_changes", summary="no", findings=[f("sev1")])
    seen = tally({}, sev1)
    assert seen == {"a.py|t": 1}
    assert isinstance(plan_after_review(sev1, round_=2, seen=seen, **kw), CodeAgain)  # type: ignore[arg-type]
    seen = tally(seen, sev1)
    plan = plan_after_review(sev1, round_=3, seen=seen, **kw)  # type: ignore[arg-type]
    assert isinstance(plan, NeedsHuman) and "raised in 3 review rounds" in plan.why
    # Case and punctuation fold; other words do not, and a sev2 is never counted.
    same = Finding(severity="sev1", category="tests", path="a.py", title="T!", body="b")
    other = Finding(severity="sev1", category="tests", path="a.py", title="u", body="b")
    assert fingerprint(same) == fingerprint(f("sev1")) != fingerprint(other)
    assert tally({}, CriticReport(verdict="approve", summary="", findings=[f("sev2")])) == {}


def test_a_diff_the_critic_could_not_read_whole_is_never_merged() -> None:
    kw = {"diff_lines": 9000, "round_": 1, "max_rounds": 3, "large_diff_lines": 400}
    approve = CriticReport(verdict="approve", summary="ok", findings=[f("sev3")])
    assert isinstance(plan_after_review(approve, **kw), MergeNext)  # type: ignore[arg-type]
    plan = plan_after_review(approve, unread_chars=12_345, **kw)  # type: ignore[arg-type]
    assert isinstance(plan, NeedsHuman) and "12,345 characters were not reviewed" in plan.why
    # A blocking finding in the part it read still goes back to coding first.
    sev1 = CriticReport(verdict="request_changes", summary="no", findings=[f("sev1")])
    assert isinstance(plan_after_review(sev1, unread_chars=1, **kw), CodeAgain)  # type: ignore[arg-type]


def test_review_plan() -> None:
    kw = {"diff_lines": 10, "round_": 1, "max_rounds": 3, "large_diff_lines": 400}
    assert plan_after_review(CriticReport(verdict="approve", summary="ok"), **kw) == MergeNext()  # type: ignore[arg-type]
    sev1 = CriticReport(verdict="request_changes", summary="no", findings=[f("sev1"), f("sev3")])
    plan = plan_after_review(sev1, **kw)  # type: ignore[arg-type]
    assert isinstance(plan, CodeAgain) and len(plan.findings) == 1
    last = plan_after_review(sev1, **{**kw, "round_": 3})  # type: ignore[arg-type]
    assert isinstance(last, StopLoop) and last.reason == Reason.CRITIC_ROUNDS
    big = plan_after_review(
        CriticReport(verdict="approve", summary="ok"), **{**kw, "diff_lines": 900}
    )  # type: ignore[arg-type]
    assert isinstance(big, NeedsHuman)
    err = plan_after_review(CriticReport(verdict="error", summary="bad"), **kw)  # type: ignore[arg-type]
    assert isinstance(err, StopLoop) and err.reason == Reason.CRITIC_ERROR
    minor = CriticReport(verdict="approve", summary="ok", findings=[f("sev2")])
    assert plan_after_review(minor, **{**kw, "diff_lines": 900}) == MergeNext()  # type: ignore[arg-type]


def test_turn_transitions() -> None:
    go = {"turn": 0, "max_turns": 3, "issue_open": True, "has_label": True, "cancel": None}
    assert t.before_turn(**go) == t.RunTurn(1)  # type: ignore[arg-type]
    assert t.before_turn(**{**go, "turn": 3}) == t.Stop(
        Status.FAILED, Reason.MAX_TURNS, "3 turns without passing verify"
    )  # type: ignore[arg-type]
    assert t.before_turn(**{**go, "issue_open": False}).reason == Reason.ISSUE_INACTIVE  # type: ignore[arg-type,union-attr]
    assert t.before_turn(**{**go, "has_label": False}).reason == Reason.ISSUE_INACTIVE  # type: ignore[arg-type,union-attr]
    assert t.before_turn(**{**go, "cancel": "cancelled"}).reason == Reason.CANCELLED  # type: ignore[arg-type,union-attr]
    after = {
        "end": "finished",
        "verify_passed": True,
        "has_changes": True,
        "cost": 0.1,
        "max_cost": 1.0,
        "verify_tail": "x",
    }
    assert t.after_turn(**after) == t.Verified()  # type: ignore[arg-type]
    assert isinstance(t.after_turn(**{**after, "verify_passed": False}), t.Continue)  # type: ignore[arg-type]
    assert isinstance(t.after_turn(**{**after, "has_changes": False}), t.Continue)  # type: ignore[arg-type]
    assert t.after_turn(**{**after, "cost": 1.0}).reason == Reason.BUDGET  # type: ignore[arg-type,union-attr]
    assert t.after_turn(**{**after, "end": "stalled"}).status == Status.STALLED  # type: ignore[arg-type,union-attr]
    capped = t.after_turn(**{**after, "end": "doom_loop", "verify_passed": False})  # type: ignore[arg-type]
    assert isinstance(capped, t.Continue) and "same tool call" in capped.failure


def test_start_and_restart_rules() -> None:
    r = LoopRecord(repo="a/b", issue=1, installation_id=1)
    assert should_start(None) == (True, "")
    assert should_start(r)[0] is False  # queued: one loop per issue
    assert can_restart(r.model_copy(update={"status": Status.COMPLETED}), False)[0] is False
    assert can_restart(r.model_copy(update={"status": Status.FAILED}), False)[0] is True
    assert can_restart(r.model_copy(update={"status": Status.RUNNING}), True)[0] is False
    assert can_restart(r.model_copy(update={"status": Status.RUNNING}), False)[0] is True
    spent = r.model_copy(update={"status": Status.FAILED, "cost_usd": 10.0})
    ok, why = can_restart(spent, False, max_cost_usd=10.0)
    assert not ok and "$10.00 of its $10.00 budget" in why
    assert can_restart(spent, False, max_cost_usd=25.0) == (True, "")
    assert should_start(spent, max_cost_usd=10.0)[0] is False
    assert should_start(spent, max_cost_usd=25.0) == (True, "restarting")
