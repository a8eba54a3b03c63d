"""The merge receipt: every condition the gate checked, on the exact sha, as one table.

Pure: built from the same ``Facts`` that ``bot.core.rules.pull.merge.decide`` decided on,
so the receipt shows what the decision was made from, not a second reading of GitHub. The
gate posts it on the pull request just before merging (or when it refuses), and adds the
merge commit after the merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bot.core.rules.pull.merge import Facts, reviewed_head, scope_problem
from bot.core.text.defuse import code_span

Result = Literal["pass", "fail", "pending", "unknown", "info"]
COMMENT_KEY = "receipt"

_SHOWN: dict[Result, str] = {
    "pass": "✅ pass",
    "fail": "❌ fail",
    "pending": "⏳ pending",
    "unknown": "❓ unknown",
    "info": "📝 info",
}


@dataclass(frozen=True)
class Row:
    condition: str
    sha: str  # the commit the condition was established on; "" when none
    result: Result
    detail: str


def rows(f: Facts, *, ready_label: str) -> list[Row]:
    """One row per condition, in the order the gate weighs them."""
    head = f.head_sha
    out = [
        Row("issue open", head, _ok(f.issue_open), "open" if f.issue_open else "closed"),
        Row(
            "ready label present",
            head,
            _ok(f.ready_label),
            f"{code_span(ready_label)} " + ("present" if f.ready_label else "removed"),
        ),
        Row("pull request open", head, _ok(f.pr_open), "open" if f.pr_open else "closed"),
        Row(
            "reviewed sha = head",
            f.reviewed_sha,
            _ok(reviewed_head(f)),
            "the critic reviewed this head"
            if f.reviewed_sha == head
            # post_action: one commit of loopbot's own after the clean review, not reviewed
            else f"the critic reviewed {_short(f.reviewed_sha)}; the head {_short(head)} adds "
            "only loopbot's post-action commit (not reviewed again)"
            if reviewed_head(f)
            else f"head is {_short(head)}, reviewed {_short(f.reviewed_sha) or 'nothing'}",
        ),
        _verify_row(f),
        _held_out_row(f),
        _verdict_row(f),
        *_finding_rows(f),
        *_check_rows(f),
        Row(
            "protected paths untouched",
            head,
            _ok(not f.protected_changes),
            "none changed"
            if not f.protected_changes
            else "changed: " + ", ".join(code_span(p) for p in f.protected_changes[:5]),
        ),
        _scope_row(f),
        Row(
            "head contains the default branch",
            head,
            "info",
            "a merge queue takes it: the queue runs the required checks on it merged with "
            "the default branch as it is when its turn comes",
        )
        if f.merge_queue and not f.base_included
        else Row(
            "head contains the default branch",
            head,
            "unknown" if f.base_included is None else _ok(f.base_included),
            f"it contains {code_span(_short(f.base_sha))}: verify's result holds for the merge"
            if f.base_included
            else f"the default branch moved to {code_span(_short(f.base_sha))} since verify"
            if f.base_included is False
            else "not established",
        ),
        _mergeable_row(f),
    ]
    return out


def unmet(table: list[Row]) -> list[Row]:
    """The rows that do not pass: empty when every condition for a merge holds."""
    return [r for r in table if r.result not in ("pass", "info")]


def render(table: list[Row], *, head: str, outcome: str) -> str:
    """The comment: the table, then what the gate is doing about it."""
    lines = [
        "### 🧾 loopbot merge receipt",
        f"Every condition the merge gate checked on the head {code_span(head)}.",
        "",
        "| condition | sha | result | detail |",
        "| --- | --- | --- | --- |",
    ]
    lines += [_line(r, head) for r in table]
    lines += ["", _cell(outcome)]
    return "\n".join(lines)


def refused(body: str, why: str) -> str:
    """``body`` (a receipt held for a merge) with GitHub's refusal of the merge in place
    of what the gate was doing."""
    lines = body.split("<!-- loopbot:")[0].rstrip().splitlines()
    rows_at = [i for i, line in enumerate(lines) if line.startswith("| ")]
    kept = lines[: rows_at[-1] + 1] if rows_at else lines
    return "\n".join([*kept, "", _cell(f"Not merged: GitHub refused the merge: {why}")])


def merged(body: str, merge_sha: str, total: str = "") -> str | None:
    """``body`` (a posted receipt) with the merge commit added; None when it has it already
    or is not a receipt. Works from the posted text, so a gate run that finds the pull
    request merged (the merge's answer was lost) completes the receipt all the same."""
    text = body.split("<!-- loopbot:")[0].rstrip()  # the marker ``upsert_comment`` adds
    lines = text.splitlines()
    rows_at = [i for i, line in enumerate(lines) if line.startswith("| ")]
    if not rows_at or merge_sha in text:
        return None
    row = _line(Row("merge commit", merge_sha, "pass", "squash-merged"))
    done = f"Merged as {code_span(merge_sha)}." + (f" {_cell(total)}." if total else "")
    return "\n".join([*lines[: rows_at[-1] + 1], row, "", done])


def _line(r: Row, head: str = "") -> str:
    # The head is named once, above the table; a row on another commit names it.
    sha = "head" if head and r.sha == head else code_span(r.sha) if r.sha else "—"
    return f"| {_cell(r.condition)} | {sha} | {_SHOWN[r.result]} | {_cell(r.detail)} |"


def _ok(value: bool) -> Result:
    return "pass" if value else "fail"


def _short(sha: str) -> str:
    return sha[:10]


def _cell(text: str) -> str:
    # A table cell is one line, and a bare pipe ends it, even inside a code span.
    return " ".join(text.split()).replace("|", "\\|")


def _verify_row(f: Facts) -> Row:
    if not f.verify_sha:
        return Row("verify passed on head", "", "unknown", "no verify run is recorded")
    if f.verify_sha != f.head_sha:
        return Row(
            "verify passed on head",
            f.verify_sha,
            "unknown",
            f"verify ran on {_short(f.verify_sha)}, not on the head {_short(f.head_sha)}",
        )
    return Row(
        "verify passed on head",
        f.verify_sha,
        _ok(f.verify_passed),
        "passed" if f.verify_passed else "failed",
    )


def _held_out_row(f: Facts) -> Row:
    """Whether verify passes with the tests as the writer approved them."""
    name = "tests as approved"
    if f.tests_changed_to_pass:
        return Row(name, f.head_sha, "fail", f.tests_changed_to_pass)
    said = "; ".join(f.held_out)
    if f.tests_dismissed_by:
        return Row(
            name,
            f.head_sha,
            "pass",
            f"the tests were changed to pass; {f.tests_dismissed_by} dismissed loopbot's "
            f"finding{': ' + said if said else ''}",
        )
    ran = any(line.startswith("held-out verify:") for line in f.held_out)
    return Row(name, f.head_sha, "pass" if ran else "info", said or "no test file changed")


def _verdict_row(f: Facts) -> Row:
    if not f.verdict:
        return Row("critic verdict approve", f.head_sha, "unknown", "no verdict on this head")
    if f.verdict != "approve" and f.dismissed_by and f.verdict != "error":
        return Row(
            "critic verdict approve",
            f.head_sha,
            "pass",
            f"{code_span(f.verdict)}; its sev1 finding(s) dismissed by {f.dismissed_by}",
        )
    return Row(
        "critic verdict approve", f.head_sha, _ok(f.verdict == "approve"), code_span(f.verdict)
    )


def _finding_rows(f: Facts) -> list[Row]:
    def shown(items: list[tuple[str, str, str]]) -> str:
        return "; ".join(f"{i} {s}: {t}" for i, s, t in items[:10]) + (
            f"; and {len(items) - 10} more" if len(items) > 10 else ""
        )

    blocking = [x for x in f.open_findings if x[1] == "sev1"]
    others = [x for x in f.open_findings if x[1] != "sev1"]
    sev1 = Row(
        "no open sev1 finding",
        f.head_sha,
        _ok(not f.open_sev1),
        "none open" if not f.open_sev1 else shown(blocking) or f"{f.open_sev1} open",
    )
    if not others:
        return [sev1]
    return [sev1, Row("open sev2/sev3 findings", f.head_sha, "info", shown(others))]


def _check_rows(f: Facts) -> list[Row]:
    if not f.require_checks:
        return [
            Row(
                "required checks",
                f.head_sha,
                "info",
                "not considered (`merge.require_checks: false`)",
            )
        ]
    if not f.check_results:
        return [Row("required checks", f.head_sha, "pass", "none required and none reported")]
    return [
        Row(
            f"check {code_span(c.name)}",
            f.head_sha,
            c.outcome,
            f"{c.kind}: {code_span(c.state)}",
        )
        for c in f.check_results
    ]


def _scope_row(f: Facts) -> Row:
    if f.changed_lines is None or f.changed_files is None:
        return Row("within scope", f.head_sha, "unknown", "the size of the change is unknown")
    detail = (
        f"{f.changed_lines} of {f.max_changed_lines} lines, "
        f"{f.changed_files} of {f.max_changed_files} files"
    )
    return Row("within scope", f.head_sha, _ok(scope_problem(f) is None), detail)


def _mergeable_row(f: Facts) -> Row:
    if f.mergeable is None:
        return Row("mergeable", f.head_sha, "pending", "GitHub has not computed it yet")
    return Row(
        "mergeable",
        f.head_sha,
        _ok(f.mergeable),
        "no conflicts with the base" if f.mergeable else "conflicts with the base",
    )
