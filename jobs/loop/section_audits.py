"""Milestones in a loop: before a turn, whether the current section is done and audited
(the section auditor, through the loop's lease-fenced store), and the audit's outcome.
The decisions are in ``bot/core/rules/loop/sections.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

import jobs.review.critic as critic_job
from bot.core.record import LoopRecord, Reason, Status, intake_hash
from bot.core.rules import intake
from bot.core.rules.loop import sections
from bot.core.rules.pull import findings as flog
from bot.core.rules.pull import review
from bot.core.rules.pull.review import CriticReport
from bot.core.text import messages, prompts
from bot.io.logs import get_logger
from bot.io.store import LeaseLost
from jobs import precall
from jobs.agents.agent import Outcome
from jobs.drain import DRAIN
from jobs.intake import plan
from jobs.loop.runner import RunnerBase
from jobs.models import UnknownModel
from jobs.retries import with_retries

log = get_logger("loopbot.loop")


@dataclass(frozen=True)
class _SectionNext:
    """A section audit's outcome that goes on coding: what the next prompt says first."""

    note: str


@dataclass(frozen=True)
class _AllAudited:
    """Every section passed its audit: on to the pull request."""


# What a section audit leads to: code on, the pull request, or the loop ended (its word).
SectionStep = _SectionNext | _AllAudited | str


class SectionAudits(RunnerBase):
    """The section audits of a loop with milestones (``bot.core.rules.loop.sections``)."""

    def _sections_ready(self, record: LoopRecord, issue: Any, *, first: bool) -> str | None:
        """Read the sections of the approved text (again, when a writer's edit changed
        it); with ``milestones: auto`` and none in the issue, ask the planner at the first
        turn. A string when the loop ended here."""
        if self.config.milestones == "off" or record.kind == "metric":
            # A metric loop's work is its iterations; its fix turns answer findings.
            if record.sections:
                self._set(sections=[], section_index=0, sections_sha="", sections_source="")
            return None
        digest = record.approved_sha256 or intake_hash(issue.title, issue.body)
        if record.sections_sha == digest:
            return None
        title, body = intake.approved_text(record, issue.title, issue.body)
        found, source = sections.parse(body), "issue"
        if not found and record.sections_source == "planner":
            self._set(sections_sha=digest)  # the plan stands: the edit added no sections
            return None
        if not found and self.config.milestones == "auto" and first and not record.sections:
            try:
                proposal = plan.propose(
                    self.rt,
                    self.config,
                    title,
                    body,
                    store=self.store,
                    key=self.key,
                    spend=self.spend,
                )
            except precall.OverBudget as exc:
                return self._finish(Status.FAILED, Reason.BUDGET, str(exc))
            found, source = proposal.sections, "planner"
            self.store.event(
                self.key,
                "sections_planned",
                count=len(found),
                titles=[s.title for s in found],
                cost_usd=round(proposal.cost_usd, 6),
                problem=proposal.problem,
            )
            if found:
                self.lease.check()
                self.gh.upsert_comment(
                    self.repo,
                    self.issue_number,
                    plan.COMMENT_KEY,
                    plan.auto_comment(found, proposal.cost_usd),
                )
        new = sections.carry_over(record.sections, found)
        index = sections.current(new)
        if index is not None:
            new = sections.started(new, index, self.worktrees.head(self.checkout.path))
        self._set(
            sections=new,
            sections_sha=digest,
            sections_source=source if new else "",
            section_index=index if index is not None else max(len(new) - 1, 0),
        )
        if new:
            self._section_full = True
            self.store.event(
                self.key,
                "sections",
                count=len(new),
                source=source,
                titles=[s["title"] for s in new],
                done=[i + 1 for i, s in enumerate(new) if s.get("done")],
                current=index + 1 if index is not None else None,
            )
        return None

    def _section_extra(self, record: LoopRecord) -> tuple[str, ...]:
        """The prompt's section block: which section the turn works on."""
        index = sections.current(record.sections)
        if index is None:
            return ()
        full, self._section_full = self._section_full, False
        return (prompts.section_prompt(record.sections, index, full=full),)

    def _section_audit(self, head: str) -> SectionStep:
        """Verify passed on ``head``. In a sectioned loop with a section left, audit it:
        the critic's model on the section's diff (its start to ``head``), the section's
        text as the contract. Its findings go into the loop's one finding log (ids,
        fingerprints, answers, dismissals, the repeat limit), as the critic's do."""
        record = self._legacy_findings_read(self._record())
        match sections.after_verified(record.sections):
            case sections.OpenPull():
                return _AllAudited()
            case sections.Audit(index=i):
                pass
        secs, total = record.sections, len(record.sections)
        sec = secs[i]
        title = str(sec.get("title", ""))
        start = str(sec.get("start_sha") or self.checkout.base_sha)
        rounds = int(sec.get("audit_rounds") or 0) + 1
        # This section's open findings (a writer's dismissal took its own out): the
        # auditor answers for each, resolved or still open.
        asked = flog.of_section(record.finding_log, i)
        self._set(phase=f"auditing {sections.label(secs, i)}", section_index=i)
        self.store.event(
            self.key,
            "section_audit_started",
            section=i + 1,
            total=total,
            title=title,
            round=rounds,
            sha=head,
        )
        self._status_comment()
        stands = sec.get("dirty_sha") == head and any(e["severity"] == "sev1" for e in asked)
        if stands:
            # Nothing changed since this section's blocking audit: asking again about the
            # very same commit is how a flip-flopping auditor would override its own sev1.
            # Its findings stand until the head changes, a writer dismisses them, or a
            # person restarts the loop.
            report = CriticReport(
                verdict="request_changes",
                summary="No change since the last audit of this section: its findings stand.",
                findings=[],
            )
        elif not self.config.critic.enabled:
            # The repository turned its critic off: sections still pace the work, one at a
            # time, but no model judges them (and no final audit follows).
            report = CriticReport(
                verdict="approve",
                summary="Not audited: `critic.enabled` is false in loop.yml.",
                findings=[],
            )
        else:
            asked_report = self._audit_call(record, i, start, head, asked)
            if isinstance(asked_report, str):
                return asked_report
            report = asked_report
        raised, given = list(report.findings), review.answers(report)

        def merged(log: list[dict[str, Any]], next_id: int) -> flog.RoundResult:
            return flog.merge_round(
                log, next_id, raised, given, round_=f"S{i + 1}.{rounds}", sha=head, section=i
            )

        result = merged(record.finding_log, record.next_finding)
        blocking = [e for e in flog.of_section(result.log, i) if e["severity"] == "sev1"]
        standing = [review.as_finding(e) for e in blocking]
        # A repeat is the auditor raising it again: a finding that stands unasked is not.
        again = None if stands else review.repeated(standing, record.sev1_rounds)
        decision = sections.after_audit(
            secs,
            i,
            verdict=report.verdict,
            sev1=len(blocking),
            max_rounds=self.config.critic.max_rounds,
            repeated=(again[0].title, again[0].path, again[1]) if again else None,
        )
        self.store.event(
            self.key,
            "section_audited",
            section=i + 1,
            total=total,
            title=title,
            round=rounds,
            sha=head,
            verdict=report.verdict,
            sev1=len(blocking),
            sev2=report.count("sev2"),
            sev3=report.count("sev3"),
            summary=report.summary[:500],
            new=result.new,
            recurring=result.recurring,
            still_open=result.still_open,
            resolved=result.resolved,
            **({"stands": True} if stands else {}),
        )

        def keep(r: LoopRecord) -> None:
            # Merged again into the log as it is now: a /loop-dismiss that landed while the
            # model was auditing is kept.
            now = merged(r.finding_log, r.next_finding)
            r.finding_log, r.next_finding = now.log, now.next_id
            if report.verdict != "error":  # a failed audit judged nothing
                r.sections[i] = {**r.sections[i], "audited_sha": head}
            if not stands:
                r.sev1_rounds = review.tally(r.sev1_rounds, report, standing)
            if not self.config.critic.enabled:  # said so wherever the sections are shown
                r.sections[i] = {**r.sections[i], "unaudited": True}

        def dirty(r: LoopRecord) -> None:
            # A blocking audit is a round (the next one's questions follow from it), on
            # this head: its findings stand until the head changes.
            keep(r)
            r.sections = sections.count_round(r.sections, i)
            r.sections[i].update(dirty_sha=head, dirty_sev1=bool(blocking))

        match decision:
            case sections.Recode():

                def again_(r: LoopRecord) -> None:
                    dirty(r)
                    r.turn = 0  # a fresh turn budget, as for the critic's findings

                self.store.update(self.key, again_)
                return _SectionNext(prompts.section_findings(i, total, blocking))
            case sections.NextSection() | sections.AllSections():
                return self._through(decision, head, keep)
            case sections.StopLoop(status=status, reason=reason, detail=detail):
                # An audit that failed (error) was no round; one that asks a person was.
                self.store.update(self.key, dirty if reason is Reason.NEEDS_HUMAN else keep)
                if reason is Reason.NEEDS_HUMAN:
                    self.gh.add_labels(
                        self.repo, self.issue_number, [self.config.labels.needs_human]
                    )
                return self._finish(status, reason, detail)
            case _:
                assert_never(decision)

    def _through(
        self,
        decision: sections.NextSection | sections.AllSections,
        head: str,
        keep: Callable[[LoopRecord], None] | None = None,
        *,
        overridden: list[str] | None = None,
    ) -> SectionStep:
        """The section ``decision.done`` is through (its audit was clean, or writers
        dismissed what held it on this head: ``overridden``, their findings' ids): tick
        it, and on to the next section or the pull request."""
        done = decision.done
        secs = self._record().sections
        total, title = len(secs), str(secs[done].get("title", ""))
        nxt = decision.index if isinstance(decision, sections.NextSection) else None

        def through(r: LoopRecord) -> None:
            if keep is not None:
                keep(r)
            ticked = sections.tick(r.sections, done)
            if overridden is not None:  # no audit counted: the last one judged this head
                ticked[done]["audit_rounds"] = secs[done].get("audit_rounds", 0)
            if nxt is None:
                r.sections = ticked
                return
            r.sections = sections.started(ticked, nxt, head)
            r.section_index = nxt
            r.turn = 0  # each section has its own turn budget

        self.store.update(self.key, through)
        self.store.event(
            self.key,
            "section_done",
            section=done + 1,
            total=total,
            title=title,
            next=None if nxt is None else nxt + 1,
            **({"dismissed": overridden} if overridden is not None else {}),
        )
        if nxt is None:
            return _AllAudited()
        self._section_full = True
        return _SectionNext(prompts.section_next(done, nxt, total))

    def _audit_call(
        self,
        record: LoopRecord,
        i: int,
        start: str,
        head: str,
        asked: list[dict[str, Any]],
    ) -> CriticReport | str:
        """The audit's model call, retried as the critic's review is when the API fails
        in a way that may pass (overloaded, rate limited, cut off); a string when the loop
        ended (out of budget, an unknown model, or errors it gave up on)."""
        secs, total = record.sections, len(record.sections)
        sec = secs[i]
        if self._review_guidance is None:
            self._review_guidance = prompts.guidance(
                {p: self.gh.file(self.repo, p) for p in prompts.INSTRUCTION_FILES}, reviewer=True
            )
        later = [f"{n + 1}. {s.get('title')}" for n, s in enumerate(secs) if n > i]
        scope = (
            f"This is a section audit. The issue is worked in {total} sections, one at a "
            f"time; the diff below is the work on section {i + 1} ({start[:10]}..{head[:10]}). "
            "Judge whether it delivers this section, correctly and with tests where the "
            "section calls for them; the section's text, from the issue and fenced like "
            "it, is the contract:\n"
            f"<{prompts.FENCE}>\nSection {i + 1}: {prompts.fence_safe(str(sec.get('title')))}"
            f"\n\n{prompts.fence_safe(str(sec.get('text', '')))}\n</{prompts.FENCE}>\n"
            + (
                # Their titles are the issue's text too: fenced, never loose in the prompt.
                "Do not report as missing what later sections will do (their titles, "
                f"from the issue):\n<{prompts.FENCE}>\n"
                + prompts.fence_safe("\n".join(later))
                + f"\n</{prompts.FENCE}>\n"
                if later
                else "This is the last section. "
            )
            + "A sev1 here sends the work back to coding on this section."
        )
        diff = self.worktrees.diff_between(self.checkout, start, head)
        critic = critic_job.Critic(self.rt, self.repo, self.issue_number)
        critic.store = self.store  # the loop's lease-fenced store: its usage is a write
        guidance = self._review_guidance

        def once() -> CriticReport | str:
            try:
                return critic.audit(
                    self.config,
                    guidance,
                    record.approved_title,
                    record.approved_body,
                    diff,
                    scope=scope,
                    asked=asked,
                )
            except precall.OverBudget as exc:
                self.gh.add_labels(self.repo, self.issue_number, [self.config.labels.needs_human])
                return self._finish(Status.FAILED, Reason.BUDGET, str(exc))
            except UnknownModel as exc:  # a setting to fix: no retry, no resume
                return self._finish(
                    Status.FAILED,
                    Reason.BAD_CONFIG,
                    f"the critic's model `{exc.model}` is unknown to the Anthropic API, so "
                    f"section {i + 1} cannot be audited (see `loopbot doctor`)",
                )

        def give_up(error: str, attempts: int) -> str:
            if DRAIN.is_set():  # the worker stops: another one audits this head first
                return self._handoff(
                    f"Your worker shut down while section {i + 1}'s audit was failing; it "
                    "is audited again before you go on."
                )
            return self._finish(
                Status.FAILED, Reason.CRITIC_ERROR, messages.audit_gave_up(i + 1, error, attempts)
            )

        return with_retries(
            once,
            give_up,
            kind="section_audit",
            key=self.key,
            store=self.store,
            attempts=critic_job.ERROR_ATTEMPTS,
            backoff=critic_job.ERROR_BACKOFF,
            fatal=(LeaseLost,),
            pause=DRAIN.wait,  # a drain does not wait out the pause
        )

    def _resumed_sections(self, conversation: list[dict[str, Any]]) -> SectionStep | None:
        """Before a resumed loop's first turn (``sections.resume``): audit the verified
        head its section's audit never judged (a killed worker, an audit that kept
        failing), or pass a section whose blocking findings writers dismissed on this
        head; None: code on. Every rule before a turn but the turn count applies first."""
        record = self._record()
        verify = record.last_verify
        if not record.sections or record.kind == "metric" or verify.get("passed") is not True:
            return None
        issue = self.gh.issue(self.repo, self.issue_number)
        # The turn that verified this head is over: the count decides the next one.
        step = self._before_turn(record, issue, record.turn + 1)
        if isinstance(step, str):
            return step
        if (ended := self._sections_ready(record, issue, first=False)) is not None:
            return ended
        record = self._record()
        head = self.worktrees.head(self.checkout.path)
        index = sections.current(record.sections)
        standing = flog.of_section(record.finding_log, index) if index is not None else []
        decision = sections.resume(
            record.sections,
            head=head,
            verified=verify.get("sha") == head,
            sev1_open=sum(1 for e in standing if e["severity"] == "sev1"),
        )
        match decision:
            case None:
                return None
            case sections.Audit(index=i):
                self.store.event(self.key, "section_audit_resumed", section=i + 1, sha=head)
                return self._section_audit(head)
            case sections.NextSection() | sections.AllSections():
                ids = [
                    str(e["id"])
                    for e in record.finding_log
                    if e.get("section") == decision.done
                    and e.get("status") == flog.DISMISSED
                    and e.get("severity") == "sev1"
                ]
                return self._through(decision, head, overridden=ids)
            case _:
                assert_never(decision)

    def _standing_note(self, reserve: int) -> str:
        """The current section's blocking findings as the agent's next prompt says them,
        when it codes on without a new audit (a person's restart): "" when none stand."""
        record = self._record()
        index = sections.current(record.sections) if record.kind != "metric" else None
        if index is None:
            return ""
        blocking = [
            e for e in flog.of_section(record.finding_log, index) if e["severity"] == "sev1"
        ]
        if not blocking:
            return ""
        total = len(record.sections)
        return prompts.section_findings(index, total, blocking, reserve=reserve)

    def _legacy_findings_read(self, record: LoopRecord) -> LoopRecord:
        """A loop whose section findings an earlier release kept apart
        (``record.section_findings``): its latest audit's findings per section go into
        the finding log, once."""
        if not record.section_findings:
            return record

        def fold(r: LoopRecord) -> None:
            latest: dict[int, int] = {}
            for f in r.section_findings:
                sec, rnd = int(f.get("section", 0)), int(f.get("round", 0))
                latest[sec] = max(latest.get(sec, 0), rnd)
            for sec, rnd in sorted(latest.items()):
                raised = [
                    review.as_finding(f)
                    for f in r.section_findings
                    if (int(f.get("section", 0)), int(f.get("round", 0))) == (sec, rnd)
                ]
                now = flog.merge_round(
                    r.finding_log,
                    r.next_finding,
                    raised,
                    {},
                    round_=f"S{sec + 1}.{rnd}",
                    sha=str(r.section_findings[-1].get("sha", "")),
                    section=sec,
                )
                r.finding_log, r.next_finding = now.log, now.next_id
            r.section_findings = []

        return self.store.update(self.key, fold)


def last_text(conversation: list[dict[str, Any]]) -> str:
    """The agent's last words in ``conversation`` (the pull request's summary when a
    resumed loop opens it without a turn)."""
    for message in reversed(conversation):
        if message.get("role") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or [] if b.get("type") == "text"]
        if any(texts):
            return "\n".join(t for t in texts if t)
    return ""


def resumed_outcome(conversation: list[dict[str, Any]]) -> Outcome:
    """A turn's outcome for a pull request opened on resuming (no turn ran)."""
    return Outcome(end="finished", text=last_text(conversation))
