"""The critic's report and what follows from it: typed data and pure decisions.

``plan_after_review`` is a pure function of the report (the forge-loop idea): merge,
code again with the findings, ask a human, or stop. An approval with no findings on a
large diff is not trusted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.core.diffmap import right_side_lines
from bot.core.evidence import held_out
from bot.core.record import Reason, Status
from bot.core.rules.pull import findings as flog
from bot.core.text.messages import safe_text

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


class Answer(BaseModel):
    """The critic's word on one open finding from an earlier round, by its id."""

    model_config = ConfigDict(extra="forbid")

    id: str
    status: Literal["resolved", "open"]
    why: str


class CriticReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    summary: str
    findings: list[Finding] = []
    earlier_findings: list[Answer] = []

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "sev1"]


def check_answers(report: CriticReport, ids: Sequence[str]) -> None:
    """Raise ``ValueError`` unless every open finding ``ids`` names is answered exactly
    once and nothing else is: a finding the critic skipped is not silently kept or dropped."""
    given = [a.id for a in report.earlier_findings]
    missing = [i for i in ids if i not in given]
    extra = sorted({i for i in given if i not in ids})
    twice = sorted({i for i in given if given.count(i) > 1})
    problems = (
        ([f"no answer for {', '.join(missing)}"] if missing else [])
        + ([f"unknown finding ids {', '.join(extra)}"] if extra else [])
        + ([f"more than one answer for {', '.join(twice)}"] if twice else [])
    )
    if problems:
        raise ValueError("earlier_findings: " + "; ".join(problems))


def answers(report: CriticReport) -> dict[str, tuple[Literal["resolved", "open"], str]]:
    return {a.id: (a.status, a.why) for a in report.earlier_findings}


def output_schema(ids: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON schema sent as ``output_config.format``: every object closed, every key
    required (nullable where optional), as structured outputs require. ``ids``: the open
    findings from earlier rounds, each of which must be answered."""
    answer_id: dict[str, Any] = {"type": "string"}
    if ids:
        answer_id["enum"] = list(ids)
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
    answer = {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "status", "why"],
        "properties": {
            "id": answer_id,
            "status": {"type": "string", "enum": ["resolved", "open"]},
            "why": {"type": "string"},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["verdict", "summary", "findings", "earlier_findings"],
        "properties": {
            "verdict": {"type": "string", "enum": ["approve", "request_changes"]},
            "summary": {"type": "string"},
            "findings": {
                "type": "array",
                "items": finding,
                "description": "new findings; one raised before keeps its id if raised again",
            },
            "earlier_findings": {
                "type": "array",
                "items": answer,
                "description": "one answer per open finding from earlier rounds, by id",
            },
        },
    }


# Evidence from the loop (jobs.loop.job fills ``base_verify``, ``last_verify``,
# ``tests_changed``). When verify already passed on the base, nothing in the loop showed
# the problem existed; without a changed test nothing shows it is fixed either. loopbot
# records that itself rather than trusting the critic to notice: a sev2, since a docs or
# refactoring issue may rightly change no test; the critic is told it may raise a sev1.
NO_TEST = Finding(
    severity="sev2",
    category="tests",
    path="",
    line=None,
    title="No test captures the issue",
    body="verify already passed on the base, before any change, and the pull request adds "
    "or changes no test: nothing shows the problem existed or that this change fixes it. "
    "Add a test that fails on the base and passes with the change, or say why none can.",
)
NO_TEST_FINGERPRINT = flog.fingerprint(NO_TEST.path, NO_TEST.category, NO_TEST.title)


def evidence_finding(base_verify: Mapping[str, Any], tests_changed: Sequence[str]) -> bool:
    """Whether loopbot's own finding ``NO_TEST`` stands for this head."""
    return base_verify.get("passed") is True and not tests_changed


# Held-out verify (bot/core/evidence/held_out.py): verify passes on the head only with
# the tests the change rewrote, or runs fewer of them. loopbot's own sev1, raised on the
# head the evidence is about, never asked of the critic: a lenient critic must not be
# able to wave it through. Only a writer's ``/loop-dismiss`` lets it merge.
TESTS_CHANGED = Finding(
    severity="sev1",
    category="tests",
    path="",
    line=None,
    title="The tests were changed to pass",
    body="verify passes on this head only because the tests changed.",
)
TESTS_CHANGED_FINGERPRINT = flog.fingerprint(
    TESTS_CHANGED.path, TESTS_CHANGED.category, TESTS_CHANGED.title
)
OWN_FINGERPRINTS = frozenset({NO_TEST_FINGERPRINT, TESTS_CHANGED_FINGERPRINT})


def tests_changed_finding(test_evidence: Mapping[str, Any], sha: str) -> Finding | None:
    """loopbot's own sev1 for the head ``sha`` when the held-out evidence stands on it,
    its body naming the tests and what the commands said."""
    if not held_out.stands(test_evidence, sha):
        return None
    lines = "\n".join(f"- {line}" for line in held_out.facts(test_evidence))
    return TESTS_CHANGED.model_copy(
        update={
            "body": f"{held_out.summary(test_evidence)}.\n\n{lines}\n\nA writer decides: "
            "fix the code so the tests as they were pass, or, if the test change is "
            "right, dismiss this finding with `/loop-dismiss <id> <why>`."
        }
    )


def bind_dismissal(log: list[dict[str, Any]], fid: str, test_evidence: Mapping[str, Any]) -> None:
    """A writer just dismissed ``fid``: when it is loopbot's held-out finding, bind the
    dismissal to the evidence it judged (its digest: the held-out files as that head has
    them, and what the counts said). Changes ``log`` in place."""
    for e in log:
        if e.get("id") == fid and e.get("fingerprint") == TESTS_CHANGED_FINGERPRINT:
            e["evidence_digest"] = str(test_evidence.get("digest") or "")


def dismissal_holds(e: Mapping[str, Any], test_evidence: Mapping[str, Any]) -> bool:
    """Whether the dismissed held-out finding ``e`` covers ``test_evidence``: the same
    tests changed the same way. A head that changed them again is judged again."""
    digest = str(test_evidence.get("digest") or "")
    return e.get("status") == flog.DISMISSED and bool(digest) and e.get("evidence_digest") == digest


def lapse_stale_dismissal(
    log: Sequence[Mapping[str, Any]], test_evidence: Mapping[str, Any], sha: str
) -> list[dict[str, Any]]:
    """``log`` where a writer's dismissal of the held-out finding no longer covers the
    evidence standing on ``sha`` (``dismissal_holds``): that finding is set back to
    resolved, its dismissal kept as history, so raising it again reopens it (a new
    question for a writer). Unchanged otherwise."""
    out = [dict(e) for e in log]
    if not held_out.stands(test_evidence, sha):
        return out
    for e in out:
        if (
            e.get("fingerprint") == TESTS_CHANGED_FINGERPRINT
            and e.get("status") == flog.DISMISSED
            and not dismissal_holds(e, test_evidence)
        ):
            e["lapsed_dismissals"] = [
                *e.get("lapsed_dismissals", []),
                {k: e.get(k) for k in ("dismissed_by", "dismissed_reason", "dismissed_sha")},
            ]
            e["status"] = flog.RESOLVED
            e["resolved_round"] = e.get("last_round")
            e["resolved_sha"] = e.get("dismissed_sha")
    return out


def tests_changed_stands(log: Sequence[Mapping[str, Any]]) -> bool:
    """Whether loopbot's own held-out finding is open (not resolved, not dismissed)."""
    return any(
        e.get("fingerprint") == TESTS_CHANGED_FINGERPRINT and e.get("status") == flog.OPEN
        for e in log
    )


def evidence(
    base_verify: Mapping[str, Any],
    last_verify: Mapping[str, Any],
    tests_changed: Sequence[str],
    sha: str,
    test_evidence: Mapping[str, Any] | None = None,
) -> list[str]:
    """What the loop observed, as lines for the critic's prompt."""
    lines = []
    base = str(base_verify.get("sha") or "")[:10] or "the base"
    if not base_verify:
        lines.append("- verify was not run on the base: no evidence either way")
    elif base_verify.get("passed"):
        lines.append(
            f"- verify already passed on the base ({base}), before any change: it does not "
            "show the problem the issue describes"
        )
    else:
        lines.append(
            f"- verify failed on the base ({base}, exit code {base_verify.get('exit_code')})"
        )
    if last_verify:
        ran_on = str(last_verify.get("sha") or "")
        where = "this head" if ran_on in ("", sha) else f"{ran_on[:10]} (not this head)"
        state = "passes" if last_verify.get("passed") else "fails"
        lines.append(f"- verify {state} on {where}")
    changed = ", ".join(f"`{p}`" for p in tests_changed) or "none"
    lines.append(f"- test files the pull request adds or changes: {changed}")
    if evidence_finding(base_verify, tests_changed):
        lines.append(
            f'- loopbot records the sev2 finding "{NO_TEST.title}" itself; if the issue '
            "describes wrong behaviour, a change with no test for it must not merge: raise "
            "it as a sev1 finding of your own"
        )
    if test_evidence and test_evidence.get("sha") == sha:
        lines.extend(f"- {line}" for line in held_out.facts(test_evidence))
        if held_out.stands(test_evidence, sha):
            lines.append(
                f'- loopbot records the sev1 finding "{TESTS_CHANGED.title}" itself: judge '
                "whether the code change fixes the issue with the tests as the writer "
                "approved them"
            )
    return lines


@dataclass(frozen=True)
class Inline:
    path: str
    line: int
    body: str


def place_findings(
    report: CriticReport, diff: str, ids: Mapping[str, str] | None = None
) -> tuple[list[Inline], list[Finding]]:
    """Split findings into inline comments (on a line the diff shows) and the rest.
    ``ids``: finding id by ``bot.core.rules.pull.findings`` fingerprint, shown before each title."""
    lines = right_side_lines(diff)
    inline, rest = [], []
    for f in report.findings:
        if f.line is not None and f.line in lines.get(f.path, set()):
            inline.append(
                Inline(
                    f.path,
                    f.line,
                    safe_text(
                        f"{_id_prefix(f, ids)}**{f.severity}** · {f.category} · **{f.title}**"
                        f"\n\n{f.body}"
                    ),
                )
            )
        else:
            rest.append(f)
    return inline, rest


def finding_ids(log: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(e["fingerprint"]): str(e["id"]) for e in log}


def _id_prefix(f: Finding, ids: Mapping[str, str] | None) -> str:
    fid = (ids or {}).get(flog.fingerprint(f.path, f.category, f.title))
    return f"**{fid}** · " if fid else ""


def _where(path: str, line: object) -> str:
    if not path:
        return ""
    return f" `{path}{':' + str(line) if line else ''}`"


def review_body(
    report: CriticReport,
    others: list[Finding],
    round_: int,
    plan: Plan | None = None,
    result: flog.RoundResult | None = None,
) -> str:
    """The review's text: the verdict, the summary, findings not placed inline, and,
    with ``result``, every finding by id: new, recurring, still open, resolved, dismissed."""
    counts = " · ".join(f"{s}: {report.count(s)}" for s in SEVERITIES)
    verdict = {
        "approve": "✅ approve",
        "request_changes": "❌ changes requested",
        "error": "⚠️ error",
    }[report.verdict]
    parts = [f"### loopbot critic — {verdict}", f"Round {round_} · {counts}", report.summary]
    ids = finding_ids(result.log) if result is not None else None
    if others:
        parts.append(
            "Findings outside the changed lines:\n"
            + "\n".join(
                f"- {_id_prefix(f, ids)}**{f.severity}** {f.category}{_where(f.path, f.line)} "
                f"**{f.title}**: {f.body}"
                for f in others
            )
        )
    if result is not None:
        parts.extend(_by_id(result))
    if isinstance(plan, CodeAgain):
        parts.append("sev1 findings block the merge; loopbot will address them and ask again.")
    elif isinstance(plan, NeedsHuman):
        parts.append(f"Not merging: {plan.why}. A person should take it from here.")
    elif isinstance(plan, StopLoop):
        parts.append(f"Not merging; the loop stops: {plan.detail}.")
    return safe_text("\n\n".join(parts))  # the summary and findings are model-written


def _by_id(result: flog.RoundResult) -> list[str]:
    def line(fid: str, extra: str = "") -> str:
        e = result.entry(fid)
        return f"- **{fid}** {e['severity']} {e['title']}{_where(e['path'], e['line'])}{extra}"

    def why(fid: str) -> str:
        text = str(result.entry(fid).get("why") or "")
        return f" — {text}" if text else ""

    sections = [
        ("New", [line(i) for i in result.new]),
        ("Raised again after being resolved", [line(i) for i in result.recurring]),
        ("Still open", [line(i, why(i)) for i in result.still_open]),
        ("Resolved", [line(i, why(i)) for i in result.resolved]),
        (
            "Dismissed by a writer",
            [
                line(
                    str(e["id"]),
                    f" — by @{e.get('dismissed_by')}: {e.get('dismissed_reason')}",
                )
                for e in result.log
                if e.get("status") == flog.DISMISSED
            ],
        ),
    ]
    return [f"**{name}:**\n" + "\n".join(rows) for name, rows in sections if rows]


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
    """The same sev1 problem across rounds, for the repeat count: its file and its title,
    case and punctuation folded. Unlike a finding's id (``bot.core.rules.pull.findings``), the
    category is left out: a critic that files the same problem under another heading is still
    repeating itself. Reworded titles do not match, which only means no early escalation."""
    return f"{f.path}|{flog.fold(f.title)}"


def tally(
    seen: Mapping[str, int], report: CriticReport, blocking: Sequence[Finding] | None = None
) -> dict[str, int]:
    """``seen`` (rounds per fingerprint) with this round's sev1 findings counted:
    ``blocking`` (those that stand after the round, see ``plan_after_review``), or the
    report's own."""
    out = dict(seen)
    for fp in {fingerprint(f) for f in (report.blocking if blocking is None else blocking)}:
        out[fp] = out.get(fp, 0) + 1
    return out


def repeated(blocking: Sequence[Finding], seen: Mapping[str, int]) -> tuple[Finding, int] | None:
    """The first of ``blocking`` raised in ``REPEAT_LIMIT`` rounds, this one included
    (``seen``: earlier rounds per fingerprint, see ``tally``), with that count."""
    for f in blocking:
        rounds = seen.get(fingerprint(f), 0) + 1
        if rounds >= REPEAT_LIMIT:
            return f, rounds
    return None


def as_finding(entry: Mapping[str, Any]) -> Finding:
    """A finding-log entry (``bot.core.rules.pull.findings``) as the critic reported it."""
    return Finding.model_validate(
        {k: entry[k] for k in ("severity", "category", "path", "line", "title", "body")}
    )


def plan_after_review(
    report: CriticReport,
    *,
    diff_lines: int,
    round_: int,
    max_rounds: int,
    large_diff_lines: int,
    seen: Mapping[str, int] | None = None,
    unread_chars: int = 0,
    blocking: Sequence[Finding] | None = None,
) -> Plan:
    """What follows a review; ``seen`` counts earlier rounds' sev1 findings by fingerprint,
    ``unread_chars`` is how much of the diff the critic was not shown (too large).

    ``blocking``: the sev1 findings that stand after this round, from the finding log:
    new ones, earlier ones the critic said are still open, minus those a writer
    dismissed. None means the report's own sev1 findings.
    """
    if report.verdict == "error":
        return StopLoop(Status.FAILED, Reason.CRITIC_ERROR, report.summary)
    blocking = report.blocking if blocking is None else list(blocking)
    if (again := repeated(blocking, seen or {})) is not None:
        f, rounds = again
        return NeedsHuman(
            f"the same sev1 finding was raised in {rounds} review rounds and the agent "
            f"has not fixed it: {f.title} (`{f.path}`)"
        )
    if blocking:
        if round_ >= max_rounds:
            return StopLoop(
                Status.FAILED,
                Reason.CRITIC_ROUNDS,
                f"{len(blocking)} sev1 finding(s) after {round_} review rounds",
            )
        return CodeAgain(blocking)
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


def plan_for_reviewed_head(
    verdict: str,
    log: Sequence[dict[str, Any]],
    sha: str,
    *,
    diff_lines: int,
    large_diff_lines: int,
    unread_chars: int = 0,
) -> Plan:
    """What follows when the head ``sha`` was reviewed already (its ``verdict``) and no
    commit came since: the verdict stands, the model is not asked again. A sev1 still
    open means the agent changed nothing about it, so a person decides; otherwise the
    same rules as after a review, over the findings that stand."""
    standing = flog.blocking(log)
    if standing:
        ids = ", ".join(e["id"] for e in standing)
        return NeedsHuman(
            f"the sev1 finding(s) {ids} raised on {sha[:10]} stand and no change was pushed "
            "since; a writer can `/loop-dismiss <id> <reason>` a finding that does not apply"
        )
    report = CriticReport(
        verdict=verdict if verdict in ("approve", "request_changes") else "error",
        summary=f"the critic's verdict on {sha[:10]} was {verdict}",
        findings=[as_finding(e) for e in flog.open_entries(log)],
    )
    return plan_after_review(
        report,
        diff_lines=diff_lines,
        round_=0,
        max_rounds=1,
        large_diff_lines=large_diff_lines,
        unread_chars=unread_chars,
        blocking=[],
    )


# A loop that stopped on a review's sev1 (a person was asked, or the rounds ran out, or
# the gate refused over it) waits for a person: a writer's dismissal is that person.
STOPPED_ON_SEV1 = frozenset({Reason.NEEDS_HUMAN.value, Reason.CRITIC_ROUNDS.value})


class AfterDismissal(StrEnum):
    """What a writer's dismissal of a finding leads to (``after_dismissal``)."""

    NOTHING = "nothing"  # the loop carries it into its next round, or other sev1s stand
    GATE = "gate"  # the reviewed head stands as reviewed: on to the merge gate
    REVIEW = "review"  # a new critic round on the head first
    RESUME = "resume"  # a section audit's sev1 held it: the loop goes on coding


def after_dismissal(
    *,
    status: Status,
    reason: str,
    severity: str,
    log: Sequence[dict[str, Any]],
    head: str,
    reviewed_sha: str,
    reviewed_whole: bool,
    verdicts: Mapping[str, str],
    section: int | None = None,
    pull: bool = True,
) -> AfterDismissal:
    """What dismissing a finding of ``severity`` (already applied to ``log``) leads to.

    Only a loop that stopped over sev1 findings moves, once no other sev1 stands: to the
    merge gate when the critic's last round reviewed this very head and read its whole
    diff (its verdict stands, overridden by the writer); otherwise a new round first (the
    head moved, the round failed, or its diff was cut: the writer dismissed a finding in
    a review that did not see all of the change). A loop still coding or reviewing just
    carries the dismissal into its next round; one waiting at the gate reads it there.

    A section audit's finding (``section``) on a loop with no ``pull`` request yet: the
    loop resumes, and before coding passes the section when its last audit judged this
    head, or audits it again (``bot.core.rules.loop.sections.resume``)."""
    if not (
        severity == "sev1"
        and status in (Status.REFUSED, Status.FAILED)
        and reason in STOPPED_ON_SEV1
        and not flog.blocking(log)
        and head
    ):
        return AfterDismissal.NOTHING
    if section is not None and not pull:
        return AfterDismissal.RESUME
    if head == reviewed_sha and reviewed_whole and verdicts.get(head) not in (None, "error"):
        return AfterDismissal.GATE
    return AfterDismissal.REVIEW
