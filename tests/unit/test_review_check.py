"""The critic's check run (bot/core/rules/pull/review_check.py): one row per verdict and mix
of findings."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.rules.pull.review import CriticReport, Finding
from bot.core.rules.pull.review_check import check_run, conclusion


def finding(severity: str, line: int | None = 3, **fields: Any) -> Finding:
    data = {
        "severity": severity,
        "category": "correctness",
        "path": "app.py",
        "line": line,
        "title": f"a {severity} problem",
        "body": "why",
    }
    return Finding.model_validate(data | fields)


@pytest.mark.parametrize(
    ("verdict", "severities", "expected"),
    [
        ("approve", [], "success"),
        ("approve", ["sev2", "sev3"], "success"),
        ("approve", ["sev1"], "failure"),  # a sev1 blocks whatever the verdict says
        ("request_changes", [], "neutral"),
        ("request_changes", ["sev2"], "neutral"),
        ("request_changes", ["sev1", "sev3"], "failure"),
        ("error", [], "failure"),
    ],
)
def test_conclusion(verdict: str, severities: list[str], expected: str) -> None:
    report = CriticReport.model_validate(
        {"verdict": verdict, "summary": "s", "findings": [finding(s) for s in severities]}
    )
    assert conclusion(report) == expected
    assert check_run(report).conclusion == expected


def test_title_counts_and_annotations_only_for_lines() -> None:
    report = CriticReport(
        verdict="request_changes",
        summary="s",
        findings=[
            finding("sev1", 10),
            finding("sev2", None),
            finding("sev3", 4, title="t" * 200, body=""),
        ],
    )
    run = check_run(report)
    assert run.title == "request_changes: 1 sev1, 1 sev2, 1 sev3"
    assert run.annotations == [
        {
            "path": "app.py",
            "start_line": 10,
            "end_line": 10,
            "annotation_level": "failure",
            "title": "sev1: a sev1 problem",
            "message": "why",
        },
        {
            "path": "app.py",
            "start_line": 4,
            "end_line": 4,
            "annotation_level": "notice",
            "title": "sev3: " + "t" * 200,
            "message": "t" * 200,  # no body: the title says it
        },
    ]
