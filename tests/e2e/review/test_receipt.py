"""The merge receipt, gates that never fail open, and the scope guard.

Unit tests for the pure decision and the renderer, then end to end: a real RQ worker,
real git, the local GitHub and Anthropic servers.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Reason, Status
from bot.core.rules.pull.merge import (
    Merge,
    Refuse,
    Wait,
    classify_checks,
    decide,
    fold_checks,
    summarize_checks,
)
from bot.core.text import receipt
from bot.io.github import failures
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.review import gate as merge_gate
from tests.conftest import Web
from tests.e2e.review.test_review_merge import (
    FIX,
    KEY,
    YML,
    ci_status,
    is_critic,
    main_log,
    record,
    report,
)
from tests.helpers import HEAD, REPO, label, merge_facts, open_issue, sample_repo

FACTS = merge_facts()  # the gate merges HEAD on these


# -- the pure decision ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runs", "statuses", "named"),
    [
        ([("ci/test", "completed", "stale")], [], "`completed/stale`"),
        ([("ci/test", "completed", "startup_failure")], [], "`completed/startup_failure`"),
        ([("ci/test", "completed", None)], [], "`completed/None`"),  # conclusion missing
        ([("ci/test", "paused_for_reasons", None)], [], "`paused_for_reasons`"),  # new status
        ([], [("ci/test", "expected")], "`expected`"),
        ([], [("ci/test", "None")], "`None`"),  # a status without a state
    ],
)
def test_a_check_state_outside_the_allowlist_refuses_naming_it(
    runs: list[tuple[str, str, str | None]], statuses: list[tuple[str, str]], named: str
) -> None:
    results = classify_checks(runs, statuses, frozenset({"ci/test"}))
    state, names = fold_checks(results)
    assert state == "unknown" and len(names) == 1
    assert "`ci/test`" in names[0] and named in names[0]
    decision = decide(replace(FACTS, checks=state, failing_checks=names, check_results=results))
    assert isinstance(decision, Refuse) and decision.reason == Reason.NEEDS_HUMAN
    assert "`ci/test`" in decision.why and named in decision.why
    # Even when waiting would otherwise be the answer, or a fix turn is left.
    assert isinstance(decide(replace(FACTS, checks=state, failing_checks=names)), Refuse)


def test_unknown_outranks_failure_and_known_states_keep_their_meaning() -> None:
    runs = [("lint", "completed", "failure"), ("ci", "completed", "stale")]
    assert summarize_checks(runs, [])[0] == "unknown"
    assert summarize_checks([("ci", "waiting", None)], [])[0] == "pending"
    assert summarize_checks([("ci", "requested", None)], [])[0] == "pending"
    for failed in ("failure", "timed_out", "cancelled", "action_required"):
        assert summarize_checks([("ci", "completed", failed)], []) == ("failure", ("ci",))
    for passed in ("success", "neutral", "skipped"):
        assert summarize_checks([("ci", "completed", passed)], []) == ("success", ())
    # A check that is not required is not read at all, however odd its state.
    odd = [("ci/test", "completed", "success"), ("nightly", "completed", "stale")]
    assert summarize_checks(odd, [], frozenset({"ci/test"})) == ("success", ())


def test_evidence_on_another_sha_or_none_is_not_established() -> None:
    assert decide(FACTS) == Merge(HEAD)
    cases = {
        "no verify run is recorded": replace(FACTS, verify_sha=""),
        "verify last ran on cccccccccc, not on the head": replace(FACTS, verify_sha="c" * 40),
        "verify failed on the head": replace(FACTS, verify_passed=False),
        "verdict on bbbbbbbbbb is not recorded": replace(FACTS, verdict=""),
        "`request_changes`, not approve": replace(FACTS, verdict="request_changes"),
        "size of the change could not be established": replace(FACTS, changed_lines=None),
    }
    for why, facts in cases.items():
        decision = decide(facts)
        assert isinstance(decision, Refuse) and why in decision.why, (why, decision)
        assert decision.reason == Reason.NEEDS_HUMAN
    # The head moving still comes first: re-review, not refuse.
    assert not isinstance(decide(replace(FACTS, verify_sha="", reviewed_sha="c" * 40)), Refuse)


def test_scope_guard_names_the_numbers_and_suggests_splitting() -> None:
    at_limit = replace(FACTS, changed_lines=1000, changed_files=100)
    assert decide(at_limit) == Merge(HEAD)
    lines = decide(replace(FACTS, changed_lines=1001))
    assert isinstance(lines, Refuse) and lines.reason == Reason.NEEDS_HUMAN
    assert "1001 changed lines (limit 1000)" in lines.why and "split the issue" in lines.why
    files = decide(replace(FACTS, changed_files=7, max_changed_files=5))
    assert isinstance(files, Refuse) and "7 changed files (limit 5)" in files.why
    both = decide(replace(FACTS, changed_lines=9, max_changed_lines=8, changed_files=2000))
    assert isinstance(both, Refuse)
    assert "9 changed lines (limit 8) and 2000 changed files (limit 100)" in both.why


def test_the_receipt_passes_exactly_when_the_gate_merges() -> None:
    pending = classify_checks([("ci/test", "in_progress", None)], [], frozenset({"ci/test"}))
    stale = classify_checks([("ci/test", "completed", "stale")], [], frozenset({"ci/test"}))
    variants = [
        FACTS,
        replace(FACTS, issue_open=False),
        replace(FACTS, ready_label=False),
        replace(FACTS, pr_open=False),
        replace(FACTS, open_sev1=1, open_findings=(("F1", "sev1", "wrong sign"),)),
        replace(FACTS, open_findings=(("F2", "sev2", "naming"),)),
        replace(FACTS, verify_sha="c" * 40),
        replace(FACTS, verify_passed=False),
        replace(FACTS, verdict="comment"),
        replace(FACTS, tests_changed_to_pass="the tests were changed to pass: x"),
        replace(FACTS, held_out=("held-out verify: `v` on the head: passed",)),
        replace(FACTS, tests_dismissed_by="@writer", held_out=("held-out verify: failed",)),
        replace(FACTS, protected_changes=(".github/workflows/ci.yml",)),
        replace(FACTS, changed_lines=5000),
        replace(FACTS, changed_files=None),
        replace(FACTS, checks="pending", check_results=pending),
        replace(FACTS, checks="unknown", failing_checks=("x",), check_results=stale),
        replace(FACTS, require_checks=False, checks="unknown", check_results=()),
        replace(FACTS, checks="none", check_results=()),
        replace(FACTS, mergeable=None),
        replace(FACTS, mergeable=False, fix_turns_used=2),
        replace(FACTS, base_included=None),
        replace(FACTS, base_included=False),
        replace(FACTS, base_included=False, fix_turns_used=2),
    ]
    for facts in variants:
        table = receipt.rows(facts, ready_label="loop:ready")
        merges = isinstance(decide(facts), Merge)
        assert merges == (not receipt.unmet(table)), (facts, receipt.unmet(table))
    assert isinstance(decide(replace(FACTS, mergeable=None)), Wait)


def test_the_receipt_renders_every_condition_and_adds_the_merge_commit_once() -> None:
    facts = replace(
        FACTS,
        check_results=classify_checks(
            [("ci|test", "completed", "success")], [("lint", "success")], None
        ),
        open_findings=(("F2", "sev2", "rename x"), ("F3", "sev3", "typo")),
    )
    table = receipt.rows(facts, ready_label="loop:ready")
    conditions = [r.condition for r in table]
    assert conditions == [
        "issue open",
        "ready label present",
        "pull request open",
        "reviewed sha = head",
        "verify passed on head",
        "tests as approved",
        "critic verdict approve",
        "no open sev1 finding",
        "open sev2/sev3 findings",
        "check `ci|test`",
        "check `lint`",
        "protected paths untouched",
        "within scope",
        "head contains the default branch",
        "mergeable",
    ]
    assert all(r.sha == HEAD for r in table)
    text = receipt.render(table, head=HEAD, outcome=f"Merging {HEAD} now.")
    lines = text.splitlines()
    assert lines[3] == "| condition | sha | result | detail |"
    # The head is named once, above the table; its rows say "head".
    assert f"checked on the head `{HEAD}`" in lines[1] and text.count(HEAD) == 2
    assert "| verify passed on head | head | ✅ pass | passed |" in lines
    assert "| check `ci\\|test` |" in text  # a pipe would end the cell
    assert "F2 sev2: rename x; F3 sev3: typo" in text
    assert "40 of 1000 lines, 3 of 100 files" in text
    posted = text + "\n\n<!-- loopbot:receipt -->"
    done = receipt.merged(posted, "d" * 40)
    assert done is not None
    assert f"| merge commit | `{'d' * 40}` | ✅ pass | squash-merged |" in done
    assert done.endswith(f"Merged as `{'d' * 40}`.") and "Merging" not in done
    assert done.count("| mergeable |") == 1
    assert receipt.merged(done, "d" * 40) is None  # already there
    assert receipt.merged("🛑 loopbot did not merge", "d" * 40) is None  # not a receipt


# -- end to end -------------------------------------------------------------------------------


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same retries, without their pauses."""
    monkeypatch.setattr(failures, "_backoff", lambda attempt: 0.0)
    monkeypatch.setattr(merge_gate, "ERROR_BACKOFF", (0.0,))


def receipt_body(github: GitHubServer, pr: int) -> str | None:
    """The gate's receipt for pull request ``pr``: a comment on it (a refusal's, a merge
    queue's), or, for a merge, the section of the status comment on the issue the pull
    request closes (one write where two said the same, issue 43)."""
    repo = github.repo(REPO)
    found = [
        c["body"]
        for c in repo.comments.values()
        if c["_issue"] == pr and "<!-- loopbot:receipt -->" in c["body"]
    ]
    closes = re.match(r"Closes #(\d+)", repo.issues[pr].body or "")
    if closes:
        found += [
            RECEIPT_HEAD + c["body"].split(RECEIPT_HEAD, 1)[1]
            for c in repo.comments.values()
            if c["_issue"] == int(closes.group(1)) and RECEIPT_HEAD in c["body"]
        ]
    assert len(found) <= 1, found  # one receipt, updated in place
    return found[0] if found else None


RECEIPT_HEAD = "### 🧾 loopbot merge receipt"


def row(body: str, condition: str) -> list[str]:
    """The cells of the receipt row for ``condition``."""
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if line.startswith("| ") and cells[0] == condition:
            return cells
    raise AssertionError(f"no row {condition!r} in\n{body}")


def start(github: GitHubServer, yml: str = YML, required: list[str] | None = None) -> None:
    sample_repo(github, loop_yml=yml)
    if required:
        github.require_checks(REPO, "main", required)
    label(github, "writer", open_issue(github))


def test_merge_receipt_lists_every_condition_on_the_merged_head_then_the_merge_commit(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    turns: list[str] = []

    def stubborn_then_fixes(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            sha = github.ref(REPO, "loop/issue-1")
            ci_status(github, sha, "success", "ci/test")  # CI reports before the gate reads
            return report(
                findings=[
                    {
                        "severity": "sev3",
                        "category": "docs",
                        "path": "calc.py",
                        "line": 2,
                        "title": "say why",
                        "body": "a comment would help",
                    }
                ]
            )
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return m.text("Fixed add.")
        turns.append("turn")
        if len(turns) == 1:  # the first turn claims success and changes nothing
            return m.text("The code looks correct to me; nothing to change.")
        return FIX

    model.responder = stubborn_then_fixes
    start(github, required=["ci/test"])
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    pull = github.repo(REPO).pulls[r.pr_number]
    head, merge = pull.closed_head_sha, pull.merge_commit_sha
    assert head and merge and merge == gitrepo.resolve(github.repo(REPO).path, "refs/heads/main")
    body = receipt_body(github, r.pr_number)
    # Shown in the status comment's last edit, not posted as a comment of its own.
    assert body is not None and r.receipt_comment_id is None
    assert RECEIPT_HEAD in github.repo(REPO).comments[r.status_comment_id]["body"]
    for condition, detail in [
        ("issue open", "open"),
        ("ready label present", "`loop:ready` present"),
        ("pull request open", "open"),
        ("reviewed sha = head", "the critic reviewed this head"),
        ("verify passed on head", "passed"),
        ("critic verdict approve", "`approve`"),
        ("no open sev1 finding", "none open"),
        ("check `ci/test`", "commit status: `success`"),
        ("protected paths untouched", "none changed"),
        ("within scope", "2 of 1000 lines, 1 of 100 files"),
        ("mergeable", "no conflicts with the base"),
    ]:
        assert row(body, condition) == [condition, "head", "✅ pass", detail]
    contains = row(body, "head contains the default branch")
    assert contains[:3] == ["head contains the default branch", "head", "✅ pass"], contains
    assert row(body, "merge commit") == ["merge commit", f"`{merge}`", "✅ pass", "squash-merged"]
    done = [line for line in body.splitlines() if line.startswith("Merged as")]
    assert len(done) == 1 and done[0].startswith(f"Merged as `{merge}`. Loop total: $"), done
    assert r.merge_sha == merge and r.last_verify.get("sha", head) == head


@pytest.mark.parametrize("kind", ["check run", "commit status"])
def test_a_required_check_in_an_unknown_state_is_refused_naming_it(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any, kind: str
) -> None:
    def ci_goes_odd(body: dict[str, Any]) -> m.Item:
        sha = github.ref(REPO, "loop/issue-1")
        with github.as_user("acme") as u:
            if kind == "check run":
                run = {"name": "ci/test", "head_sha": sha, "status": "completed"}
                u.post(f"/repos/{REPO}/check-runs", json=run | {"conclusion": "stale"})
            else:
                u.post(
                    f"/repos/{REPO}/statuses/{sha}", json={"state": "skipped", "context": "ci/test"}
                )
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = ci_goes_odd
    start(github, required=["ci/test"])
    drain()
    r = record(redis)
    state = "`completed/stale`" if kind == "check run" else "`skipped`"
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "`ci/test`" in r.detail and state in r.detail, r.detail
    assert len(main_log(github)) == 1 and not github.repo(REPO).pulls[r.pr_number].merged
    assert "loop:needs-human" in github.repo(REPO).issues[1].labels
    body = receipt_body(github, r.pr_number)
    assert body is not None
    assert row(body, "check `ci/test`")[2:] == ["❓ unknown", f"{kind}: {state}"]
    assert "Not merged: loopbot cannot tell whether these required checks passed" in body
    assert "merge commit" not in body


def test_a_change_over_max_changed_lines_asks_a_person_with_the_numbers(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed."), report())
    start(github, YML + "limits:\n  max_changed_lines: 1\n")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "2 changed lines (limit 1)" in r.detail and "split the issue" in r.detail
    assert len(main_log(github)) == 1
    issue = github.repo(REPO).issues[1]
    assert issue.state == "open" and "loop:needs-human" in issue.labels
    on_issue = [c["body"] for c in github.repo(REPO).comments.values() if c["_issue"] == 1]
    assert any("2 changed lines (limit 1)" in b for b in on_issue)
    body = receipt_body(github, r.pr_number)
    assert body is not None
    assert row(body, "within scope")[2:] == ["❌ fail", "2 of 1 lines, 1 of 100 files"]


@pytest.mark.usefixtures("no_waiting")
def test_github_failing_while_checks_are_read_never_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The commit statuses on the head: read by the gate alone, so the critic is unharmed.
    fault = github.inject("GET", r"/commits/[^/]+/status$", 502, times=1000)
    model.play(FIX, m.text("Fixed."), report())
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.FAILED, "gate_error"), r
    assert fault.hits == failures.MAX_ATTEMPTS * merge_gate.ERROR_ATTEMPTS
    assert len(main_log(github)) == 1
    assert receipt_body(github, r.pr_number) is None  # no condition was established
    kinds = [e["kind"] for e in Store(redis).events(KEY)]
    assert kinds.count("gate_error") == merge_gate.ERROR_ATTEMPTS and "merged" not in kinds


def test_a_status_missing_its_state_is_unknown_never_green(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # GitHub answers 200, but the status has no state: not one the gate can read.
    github.inject(
        "GET",
        r"/commits/[^/]+/status$",
        200,
        times=1000,
        body={"state": "success", "statuses": [{"context": "ci/test"}]},
    )
    model.play(FIX, m.text("Fixed."), report())
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "`ci/test` (commit status state `None`)" in r.detail, r.detail
    assert len(main_log(github)) == 1


@pytest.mark.usefixtures("no_waiting")
def test_one_failed_read_of_the_checks_is_retried_and_then_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    github.inject("GET", r"/commits/[^/]+/status$", 502, times=failures.MAX_ATTEMPTS)
    model.play(FIX, m.text("Fixed."), report())
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    kinds = [e["kind"] for e in Store(redis).events(KEY)]
    assert kinds.count("gate_error") == 1
    body = receipt_body(github, r.pr_number)
    assert body is not None and "merge commit" in body


def test_a_default_branch_that_moved_since_verify_is_merged_in_and_verified_again() -> None:
    """Red team: someone merged to main while the critic reviewed; the squash would have
    landed a combination nobody verified."""
    from bot.core.rules.pull.merge import FixConflicts

    decision = decide(replace(FACTS, base_included=False))
    assert isinstance(decision, FixConflicts) and "moved" in decision.why
    spent = decide(replace(FACTS, base_included=False, fix_turns_used=2))
    assert isinstance(spent, Refuse) and spent.reason.value == "not_mergeable"
    unknown = decide(replace(FACTS, base_included=None))
    assert isinstance(unknown, Refuse) and "cannot tell" in unknown.why


def test_a_default_branch_that_moves_during_review_is_never_merged_unverified(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Red team: while the critic reviewed, someone pushed to main a test that the fix
    breaks (no textual conflict). The gate used to squash-merge a combination nobody
    had verified; now the loop merges main in and verifies again, and it fails."""
    import subprocess
    import tempfile

    def push_main() -> None:
        d = tempfile.mkdtemp()

        def run(*a: str) -> None:
            subprocess.run(a, cwd=d, check=True, capture_output=True)

        run("git", "clone", "-q", str(github.repo(REPO).path), ".")
        Path(d, "mathx.py").write_text(
            "from calc import add\n\ndef double(x):\n    return add(x, x)\n"
        )
        Path(d, "test_double.py").write_text(
            "import unittest\nfrom mathx import double\n\n"
            "class D(unittest.TestCase):\n    def test_double(self):\n"
            "        self.assertEqual(double(2), 0)\n"
        )
        run("git", "add", "-A")
        run("git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "elsewhere")
        run("git", "push", "-q", "origin", "HEAD:main")

    agent = [FIX, m.text("Fixed.")]
    pushed: list[bool] = []

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            if not pushed:
                push_main()
                pushed.append(True)
            return m.structured({"verdict": "approve", "summary": "ok", "findings": []})
        return agent.pop(0) if agent else m.text("Done.")

    model.responder = play
    sample_repo(github, loop_yml="verify: python3 -m unittest -q\nmax_turns: 3\n")
    label(github, "writer", open_issue(github))
    drain()
    r = Store(redis).get(f"{REPO}#1")
    assert r is not None and r.status != Status.COMPLETED, r
    path = github.repo(REPO).path
    assert "a - b" in gitrepo.git(path, "show", "main:calc.py")  # the fix never merged
    moved = [e["data"] for e in Store(redis).events(r.key) if e["kind"] == "conflicts"]
    assert moved and "moved" in moved[0]["why"], moved
