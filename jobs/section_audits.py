"""Milestones in a loop: before a turn, whether the current section is done and audited
(the section auditor, through the loop's lease-fenced store), and the audit's outcome.
The decisions are in ``bot/core/rules/sections.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never

from bot.core.record import LoopRecord, Reason, Status, intake_hash
from bot.core.rules import intake, sections
from bot.core.rules.review import Answer, CriticReport
from bot.core.text import prompts
from bot.io.logs import get_logger
from jobs import plan, precall
from jobs.critic import Critic
from jobs.models import UnknownModel
from jobs.runner import RunnerBase

log = get_logger("loopbot.loop")


@dataclass(frozen=True)
class _SectionNext:
    """A section audit's outcome that goes on coding: what the next prompt says first."""

    note: str


class SectionAudits(RunnerBase):
    """The section audits of a loop with milestones (``bot.core.rules.sections``)."""

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
                    self.rt, self.config, title, body, store=self.store, key=self.key
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

    def _section_audit(self, head: str) -> _SectionNext | str | None:
        """Verify passed. In a sectioned loop with a section left, audit it: the critic's
        model on the section's diff (its start to ``head``), the section's text as the
        contract. A note for the next turn (the same section again, or the next one), a
        string when the loop ended, or None: on to the pull request."""
        record = self._record()
        match sections.after_verified(record.sections):
            case sections.OpenPull():
                return None
            case sections.Audit(index=i):
                pass
        secs, total = record.sections, len(record.sections)
        sec = secs[i]
        title = str(sec.get("title", ""))
        start = str(sec.get("start_sha") or self.checkout.base_sha)
        rounds = int(sec.get("audit_rounds") or 0) + 1
        # The last round's blocking findings of this section: the auditor answers for each.
        asked = [
            f
            for f in record.section_findings
            if (f.get("section"), f.get("round"), f.get("severity")) == (i, rounds - 1, "sev1")
        ]
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
            f"<{prompts.FENCE}>\nSection {i + 1}: {prompts.fence_safe(title)}\n\n"
            f"{prompts.fence_safe(str(sec.get('text', '')))}\n</{prompts.FENCE}>\n"
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
        stands = bool(asked) and sec.get("dirty_sha") == head
        if stands:
            # Nothing changed since this section's blocking audit: asking again about the
            # very same commit is how a flip-flopping auditor would override its own sev1.
            # Its findings stand until the head changes (or a person restarts the loop).
            report = CriticReport(
                verdict="request_changes",
                summary="No change since the last audit of this section: its findings stand.",
                findings=[],
                earlier_findings=[
                    Answer(id=str(f.get("id")), status="open", why="no change since") for f in asked
                ],
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
            critic = Critic(self.rt, self.repo, self.issue_number)
            critic.store = self.store  # the loop's lease-fenced store: its usage is a write
            try:
                report = critic.audit(
                    self.config,
                    self._review_guidance,
                    record.approved_title,
                    record.approved_body,
                    self.worktrees.diff_between(self.checkout, start, head),
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
        still = {a.id for a in report.earlier_findings if a.status == "open"}
        carried = [f | {"round": rounds, "sha": head} for f in asked if f.get("id") in still]
        found = [
            f.model_dump()
            | {"id": f"S{i + 1}.{rounds}.{k}", "section": i, "round": rounds}
            | {"sha": head}
            for k, f in enumerate(report.findings, 1)
        ]
        blocking = [f for f in found if f["severity"] == "sev1"] + carried
        decision = sections.after_audit(
            secs,
            i,
            verdict=report.verdict,
            sev1=len(blocking),
            max_rounds=self.config.critic.max_rounds,
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
            **({"stands": True} if stands else {}),
        )

        def keep(r: LoopRecord) -> None:
            r.section_findings = [*r.section_findings, *found, *carried][-200:]
            if not self.config.critic.enabled:  # said so wherever the sections are shown
                r.sections[i] = {**r.sections[i], "unaudited": True}

        def dirty(r: LoopRecord) -> None:
            # A blocking audit is a round (the next one's findings ids and questions follow
            # from it), on this head: its findings stand until the head changes.
            keep(r)
            r.sections = sections.count_round(r.sections, i)
            r.sections[i]["dirty_sha"] = head

        match decision:
            case sections.Recode():

                def again(r: LoopRecord) -> None:
                    dirty(r)
                    r.turn = 0  # a fresh turn budget, as for the critic's findings

                self.store.update(self.key, again)
                return _SectionNext(prompts.section_findings(i, total, blocking))
            case sections.NextSection(done=done, index=n):

                def advance(r: LoopRecord) -> None:
                    keep(r)
                    r.sections = sections.started(sections.tick(r.sections, done), n, head)
                    r.section_index = n
                    r.turn = 0  # each section has its own turn budget

                self.store.update(self.key, advance)
                self.store.event(
                    self.key, "section_done", section=done + 1, total=total, title=title, next=n + 1
                )
                self._section_full = True
                return _SectionNext(prompts.section_next(done, n, total))
            case sections.AllSections(done=done):

                def last(r: LoopRecord) -> None:
                    keep(r)
                    r.sections = sections.tick(r.sections, done)

                self.store.update(self.key, last)
                self.store.event(
                    self.key, "section_done", section=done + 1, total=total, title=title, next=None
                )
                return None
            case sections.StopLoop(status=status, reason=reason, detail=detail):
                # An audit that failed (error) was no round; one that ran out of rounds was.
                self.store.update(self.key, dirty if reason is Reason.NEEDS_HUMAN else keep)
                if reason is Reason.NEEDS_HUMAN:
                    self.gh.add_labels(
                        self.repo, self.issue_number, [self.config.labels.needs_human]
                    )
                return self._finish(status, reason, detail)
            case _:
                assert_never(decision)
