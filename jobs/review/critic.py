"""The critic job: review the PR diff with the model, post one review, decide what next.

The model answers in a JSON schema (``output_config.format``), validated again here with
pydantic; an answer that does not validate is asked for once more, then the verdict is
``error`` and nothing merges. One review per reviewed head sha, never two: the review
carries a hidden marker naming the sha, looked for before posting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, assert_never

from pydantic import ValidationError

from bot.core import repo_config
from bot.core.diffmap import changed_line_count
from bot.core.evidence import held_out
from bot.core.ids import LoopId
from bot.core.models import ModelSpec, merged, thinking_params
from bot.core.record import LoopRecord, Reason, Status, Usage
from bot.core.rules import intake
from bot.core.rules.lifecycle import Guard, Requeue
from bot.core.rules.loop import sections
from bot.core.rules.pull import findings as flog
from bot.core.rules.pull.review import (
    NO_TEST,
    NO_TEST_FINGERPRINT,
    OWN_FINGERPRINTS,
    TESTS_CHANGED_FINGERPRINT,
    CodeAgain,
    CriticReport,
    MergeNext,
    NeedsHuman,
    Plan,
    StopLoop,
    answers,
    as_finding,
    evidence,
    evidence_finding,
    finding_ids,
    lapse_stale_dismissal,
    output_schema,
    place_findings,
    plan_after_review,
    plan_for_reviewed_head,
    review_body,
    tally,
    tests_changed_finding,
    tests_changed_stands,
)
from bot.core.rules.pull.review_check import check_run
from bot.core.rules.pull.same_change import carried_from, patch_digest
from bot.core.text import messages, prompts
from bot.core.text import metric as metric_text
from bot.io.attachments import Attachments
from bot.io.github import tally as github_tally
from bot.io.github.client import Installation
from bot.io.github.failures import GitHubError, Unavailable
from bot.io.github.pulls import PullInfo
from bot.io.logs import get_logger
from bot.io.store import Store
from jobs import lifecycle, precall
from jobs.check_runs import CheckRuns, Update
from jobs.retries import with_retries
from jobs.review.prompt import (
    MAX_DIFF_CHARS,
    SYSTEM,
    _ask_again,
    _prompt,
    _validated,
)
from jobs.review.tools import (
    ReviewCheckout,
    ReviewLimits,
    review_checkout,
    review_with_tools,
    tools_note,
)
from jobs.runtime import Runtime, current, instrumented
from jobs.spend import SpendGate
from jobs.tree.worktree import Worktrees

log = get_logger("loopbot.critic")
CHECK_NAME = "loopbot/critic"
HOLD_REVIEWING = 5.0  # seconds the "reviewing" check run waits for the verdict's
ATTEMPTS = 2
MAX_TOKENS = 8192  # of one review answer (within the model's output limit)
# A review that fails (GitHub or the model down past their clients' own retries) is run
# again from the start after these pauses; then the loop ends with ``critic_error``.
ERROR_ATTEMPTS = 3
ERROR_BACKOFF = (30.0, 120.0)
MOVED_ON = "the loop moved on during the review"
HEAD_READS = 3  # tries at reading a pull request's diff and head alike
FINAL_NOTE = (
    "every milestone passed its own section audit; this review judges the whole diff "
    "against the whole approved issue."
)


@instrumented("critic")
def run_critic(repo: str, issue: int) -> str:
    return Critic(current(), repo, issue).run()


class Critic:
    def __init__(self, rt: Runtime, repo: str, issue: int) -> None:
        self.rt, self.repo, self.issue = rt, repo, issue
        self.key = LoopId(repo, issue).key
        self.store: Store = rt.store
        self.system = SYSTEM  # with the repository's instructions once the review starts
        # The loop.yml's critic model and effort within the operator's list and ceiling,
        # and what the model accepts (the Models API), once the review starts.
        self.model = rt.settings.critic_model
        self.effort: str | None = rt.settings.effort
        self.spec: ModelSpec | None = None
        self._runs: CheckRuns | None = None  # the review's check run, once it starts
        self.spend: SpendGate | None = None  # the spend caps (jobs/spend.py), per review

    def run(self) -> str:
        """Review and act; never leave the loop in ``reviewing`` when the review fails for
        good. A retry is safe: the review is posted once per sha (its marker)."""
        try:
            return self._run_with_retries()
        finally:
            if self._runs is not None:  # an update still held goes before the job ends
                self._runs.flush()
            if self.spend is not None:  # a reservation no answer settled
                self.spend.release()

    def _run_with_retries(self) -> str:
        return with_retries(
            self._run_once,
            self._give_up,
            kind="critic",
            key=self.key,
            store=self.store,
            attempts=ERROR_ATTEMPTS,
            backoff=ERROR_BACKOFF,
        )

    def _give_up(self, error: str, attempts: int) -> str:
        record = self.store.get(self.key)
        if record is None or record.status != Status.REVIEWING:
            return f"critic error after the loop moved on: {error}"
        ended = lifecycle.finish(
            self.store,
            self.key,
            Status.FAILED,
            Reason.CRITIC_ERROR,
            messages.gave_up("review", error, attempts),
            guard=Guard.WHILE_REVIEWING,
            gh=self.rt.github.installation(record.installation_id),
            best_effort=True,  # GitHub may be what is failing; the record says it all
        )
        if ended is None:
            return f"critic error after the loop moved on: {error}"
        return "failed: critic_error"

    def _run_once(self) -> str:
        github_tally.enter("review")
        record = self.store.get(self.key)
        if record is None or record.status != Status.REVIEWING or record.pr_number is None:
            return "nothing to review"
        gh = self.rt.github.installation(record.installation_id)
        config = self.rt.config(gh, self.repo)
        # The review rules: the repository's instructions from its default branch, never
        # from the pull request, whose author is the agent under review.
        guidance = prompts.guidance(
            {path: gh.file(self.repo, path) for path in prompts.INSTRUCTION_FILES}, reviewer=True
        )
        self.system = f"{SYSTEM}\n\n{guidance}" if guidance else SYSTEM
        issue = gh.issue(self.repo, self.issue)
        try:
            pull, diff = self._head_and_diff(gh, record.pr_number)
            sha = pull.head_sha
        except GitHubError as exc:
            if exc.status != 406:
                raise
            # GitHub answers 406 when the diff passes 300 files, 20,000 lines or 1 MB: far
            # past what the critic reads whole (MAX_DIFF_CHARS), so a person reviews it.
            sha = gh.pull(self.repo, record.pr_number).head_sha
            self.store.event(self.key, "diff_too_large", sha=sha, error=str(exc)[:300])
            record = self._loop_check_written(gh, record, sha)
            gh.add_labels(self.repo, self.issue, [config.labels.needs_human])
            return self._finish(
                gh,
                Status.REFUSED,
                Reason.NEEDS_HUMAN,
                "the pull request's diff is too large for GitHub to return (over 300 files, "
                "20,000 lines or 1 MB), so loopbot cannot review it: a person must review "
                "and merge it",
            )
        earlier = record.verdicts.get(sha)
        if earlier is not None and earlier != "error":
            # A verdict belongs to a commit: asking again about the same head is how a
            # flip-flopping critic would override its own sev1. It stands until the head
            # changes, a writer dismisses the finding, or a person takes over.
            record = self._loop_check_written(gh, record, sha)
            return self._stands(gh, record, sha, earlier, diff, config)
        digest = patch_digest(diff)
        # A writer's edit or request that came after the catch-up's verify waits for a
        # turn: the approval of the old text does not carry over it (red team).
        if earlier is None and not self.store.feedback_waiting(self.key):
            own_sev1 = record.kind != "metric" and (
                evidence_finding(record.base_verify, record.tests_changed)
                or tests_changed_finding(record.test_evidence, sha) is not None
            )
            carried = carried_from(
                sha=sha,
                digest=digest,
                catch_up=record.catch_up,
                patches=record.patches,
                verdicts=record.verdicts,
                finding_log=record.finding_log,
                own_sev1=own_sev1,
                kind=record.kind,
            )
            if carried is not None:
                return self._carried(gh, record, sha, carried, digest, diff, config)
        # Reviewed again: the head's own check run, which the loop left to this job
        # (``LoopRecord.loop_check_waiting``), is written as the loop would have.
        record = self._loop_check_written(gh, record, sha)
        if record.catch_up.get("to") == sha:
            # A clean catch-up's steps were quiet (dropped at its job's end): the status
            # comment still shows what came before it (the gate's wait, say). It is
            # reviewed again, for as long as the model takes: say so (red team, issue 43).
            lifecycle.post_status(self.store, gh, record)
        round_ = record.critic_round + 1
        # Milestones: every section passed its own audit, so this review is the final audit.
        final = sections.final(record.sections)
        self.model = config.critic_model(self.rt.ceilings)
        self.effort = config.critic_effort(self.rt.ceilings)
        self.spec = self.rt.models.spec(self.model)  # UnknownModel: a setting to fix, no retry
        self.spend = SpendGate.of(self.rt.redis, self.rt.settings, record, config)
        self.store.event(
            self.key,
            "review_started",
            sha=sha,
            round=round_,
            model=self.model,
            effort=self.effort,
            **({"final_audit": True} if final else {}),
        )
        # Held a moment: a review that ends within it writes its check run once, with
        # the verdict (issue 43); a longer one shows "reviewing" meanwhile.
        # One per job, not per try: a failed try's held update is replaced by this one,
        # never left to go out after the verdict (red team).
        if self._runs is None:
            self._runs = CheckRuns(gh, self.repo, CHECK_NAME, lambda: None, self.key)
        self._runs.submit(
            Update(
                head_sha=sha,
                status="in_progress",
                title=f"{'final audit' if final else 'reviewing'} (round {round_})",
                summary=f"{'final audit' if final else 'reviewing'} (round {round_})",
                hold=HOLD_REVIEWING,
            )
        )
        # loopbot's own evidence finding is decided by its rule, not asked of the critic.
        asked = [
            e
            for e in flog.open_entries(record.finding_log)
            if e["fingerprint"] not in OWN_FINGERPRINTS
        ]
        # Frozen intake: the critic judges against the text a writer approved.
        try:
            with self._looking(gh, config, sha) as look:
                report = self._review(
                    *intake.approved_text(record, issue.title, issue.body),
                    diff,
                    asked=asked,
                    since=self._since(gh, record.reviewed_sha, sha),
                    facts=[
                        *evidence(
                            record.base_verify,
                            record.last_verify,
                            record.tests_changed,
                            sha,
                            record.test_evidence,
                        ),
                        *metric_text.critic_facts(record),  # a metric loop's results table
                    ],
                    look=look,
                    attached=self._attachments(gh, record),
                )
        except precall.OverBudget as exc:  # only a person can give the issue more
            gh.add_labels(self.repo, self.issue, [config.labels.needs_human])
            return self._finish(gh, Status.FAILED, Reason.BUDGET, str(exc))
        raised, given = list(report.findings), answers(report)
        if report.verdict != "error":
            # A metric loop's evidence is its results table, not a test of an issue.
            if record.kind != "metric" and evidence_finding(
                record.base_verify, record.tests_changed
            ):
                raised.append(NO_TEST)
            else:
                for e in flog.open_entries(record.finding_log):
                    if e["fingerprint"] == NO_TEST_FINGERPRINT:
                        given[e["id"]] = ("resolved", "the pull request now changes tests")
            # Held-out verify: loopbot's own sev1 while the evidence stands on this head.
            tampered = (
                tests_changed_finding(record.test_evidence, sha)
                if record.kind != "metric"
                else None
            )
            if tampered is not None:
                raised.append(tampered)
            else:
                for e in flog.open_entries(record.finding_log):
                    if e["fingerprint"] == TESTS_CHANGED_FINGERPRINT:
                        given[e["id"]] = (
                            "resolved",
                            "verify passes on this head with the tests as on the base",
                        )

        def merged(log: list[dict[str, Any]], next_id: int) -> flog.RoundResult:
            # A dismissal of other tests (an earlier head's) does not cover this head's.
            log = lapse_stale_dismissal(log, record.test_evidence, sha)
            return flog.merge_round(log, next_id, raised, given, round_=round_, sha=sha)

        result = merged(record.finding_log, record.next_finding)
        standing = [as_finding(e) for e in flog.blocking(result.log)]
        plan = plan_after_review(
            report,
            diff_lines=changed_line_count(diff),
            round_=round_,
            max_rounds=config.critic.max_rounds,
            large_diff_lines=config.critic.large_diff_lines,
            seen=record.sev1_rounds,
            unread_chars=max(len(diff) - MAX_DIFF_CHARS, 0),
            blocking=standing,
        )
        if not isinstance(plan, StopLoop) and tests_changed_stands(result.log):
            # The agent had its turn to fix the code instead (or the issue asked for the
            # test change): a person decides, whatever the critic thought of it.
            fid = next(
                (
                    str(e["id"])
                    for e in result.log
                    if e.get("fingerprint") == TESTS_CHANGED_FINGERPRINT
                ),
                "",
            )
            plan = NeedsHuman(held_out.person_detail(record.test_evidence, fid))
        shown = report.model_copy(update={"findings": raised})
        inline, others = place_findings(shown, diff, finding_ids(result.log))
        body = review_body(shown, others, round_, plan, result)
        if final:
            body = f"**Final audit** of the whole change: {FINAL_NOTE}\n\n{body}"
        # One review per reviewed head; a head whose review failed (error) gets its own.
        key = f"review:{sha}" if earlier is None else f"review:{sha}:{round_}"
        gh.post_review(
            self.repo,
            pull.number,
            key,
            sha,
            body,
            [{"path": c.path, "line": c.line, "side": "RIGHT", "body": c.body} for c in inline],
        )
        self._check(gh, sha, shown)

        def save(r: LoopRecord) -> None:
            # Merged again into the log as it is now: a /loop-dismiss that landed while the
            # model was reviewing is kept.
            now = merged(r.finding_log, r.next_finding)
            r.finding_log, r.next_finding = now.log, now.next_id
            r.verdicts = {**r.verdicts, sha: report.verdict}
            r.patches = {**r.patches, sha: digest}
            r.reviewed_sha = sha
            r.reviewed_whole = len(diff) <= MAX_DIFF_CHARS
            r.verdict = report.verdict
            r.findings = [e | {"sha": sha, "round": round_} for e in flog.open_entries(now.log)]
            r.critic_round = round_
            r.sev1_rounds = tally(r.sev1_rounds, report, standing)

        self.store.update(self.key, save)
        # One per review round, counted as the review shows them (loopbot's own evidence
        # finding included): the status comment's timeline and the session log read it.
        self.store.event(
            self.key,
            "reviewed",
            round=round_,
            sha=sha,
            pr=pull.number,
            verdict=report.verdict,
            sev1=shown.count("sev1"),
            sev2=shown.count("sev2"),
            sev3=shown.count("sev3"),
            inline=len(inline),
            new=result.new,
            recurring=result.recurring,
            still_open=result.still_open,
            resolved=result.resolved,
            **({"final_audit": True} if final else {}),
        )
        return self._act(gh, record, plan, config)

    def _head_and_diff(self, gh: Installation, number: int | None) -> tuple[PullInfo, str]:
        """The pull request and its diff, both of one head: the diff is read between two
        reads of the head, again when the head moved meanwhile (a push), so a verdict is
        never recorded for a head whose diff the critic did not read."""
        assert number is not None
        for _ in range(HEAD_READS):
            pull = gh.pull(self.repo, number)
            diff = gh.pull_diff(self.repo, number)
            if gh.pull(self.repo, number).head_sha == pull.head_sha:
                return pull, diff
        raise Unavailable("the pull request's head kept moving while its diff was read")

    def _stands(
        self,
        gh: Installation,
        record: LoopRecord,
        sha: str,
        verdict: str,
        diff: str,
        config: repo_config.RepoConfig,
    ) -> str:
        """``sha`` was reviewed already: act on that verdict, ask nothing, post nothing."""
        plan = plan_for_reviewed_head(
            verdict,
            record.finding_log,
            sha,
            diff_lines=changed_line_count(diff),
            large_diff_lines=config.critic.large_diff_lines,
            unread_chars=max(len(diff) - MAX_DIFF_CHARS, 0),
        )
        self.store.event(
            self.key, "review_skipped", sha=sha, verdict=verdict, plan=type(plan).__name__
        )
        if record.reviewed_sha != sha:
            self.store.set_fields(
                self.key,
                reviewed_sha=sha,
                verdict=verdict,
                reviewed_whole=len(diff) <= MAX_DIFF_CHARS,
            )
        return self._act(gh, record, plan, config)

    def _carried(
        self,
        gh: Installation,
        record: LoopRecord,
        sha: str,
        reviewed: str,
        digest: str,
        diff: str,
        config: repo_config.RepoConfig,
    ) -> str:
        """``sha`` makes the change approved on ``reviewed`` (the default branch merged
        in): the approval carries, the model is not asked, no review is posted (the one
        on ``reviewed`` says it). The check run on the new head says where it came from:
        a branch that requires it finds it on the head it merges."""
        github_tally.enter("carried")
        self.store.event(self.key, "review_carried", sha=sha, reviewed=reviewed)

        def save(r: LoopRecord) -> None:
            # This head's check run below says verify passed on it: the loop's, left to
            # this job, is not written (issue 43).
            r.loop_check_waiting = {}
            r.verdicts = {**r.verdicts, sha: "approve"}
            r.patches = {**r.patches, sha: digest}
            r.reviewed_sha = sha
            r.reviewed_whole = len(diff) <= MAX_DIFF_CHARS
            r.verdict = "approve"

        record = self.store.update(self.key, save)
        gh.upsert_check_run(
            self.repo,
            CHECK_NAME,
            sha,
            status="completed",
            conclusion="success",
            title=f"approve: the change approved on {reviewed[:10]}",
            summary=(
                f"This head makes the same change as {reviewed}, which the critic approved: "
                "the default branch was merged in and the pull request's own diff did not "
                f"change. verify passed again on this head (`{record.verify_command}`)."
            ),
        )
        plan = plan_for_reviewed_head(
            "approve",
            record.finding_log,
            sha,
            diff_lines=changed_line_count(diff),
            large_diff_lines=config.critic.large_diff_lines,
            unread_chars=max(len(diff) - MAX_DIFF_CHARS, 0),
        )
        return self._act(gh, record, plan, config)

    def _loop_check_written(self, gh: Installation, record: LoopRecord, sha: str) -> LoopRecord:
        """The loop's check run it left to this job (a clean catch-up's head, see
        ``jobs/loop/pull_request.py``), written on that head, as the loop would have:
        this job does not carry the approval there. None waiting: nothing to do."""
        return lifecycle.write_left_check(self.store, gh, record, sha)

    def _act(
        self, gh: Installation, record: LoopRecord, plan: Plan, config: repo_config.RepoConfig
    ) -> str:
        now = self.store.get(self.key)
        if now is None or now.status != Status.REVIEWING:
            # Cancelled, refused or restarted while the model was reviewing.
            return MOVED_ON
        match plan:
            case CodeAgain(findings=found):
                note = (
                    f"The reviewer found {len(found)} blocking (sev1) problem(s) in "
                    f"review round {record.critic_round + 1}."
                )
                if sections.final(now.sections):  # milestones: no section is rewound
                    note = prompts.final_audit_fix(len(found))
                if lifecycle.requeue(self.store, self.key, Requeue.FINDINGS, note=note) is None:
                    return MOVED_ON
                return "back to coding"
            case NeedsHuman(why=why):
                gh.add_labels(self.repo, self.issue, [config.labels.needs_human])
                return self._finish(gh, Status.REFUSED, Reason.NEEDS_HUMAN, why)
            case StopLoop(status=status, reason=reason, detail=detail):
                return self._finish(gh, status, reason, detail)
            case MergeNext() if not config.merge.enabled:
                return self._finish(
                    gh,
                    Status.COMPLETED,
                    Reason.PR_OPENED,
                    "reviewed; merging is disabled for this repository",
                )
            case MergeNext() if config.post_action is not None and not now.post_action:
                # One best-effort turn after the clean (final) audit, once per loop, on the
                # head just approved; the gate then accepts exactly its commit on top.
                pending = {"status": "pending", "base": now.reviewed_sha}

                def mark(r: LoopRecord) -> None:
                    r.post_action = pending

                queued = lifecycle.requeue(
                    self.store,
                    self.key,
                    Requeue.POST_ACTION,
                    note="post-action",
                    also=mark,
                    gh=gh,
                )
                return "post-action queued" if queued is not None else MOVED_ON
            case MergeNext():
                moved = lifecycle.advance(
                    self.store, self.key, Status.MERGING, came_from=frozenset({Status.REVIEWING})
                )
                return "merge gate queued" if moved else MOVED_ON
            case _:
                assert_never(plan)

    def _finish(self, gh: Installation, status: Status, reason: Reason, detail: str) -> str:
        # A cancel a person asked for while the model was reviewing stands.
        ended = lifecycle.finish(self.store, self.key, status, reason, detail, gh=gh)
        return MOVED_ON if ended is None else f"{status.value}: {reason.value}"

    def _since(self, gh: Installation, reviewed: str, sha: str) -> tuple[str, str] | None:
        """The diff from the last reviewed head to ``sha`` (base sha, diff), or None on the
        first review. GitHub may not have it (a force push dropped the old head, or it is
        too large): then the critic reads the whole diff alone, and is told so."""
        if not reviewed or reviewed == sha:
            return None
        try:
            return reviewed, gh.compare_diff(self.repo, reviewed, sha)
        except GitHubError as exc:
            self.store.event(self.key, "compare_failed", base=reviewed, head=sha, error=str(exc))
            return reviewed, ""

    def _review(
        self,
        title: str,
        body: str,
        diff: str,
        *,
        asked: list[dict[str, Any]] | None = None,
        since: tuple[str, str] | None = None,
        facts: list[str] | None = None,
        look: tuple[ReviewCheckout, str] | None = None,
        scope: str = "",
        attached: tuple[list[dict[str, Any]], str] = ([], ""),
    ) -> CriticReport:
        """Ask the model; ``asked``: open findings from earlier rounds it must answer for,
        ``since``: (last reviewed sha, diff from it), ``facts``: the loop's evidence,
        ``look``: a checkout of the head and the verify command, for the first attempt's
        read-only tools (an answer that does not validate is asked for again without)."""
        asked = asked or []
        ids = [str(e["id"]) for e in asked]
        blocks, section = attached
        text = _prompt(title, body, diff, asked, since, facts or [], scope=scope, attached=section)
        # The issue's images and PDFs before the words, as in the agent's first message.
        prompt: str | list[dict[str, Any]] = (
            [*blocks, {"type": "text", "text": text}] if blocks else text
        )
        messages_: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        problem = ""
        first = 0
        if look is not None:
            first = 1
            text = self._look(look, prompt, output_schema(ids))
            try:
                return _validated(text, ids)
            except (ValueError, ValidationError) as exc:
                problem = self._invalid(exc, 1)
                messages_ += _ask_again(text, problem)
        for attempt in range(first, ATTEMPTS):
            model = self.model
            request: dict[str, Any] = {
                "model": model,
                "max_tokens": min(MAX_TOKENS, self.spec.max_output) if self.spec else MAX_TOKENS,
                "system": [
                    {"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}
                ],
                "messages": messages_,
                "output_config": {"format": {"type": "json_schema", "schema": output_schema(ids)}},
            }
            if self.spec is not None:  # the effort joins the format in output_config
                request = merged(request, thinking_params(self.spec, self.effort))
            # The issue's budget, checked before the call: raises OverBudget instead.
            resp, _ = precall.call(
                self.rt.model,
                request,
                record=self.store.get(self.key),
                settings=self.rt.settings,
                charge=self._charge,
                spend=self.spend,
            )
            # Thinking blocks are not the answer; an answer asked for again is a new
            # exchange, where a past turn's thinking may be left out.
            text = "".join(b.text for b in resp.content if b.type == "text")
            try:
                return _validated(text, ids)
            except (ValueError, ValidationError) as exc:
                problem = self._invalid(exc, attempt + 1)
                messages_ += _ask_again(text, problem)
        return CriticReport(
            verdict="error",
            findings=[],
            summary=f"The critic's answer did not validate twice: {problem}",
        )

    # -- milestones: a section audit, called by the loop (jobs/loop/job.py) ------------------------

    def audit(
        self,
        config: repo_config.RepoConfig,
        guidance: str,
        title: str,
        body: str,
        diff: str,
        *,
        scope: str,
        asked: list[dict[str, Any]] | None = None,
    ) -> CriticReport:
        """One section's audit: the review's model call (schema, validation, the budget
        check before it, usage as the critic's) on a diff the loop made locally, with no
        pull request; ``scope`` says which section is judged. ``guidance``: the
        repository's instructions as a reviewer reads them (``prompts.guidance``).
        Raises ``precall.OverBudget`` as a review does."""
        self.model = config.critic_model(self.rt.ceilings)
        self.effort = config.critic_effort(self.rt.ceilings)
        self.spec = self.rt.models.spec(self.model)
        if (record := self.store.get(self.key)) is not None:
            self.spend = SpendGate.of(self.rt.redis, self.rt.settings, record, config)
        self.system = f"{SYSTEM}\n\n{guidance}" if guidance else SYSTEM
        return self._review(title, body, diff, asked=asked, scope=scope)

    def _invalid(self, exc: Exception, attempt: int) -> str:
        problem = str(exc).splitlines()[0][:300]
        log.warning("critic.invalid_answer", attempt=attempt, problem=problem, loop=self.key)
        self.store.event(self.key, "critic_invalid", attempt=attempt, problem=problem)
        return problem

    @contextlib.contextmanager
    def _looking(
        self, gh: Installation, config: repo_config.RepoConfig, sha: str
    ) -> Iterator[tuple[ReviewCheckout, str] | None]:
        """A throwaway checkout of the head for the critic's tools, or None when the
        repository turned them off."""
        if not config.critic.tools:
            yield None
            return
        token = gh.token()
        worktrees = Worktrees(self.rt.settings.data_dir)
        mirror = worktrees.sync_mirror(self.repo, gh.repo(self.repo).clone_url, token)
        with review_checkout(
            worktrees,
            self.repo,
            mirror,
            sha,
            settings=self.rt.settings,
            network=config.sandbox.network,
            timeout=config.sandbox.timeout_seconds,
            token=token,
        ) as checkout:
            yield checkout, config.verify

    def _attachments(
        self, gh: Installation, record: LoopRecord
    ) -> tuple[list[dict[str, Any]], str]:
        """The approved issue's attachments as the loop recorded them (jobs/loop/attachments.py):
        from this worker's store, or downloaded again where it has none; a file whose bytes
        now differ from what the writer approved is left out."""
        files = Attachments(self.rt.settings.data_dir, self.rt.settings.api_url)
        stored = files.approved(record)
        if stored is None:
            return [], ""
        if any(not files.path(self.key, a).is_file() for a in stored.files):
            files.again(self.key, stored, gh.issue_rendered(self.repo, self.issue)[2])
        return files.for_prompt(self.key, stored)

    def _charge(self, model: str, used: Usage) -> None:
        """A critic call's usage on the loop's record."""
        self.store.update(self.key, lambda r: r.record_usage(model, "critic", used))

    def _look(
        self,
        look: tuple[ReviewCheckout, str],
        prompt: str | list[dict[str, Any]],
        schema: dict[str, Any],
    ) -> str:
        """One review with read-only tools; usage recorded call by call."""
        checkout, verify = look
        limits = ReviewLimits()
        review = review_with_tools(
            self.rt.model,
            model=self.model,
            spec=self.spec,
            effort=self.effort,
            system=f"{self.system}\n\n{tools_note(limits, verify)}",
            prompt=prompt,
            schema=schema,
            checkout=checkout.path,
            sandbox=checkout.sandbox,
            verify_command=verify,
            limits=limits,
            after_tests=checkout.reset,
            # The issue's budget, checked before each call (raises OverBudget instead),
            # and every call charged, a lost one at its worst case (precall.call).
            send=lambda req, timeout: precall.call(
                self.rt.model,
                req,
                record=self.store.get(self.key),
                settings=self.rt.settings,
                charge=self._charge,
                timeout=timeout,
                spend=self.spend,
            ),
        )
        self.store.event(
            self.key,
            "critic_looked",
            steps=review.steps,
            tool_calls=review.tool_calls,
            stopped=review.stopped,
            cost_usd=round(review.cost, 6),
        )
        return (review.error and "") or review.text

    def _check(self, gh: Installation, sha: str, report: CriticReport) -> None:
        run = check_run(report)
        if self._runs is None:
            self._runs = CheckRuns(gh, self.repo, CHECK_NAME, lambda: None, self.key)
        self._runs.send(
            Update(
                head_sha=sha,
                status="completed",
                conclusion=run.conclusion,
                title=run.title,
                summary=report.summary,
                annotations=tuple(run.annotations),
            )
        )
