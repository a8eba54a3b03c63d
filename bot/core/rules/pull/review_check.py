"""The critic's check run on the head it reviewed: pure, no I/O.

What a reviewer sees in the pull request's checks: a conclusion (failure blocks, success
approves, neutral asks for changes that do not block), a title counting the findings by
severity, and an annotation on each finding that names a line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.core.rules.pull.review import CriticReport

# GitHub's annotation levels for the critic's severities.
LEVELS = {"sev1": "failure", "sev2": "warning", "sev3": "notice"}
MAX_TITLE = 255  # GitHub's limits on an annotation
MAX_MESSAGE = 64_000


@dataclass(frozen=True)
class CheckRun:
    conclusion: str
    title: str
    annotations: list[dict[str, Any]]


def conclusion(report: CriticReport) -> str:
    """``failure`` for an error or any sev1 (whatever the verdict says), ``success`` for
    an approval, ``neutral`` for changes requested without a sev1."""
    if report.verdict == "error" or report.blocking:
        return "failure"
    return "success" if report.verdict == "approve" else "neutral"


def check_run(report: CriticReport) -> CheckRun:
    """The completed check run for ``report``."""
    return CheckRun(
        conclusion=conclusion(report),
        title=f"{report.verdict}: {report.count('sev1')} sev1, "
        f"{report.count('sev2')} sev2, {report.count('sev3')} sev3",
        annotations=[
            {
                "path": f.path,
                "start_line": f.line,
                "end_line": f.line,
                "annotation_level": LEVELS[f.severity],
                "title": f"{f.severity}: {f.title}"[:MAX_TITLE],
                "message": f.body[:MAX_MESSAGE] or f.title,
            }
            for f in report.findings
            if f.line is not None
        ],
    )
