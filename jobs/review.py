"""The critic's report and what follows from it: typed data and pure decisions.

``plan_after_review`` is a pure function of the report (the forge-loop idea): merge,
code again with the findings, ask a human, or stop. An approval with no findings on a
large diff is not trusted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.diffmap import right_side_lines
from bot.loopstate import Reason, Status
from jobs.messages import safe_text

Severity = Literal["sev1", "sev2", "sev3"]
Category = Literal[
    "correctness", "security", "tests", "performance", "style", "docs", "maintainability"
]
Verdict = Literal["approve", "request_changes", "error"]
SEVERITIES: tuple[Severity, ...] = ("sev1", "sev2", "sev3")


class Finding(BaseModel):
    model_config = ConfigDict(extra="forbid")

    severity: Severity
    category: Category
    path: str
    line: int | None = Field(None, ge=1)
    title: str = Field(min_length=1, max_length=200)
    body: str


class CriticReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    summary: str
    findings: list[Finding] = []

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "sev1"]


def output_schema() -> dict[str, Any]:
    """The JSON schema sent as ``output_config.format``: every object closed, every key
    required (nullable where optional), as structured outputs require."""
    finding = {
        "type": "object",
        "additionalProperties": False,
        "required": ["severity", "category", "path", "line", "title", "body"],
        "properties": {
            "severity": {
                "type": "string",
                "enum": list(SEVERITIES),
                "description": "sev1 blocks the merge; sev2 should fix; sev3 nit",
            },
            "category": {"type": "string", "enum": list(Category.__args__)},  # type: ignore[attr-defined]
            "path": {"type": "string"},
            "line": {
                "anyOf": [{"type": "integer"}, {"type": "null"}],
                "description": "a line number on the new side of the diff, or null",
            },
            "title": {"type": "string"},
            "body": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["verdict", "summary", "findings"],
        "properties": {
            "verdict": {"type": "string", "enum": ["approve", "request_changes"]},
            "summary": {"type": "string"},
            "findings": {"type": "array", "items": finding},
        },
    }


@dataclass(frozen=True)
class Inline:
    path: str
    line: int
    body: str


def place_findings(report: CriticReport, diff: str) -> tuple[list[Inline], list[Finding]]:
    """Split findings into inline comments (on a line the diff shows) and the rest."""
    lines = right_side_lines(diff)
    inline, rest = [], []
    for f in report.findings:
        if f.line is not None and f.line in lines.get(f.path, set()):
            inline.append(
                Inline(
                    f.path,
                    f.line,
                    safe_text(f"**{f.severity}** · {f.category} · **{f.title}**\n\n{f.body}"),
                )
            )
        else:
            rest.append(f)
    return inline, rest


def review_body(
    report: CriticReport, others: list[Finding], round_: int, plan: Plan | None = None
) -> str:
    counts = " · ".join(f"{s}: {report.count(s)}" for s in SEVERITIES)
    verdict = {
        "approve": "✅ approve",
        "request_changes": "❌ changes requested",
        "error": "⚠️ error",
    }[report.verdict]
    parts = [f"### loopbot critic — {verdict}", f"Round {round_} · {counts}", report.summary]
    if others:
        parts.append(
            "Findings outside the changed lines:\n"
            + "\n".join(
                f"- **{f.severity}** {f.category} `{f.path}{':' + str(f.line) if f.line else ''}` "
                f"**{f.title}**: {f.body}"
                for f in others
            )
        )
    if isinstance(plan, CodeAgain):
        parts.append("sev1 findings block the merge; loopbot will address them and ask again.")
    elif isinstance(plan, NeedsHuman):
        parts.append(f"Not merging: {plan.why}. A person should take it from here.")
    elif isinstance(plan, StopLoop):
        parts.append(f"Not merging; the loop stops: {plan.detail}.")
    return safe_text("\n\n".join(parts))  # the summary and findings are model-written


@dataclass(frozen=True)
class MergeNext:
    pass


@dataclass(frozen=True)
class CodeAgain:
    findings: list[Finding]


@dataclass(frozen=True)
class NeedsHuman:
    why: str


@dataclass(frozen=True)
class StopLoop:
    status: Status
    reason: Reason
    detail: str


Plan = MergeNext | CodeAgain | NeedsHuman | StopLoop

# A sev1 finding raised in this many review rounds means the agent is not converging on
# it: a person is asked, instead of spending the remaining rounds on the same problem.
REPEAT_LIMIT = 3


def fingerprint(f: Finding) -> str:
    """The same problem across rounds: its file and its title, case and punctuation
    folded. Reworded titles do not match, which only means no early escalation."""
    title = re.sub(r"[^a-z0-9]+", " ", f.title.lower()).strip()
    return f"{f.path}|{title}"


def tally(seen: Mapping[str, int], report: CriticReport) -> dict[str, int]:
    """``seen`` (rounds per fingerprint) with this report's sev1 findings counted."""
    out = dict(seen)
    for fp in {fingerprint(f) for f in report.blocking}:
        out[fp] = out.get(fp, 0) + 1
    return out


def plan_after_review(
    report: CriticReport,
    *,
    diff_lines: int,
    round_: int,
    max_rounds: int,
    large_diff_lines: int,
    seen: Mapping[str, int] | None = None,
    unread_chars: int = 0,
) -> Plan:
    """What follows a review; ``seen`` counts earlier rounds' sev1 findings by fingerprint,
    ``unread_chars`` is how much of the diff the critic was not shown (too large)."""
    if report.verdict == "error":
        return StopLoop(Status.FAILED, Reason.CRITIC_ERROR, report.summary)
    for f in report.blocking:
        rounds = (seen or {}).get(fingerprint(f), 0) + 1
        if rounds >= REPEAT_LIMIT:
            return NeedsHuman(
                f"the same sev1 finding was raised in {rounds} review rounds and the agent "
                f"has not fixed it: {f.title} (`{f.path}`)"
            )
    if report.blocking:
        if round_ >= max_rounds:
            return StopLoop(
                Status.FAILED,
                Reason.CRITIC_ROUNDS,
                f"{len(report.blocking)} sev1 finding(s) after {round_} review rounds",
            )
        return CodeAgain(report.blocking)
    if unread_chars:
        # Whatever the verdict, it is about part of the change: the rest is unreviewed.
        return NeedsHuman(
            f"the diff is too large for the critic to read whole ({unread_chars:,} "
            "characters were not reviewed)"
        )
    if report.verdict == "approve" and not report.findings and diff_lines > large_diff_lines:
        return NeedsHuman(
            f"an approval with no findings on a {diff_lines}-line diff is not "
            "trusted; a person should review it"
        )
    if report.verdict == "request_changes":
        # Changes requested without a sev1: not blocking by definition, but not an approval.
        return NeedsHuman("the critic requested changes without a blocking finding")
    return MergeNext()
