"""The loop job: labelled issue → worktree → agent turns → verify → pull request.

One RQ job per issue (its id derived from repo and issue) and, inside it, a Redis lease
renewed on a wall-clock timer, so exactly one worker runs a loop however often GitHub
or the reconciler asks. Every turn's commit is pushed at once: a worker that dies loses
at most the turn in progress.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

import anthropic

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.models import ModelSpec, thinking_params
from bot.core.record import ACTIVE, LoopRecord, Reason, Status, intake_hash
from bot.core.rules import budget, discussion, intake, nested_guidance, sections
from bot.core.rules import metric as metric_rules
from bot.core.rules import turns as transitions
from bot.core.rules.lifecycle import Requeue
from bot.core.rules.merge import protected_changes
from bot.core.rules.review import Answer, CriticReport
from bot.core.text import messages, prompts
from bot.core.text.defuse import one_line
from bot.io.github.client import IssueInfo, PullInfo
from bot.io.github.failures import GitHubError, new_error_id, public_error
from bot.io.logs import get_logger
from bot.io.store import FencedStore, LeaseLost, Store
from jobs import evidence, lifecycle, metric_loop, plan, precall, triage
from jobs.agent import MAX_TOKENS, Agent, Limits, Outcome
from jobs.critic import Critic
from jobs.drain import DRAIN
from jobs.models import UnknownModel
from jobs.runtime import Runtime, current, instrumented
from jobs.sandbox.bwrap import Sandbox, SandboxUnavailable
from jobs.tools import ToolBox
from jobs.worktree import Checkout, GitError, Worktrees, files_at

log = get_logger("loopbot.loop")

LEASE_TTL = 60.0
LEASE_LOST = "lease lost: another worker took this loop over"
MAX_ERRORS = 3
CHECK_NAME = "loopbot"


@instrumented("loop")
def run_loop(repo: str, issue: int) -> str:
    """RQ entry point."""
    return LoopRunner(current(), repo, issue).run()


class Lease:
    """Holds the loop's lease and renews it every ``ttl / 3`` seconds on its own thread.

    Renewal does not depend on the agent producing output: a long model call or a slow
    verify keeps the lease; a dead process loses it within ``ttl``.

    The lease also counts itself lost once ``ttl`` has passed (monotonic clock) since the
    last renewal that succeeded, whatever the reason renewals failed (Redis unreachable, a
    network partition, a paused VM): by then Redis may have let another worker take it.
    ``check()`` raises ``LeaseLost`` then, and every write the loop makes calls it first.
    """

    def __init__(self, store: Store, key: str, ttl: float = LEASE_TTL) -> None:
        self.store, self.key, self.ttl = store, key, ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewed_at = time.monotonic()  # when the last successful renewal was *sent*
        self._why = ""

    def acquire(self) -> bool:
        sent = time.monotonic()
        if not self.store.take_lease(self.key, self.owner, self.ttl):
            return False
        self._renewed_at = sent
        self._thread = threading.Thread(target=self._renew, daemon=True, name="lease")
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            sent = time.monotonic()  # measured before the call: Redis' TTL starts later
            try:
                if not self.store.renew_lease(self.key, self.owner, self.ttl):
                    self._mark_lost("another worker holds the lease")
                    return
                self._renewed_at = sent
            except Exception:  # noqa: BLE001 - Redis blips: keep trying until the TTL says lost
                log.warning("lease.renew_failed", loop=self.key)
                if self.is_lost():
                    return

    def _mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            self._why = why
            self.lost.set()
            log.warning("lease.lost", loop=self.key, owner=self.owner, why=why)

    def is_lost(self) -> bool:
        if not self.lost.is_set() and time.monotonic() - self._renewed_at >= self.ttl:
            self._mark_lost(f"no successful renewal for {self.ttl:g}s")
        return self.lost.is_set()

    def check(self) -> None:
        """Raise ``LeaseLost`` if this worker may no longer hold the lease: call before a write.

        Asks Redis who holds the lease (one GET); when Redis cannot answer, the clock since
        the last successful renewal decides.
        """
        if not self.is_lost():
            try:
                holder: str | None = self.store.lease_holder(self.key)
            except Exception:  # noqa: BLE001 - Redis unreachable: is_lost() above decides
                holder = self.owner
            if holder != self.owner:
                self._mark_lost("another worker holds the lease" if holder else "it expired")
        if self.lost.is_set():
            raise LeaseLost(f"{self.key}: {self._why}")

    def release(self) -> None:
        self._stop.set()
        try:
            self.store.release_lease(self.key, self.owner)
        except Exception:  # noqa: BLE001 - the TTL frees it anyway
            log.warning("lease.release_failed", loop=self.key)


class LoopRunner:
    def __init__(self, rt: Runtime, repo: str, issue: int) -> None:
        self.rt = rt
        self.repo = repo
        self.issue_number = issue
        self.key = LoopId(repo, issue).key
        self.store = rt.store
        self.log = log.bind(repo=repo, issue=issue, loop=self.key)
        self.worktrees = Worktrees(rt.settings.data_dir)
        self._verify_tail = ""
        self.guidance = ""  # the repository's instructions (prompts.guidance), set at start
        self._check_runs: dict[str, int] = {}  # head sha -> our check run there
        self._push: tuple[_Background, int, str] | None = None
        # Milestones: the next prompt gives the current section's whole text (a new
        # section, or a new job on the conversation), else a one-line reminder.
        self._section_full = True
        self._review_guidance: str | None = None  # the reviewer's, read once per job

    # -- entry -------------------------------------------------------------------------------

    def run(self) -> str:
        record = self.store.get(self.key)
        if record is None or record.status not in ACTIVE:
            return f"nothing to run ({record.status.value if record else 'no record'})"
        lease = Lease(self.store, self.key, self.rt.settings.lease_ttl)
        if not lease.acquire():
            return "another worker holds this loop"
        self.lease = lease
        # Every store write from here on checks the lease (record writes atomically in Redis).
        self.store = FencedStore(self.store.redis, self.key, lease.owner, lease.check)
        try:
            try:
                return self._run(record)
            except (GitHubError, GitError, SandboxUnavailable, anthropic.APIError, OSError) as exc:
                return self._error(exc)
        except LeaseLost as exc:
            # Another worker may own the loop now: write nothing more, not even the error.
            self.log.warning("lease.lost", owner=lease.owner, error=str(exc))
            return LEASE_LOST
        finally:
            self.store = self.rt.store
            lease.release()

    def _error(self, exc: Exception) -> str:
        """Count a failure against the loop's error budget; retry through RQ or give up."""
        # The full error (message, paths) goes to the log and the loop's event stream, both
        # for operators; the record's detail, shown in public comments, gets a short reason
        # and the id that finds the rest.
        error_id = new_error_id()
        self.log.exception("loop.error", error_id=error_id)
        internal = f"{type(exc).__name__}: {exc}"[:500]
        detail = public_error(exc, error_id)
        record = self.store.update(self.key, lambda r: _inc_error(r, detail))
        self.store.event(
            self.key, "error", error=internal, error_id=error_id, count=record.error_count
        )
        if record.error_count >= MAX_ERRORS:
            self._finish(Status.FAILED, Reason.ERRORS, detail)
            return "failed: " + detail
        raise exc  # RQ retries the job (see enqueue in jobs.dispatch)

    def _cancelled(self) -> bool:
        return self.lease.lost.is_set() or self.store.cancel_requested(self.key) is not None

    # -- the loop ------------------------------------------------------------------------------

    def _run(self, record: LoopRecord) -> str:
        gh = self.rt.github.installation(record.installation_id)
        self.gh = gh
        lifecycle.running(self.store, self.key, self.lease.owner)
        repo_info = gh.repo(self.repo)
        try:
            config, clamped = repo_config.load(
                gh.file(self.repo, repo_config.CONFIG_PATH), self.rt.ceilings
            )
        except repo_config.ConfigError as exc:
            gh.upsert_comment(
                self.repo,
                self.issue_number,
                "config-error",
                messages.config_error(exc.problems, record.started_by),
            )
            return self._finish(Status.FAILED, Reason.BAD_CONFIG, "; ".join(exc.problems))
        self.config = config
        # The repository's instructions, read once from the default branch: never from the
        # worktree, where the agent could write its own.
        self.guidance = prompts.guidance(
            {path: gh.file(self.repo, path) for path in prompts.INSTRUCTION_FILES}
        )
        if clamped:
            # Edited in place, never repeated: the same key on every run.
            gh.upsert_comment(
                self.repo,
                self.issue_number,
                repo_config.CLAMPED_COMMENT_KEY,
                repo_config.clamped_comment(clamped),
            )
            self.store.event(self.key, "config_clamped", notes=clamped)
        # One budget over the issue's life (bot/core/rules/budget.py); the record keeps the limits
        # for the status comment and the dashboard.
        self.budget = budget.Budget.of(config, self.rt.ceilings)
        self._set(
            max_turns=config.max_turns,
            verify_command=config.verify,
            budget_limits=self.budget.limits(),
        )
        self._status_comment()

        # Readiness triage (jobs/triage.py): before the first turn ever, once per approved
        # text, and before any git or sandbox work: an issue with no checkable outcome, or
        # too large, is refused uncoded and costs one small call. Metric loops have their
        # own preconditions instead.
        if record.kind != "metric" and (
            stop := triage.before_coding(self.rt, gh, self.store, self._record(), config)
        ):
            return self._finish(Status.REFUSED, stop.reason, stop.detail)
        token = gh.token()
        mirror = self.worktrees.sync_mirror(self.repo, repo_info.clone_url, token)
        checkout = self.worktrees.checkout(
            self.repo, self.issue_number, record.branch, repo_info.default_branch, mirror
        )
        self.store.event(
            self.key, "worktree_ready", path=str(checkout.path), resumed=checkout.resumed
        )
        sandbox = Sandbox(
            checkout.path,
            settings=self.rt.settings,
            network=config.sandbox.network,
            timeout=config.sandbox.timeout_seconds,
            readonly=(mirror,),
        )
        try:
            return self._prepared(record, sandbox, checkout, repo_info.default_branch, token)
        finally:
            sandbox.close()

    def _prepared(
        self, record: LoopRecord, sandbox: Sandbox, checkout: Checkout, base: str, token: str
    ) -> str:
        config = self.config
        self.checkout = checkout
        self.sandbox = sandbox
        if config.setup and not checkout.resumed:
            self._set(phase="setup")
            result = sandbox.run(config.setup)
            self.store.event(self.key, "setup", exit_code=result.exit_code, seconds=result.seconds)
            if (problem := sandbox.worktree_problem()) is not None:
                return self._over_limit(f"setup: {problem}")
        if record.sync_base:
            self._sync_base(base, token)
        if not record.base_verify:
            self._base_verify(checkout)
        model = config.agent_model(self.rt.ceilings)
        try:
            spec = self.rt.models.spec(model)
        except UnknownModel:
            return self._finish(
                Status.FAILED,
                Reason.BAD_CONFIG,
                f"the model `{model}` is unknown to the Anthropic API (see `loopbot doctor`)",
            )
        effort = config.agent_effort(self.rt.ceilings)
        self.store.event(
            self.key,
            "model",
            model=model,
            window=spec.window,
            max_output=spec.max_output,
            thinking="adaptive" if spec.adaptive else "off",
            effort=effort,
            known=spec.known,
        )
        agent = Agent(
            self.rt.model,
            model,
            ToolBox(checkout.path, sandbox),
            verify=config.verify,
            network=bool(config.sandbox.network),
            protected=config.merge.protected_paths,
            fallback_model=self.rt.settings.fallback_model,
            cancelled=self._cancelled,
            draining=DRAIN.is_set,
            on_step=lambda n, what: self.store.event(self.key, "step", step=n, tool=what),
            resources=sandbox.worktree_problem,
            on_event=lambda kind, data: self.store.event(self.key, kind, **data),
            window=spec.window,
            window_of=self._window_of,
            threshold=self.rt.settings.context_threshold,
            params_for=self._params_for(effort),
            max_tokens=_max_tokens(spec),
        )
        if self.guidance:
            agent.system += "\n\n" + self.guidance
        # The stored conversation's thinking blocks are tied to the model that wrote them.
        agent.last_model = record.conversation_model or None
        if record.kind == "metric":  # a metric loop (labels.optimize): jobs/metric_loop.py
            return metric_loop.run(self, agent, base)
        return self._turns(agent, base)

    def _window_of(self, model: str) -> int:
        """A model's context window (the agent's fallback model's, when it is called)."""
        try:
            return self.rt.models.spec(model).window
        except UnknownModel:
            return self.rt.settings.context_window

    def _params_for(self, effort: str | None) -> Callable[[str], dict[str, Any]]:
        """Thinking and effort for each model the agent calls (its fallback too)."""

        def params(model: str) -> dict[str, Any]:
            try:
                return thinking_params(self.rt.models.spec(model), effort)
            except UnknownModel:
                return {}  # the call itself then says the model is unknown

        return params

    def _turns(self, agent: Agent, base: str) -> str:
        if self._record().post_action.get("status") == "pending":  # after the final audit
            if not self.store.feedback_waiting(self.key):
                return self._post_action(agent, base)
            # A maintainer asked for changes on the approved pull request before the
            # post-action began: those first; the post-action follows the next clean review.
            self._post_action_feedback(deferred=True)
        conversation = self.store.conversation(self.key)
        failure = self._record().resume_note if conversation else ""
        while True:
            if self.lease.lost.is_set():
                return LEASE_LOST
            if DRAIN.is_set():
                return self._handoff(failure)
            record = self._record()
            issue = self.gh.issue(self.repo, self.issue_number)
            step = self._before_turn(record, issue, self.config.max_turns)
            if isinstance(step, str):
                return step
            if (ended := self._sections_ready(record, issue, first=not conversation)) is not None:
                return ended
            smallest = budget.smallest_call(agent.model, MAX_TOKENS)
            if out := budget.before_turn(self.budget, budget.Spent.of(record), smallest):
                return self._finish(Status.FAILED, Reason.BUDGET, out.detail)
            turn = step.turn
            record = self.store.update(self.key, transitions.started(turn))
            # Where the turn begins in the conversation: the session log splits it there.
            self.store.event(
                self.key,
                "turn_started",
                turn=turn,
                total=record.total_turns,  # ``turn`` starts over after a review round
                messages=len(conversation),
            )
            self.store.count("turns")
            self._status_comment()
            news = self._news(record, base, first=not conversation)
            if not conversation:
                title, body = intake.approved_text(record, issue.title, issue.body)
                prompt = prompts.issue_prompt(
                    self.repo,
                    self.issue_number,
                    title,
                    body,
                    self.config.verify,
                    record.base_verify,
                    extra=(*news.sections, *self._section_extra(record)),
                )
            else:
                prompt = prompts.continuation(
                    turn,
                    failure or "Continue.",
                    self.store.take_feedback(self.key),
                    self._blocking_findings(record),
                    extra=(*news.sections, *self._section_extra(record)),
                )
            limits = Limits(
                step_cap=self.config.step_cap,
                tool_budget=self.config.tool_budget,
                budget=self.budget,
                spent=budget.Spent.of(record),
                stall_timeout=self.rt.settings.stall_timeout,
            )
            ignored_before = self.worktrees.ignored_files(self.checkout)
            outcome = agent.run_turn(conversation, prompt, limits)
            if self.lease.lost.is_set():
                # Presumed dead and taken over: the other worker owns the record now.
                return LEASE_LOST
            self.store.save_conversation(self.key, conversation)
            if agent.last_model and agent.last_model != record.conversation_model:
                self._set(conversation_model=agent.last_model)
            self._delivered(news, turn)  # only once the prompt is in the saved conversation
            self._record_usage(outcome)
            if outcome.end not in ("finished", "text_only", "shutdown"):
                self.store.event(
                    self.key, "turn_capped", turn=turn, reason=outcome.end, detail=outcome.detail
                )
            if outcome.end == "shutdown":
                self._commit_and_push(turn, outcome)  # keep what the turn did
                return self._handoff(
                    f"Your worker shut down in the middle of turn {turn}; what you had "
                    "changed is committed. Carry on from there."
                )
            if outcome.end == "model_refused":  # going on would be refused again
                self._commit_and_push(turn, outcome)  # keep what the turn did
                return self._finish(Status.FAILED, Reason.MODEL_REFUSED, outcome.detail)
            cut = transitions.cut_short(outcome.end)
            if cut is not None and outcome.end == "resource_limit":
                return self._over_limit(outcome.detail)
            if cut is not None:
                self._commit_and_push(turn, outcome)  # keep what the turn did
                self._refresh_pull(outcome)
                return self._stop(cut, outcome.detail)
            # verify must judge the commit: files the agent left where git does not look
            # (ignored paths) would count for verify and never reach the pull request.
            hidden = self.worktrees.purge_ignored(self.checkout, ignored_before)
            if hidden:
                self.store.event(self.key, "ignored_removed", turn=turn, paths=hidden[:50])
            self._commit_and_push(turn, outcome)
            head = self.worktrees.head(self.checkout.path, self.checkout.mirror)
            self._set(phase="verifying")
            verify = self.sandbox.run(self.config.verify)  # while the push runs
            self._pushed()
            if (problem := self.sandbox.worktree_problem()) is not None:
                return self._over_limit(f"verify: {problem}")
            self._verify_tail = verify.output[-prompts.TAIL_CHARS :]
            record = self._record()
            result = {
                "turn": turn,
                "total": record.total_turns,  # the turn over the issue's life, as people count
                "passed": verify.passed,
                "exit_code": verify.exit_code,
                "seconds": round(verify.seconds, 3),
                "timed_out": verify.timed_out,
                "sha": head,
            }
            changed = self.worktrees.tree_changed(self.checkout)
            tests = (
                evidence.tests_changed(self.worktrees.files_with_added_lines(self.checkout))
                if changed
                else []
            )
            idle = 0 if changed else record.idle_turns + 1
            self._set(last_verify=result, idle_turns=idle, tests_changed=tests)
            # The output's tail too: the session log shows what verify said, turn by turn.
            self.store.event(self.key, "verify", **result, tail=self._verify_tail)
            if not changed:
                self.store.event(self.key, "no_change", turn=turn, idle_turns=idle)
            record = self._record()
            self._turn_completed(turn, outcome)
            after = transitions.after_turn(
                end=outcome.end,
                verify_passed=verify.passed,
                has_changes=changed,
                cost=record.cost_usd,
                max_cost=self.config.max_cost_usd,
                verify_tail=self._verify_tail,
                idle_turns=idle,
                base_passed=record.base_verify.get("passed") if record.base_verify else None,
                tests_changed=tests,
                test_asked=(
                    not (changed and verify.passed)
                    or bool(tests)
                    or not evidence.needs_test(record.base_verify)
                    or self._tests_asked()
                    or record.kind == "metric"  # its evidence is the results table
                ),
            )
            if not isinstance(after, transitions.Verified):  # _open_pull writes it then
                self._refresh_pull(outcome)
            match after:
                case transitions.Stop():
                    return self._stop(after)
                case transitions.Verified():
                    audited = self._section_audit(head)  # milestones: audit before going on
                    if isinstance(audited, str):
                        return audited
                    if audited is None:
                        return self._open_pull(base, outcome)
                    failure = audited.note
                    self._status_comment()
                    continue
                case transitions.AskForTest():  # a Continue that asks for a test first
                    self.store.event(self.key, "test_requested", turn=turn, sha=head)
                case transitions.Continue():
                    pass
                case _:
                    assert_never(after)
            failure = after.failure
            if hidden:
                failure += (
                    "\n\nloopbot removed files you left in paths git ignores ("
                    + ", ".join(hidden[:5])
                    + (", …" if len(hidden) > 5 else "")
                    + "): they never reach the commit, so verify ran without them."
                )
            self._status_comment()

    def _turn_completed(self, turn: int, outcome: Outcome) -> None:
        """The turn's event: how it ended, its steps, calls, cost and where time went."""
        self.store.event(
            self.key,
            "turn_completed",
            turn=turn,
            end=outcome.end,
            steps=outcome.steps,
            tool_calls=outcome.tool_calls,
            cost_usd=round(outcome.cost, 6),
            model_seconds=round(outcome.model_seconds, 4),
            tool_seconds=round(outcome.tool_seconds, 4),
        )

    def _before_turn(
        self, record: LoopRecord, issue: IssueInfo, max_turns: int
    ) -> transitions.RunTurn | str:
        """The rules before every turn (bot/core/rules/turns.py): the turn to run, or how
        the loop ended (issue closed, the loop's label gone, cancelled, out of turns, or
        the approved text edited by someone who may not approve it: then a comment says
        how to approve it again)."""
        label = self.config.labels.of_kind(record.kind)
        step = transitions.before_turn(
            turn=record.turn,
            max_turns=max_turns,
            issue_open=issue.open,
            has_label=label in issue.labels,
            cancel=self.store.cancel_requested(self.key),
            intake_edited=intake.edited(record, issue.title, issue.body),
        )
        match step:
            case transitions.Stop(reason=reason):
                if reason == Reason.ISSUE_EDITED:
                    # The comment asks a writer to approve the text as it reads now: their
                    # next label is that confirmation (jobs.dispatch._unconfirmed).
                    self.store.ask_confirmation(self.key, intake_hash(issue.title, issue.body))
                    self.gh.upsert_comment(
                        self.repo,
                        self.issue_number,
                        intake.COMMENT_KEY,
                        intake.stopped_comment("", label),
                    )
                return self._stop(step)
            case transitions.RunTurn():
                return step
            case _:
                assert_never(step)

    # -- milestones: sections, section audits, post_action (bot/core/rules/sections.py) -------

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

    def _post_action_feedback(self, *, deferred: bool) -> None:
        """A maintainer's request on the pull request waits: coding turns follow (they
        read it), then a review of the new head, instead of the gate."""
        self.store.event(self.key, "post_action_feedback", deferred=deferred)
        self._set(
            turn=0,  # a person asked for another go, as a restart does
            resume_note="A maintainer asked for changes on the pull request after its review.",
            **({"post_action": {}} if deferred else {}),
        )

    def _post_action(self, agent: Agent, base: str) -> str:
        """``post_action.prompt``: one best-effort turn after a clean final audit, on the
        approved head. Committed as ``loop(post-action): …`` and pushed only when verify
        passes on it and it touches no protected path and stays small; otherwise dropped
        (the unpushed commit reset away) and the gate gets the approved head as it was.
        Its summary is kept either way. Never audited again: the gate accepts exactly this
        one commit on top of the reviewed sha (``bot.core.rules.merge.post_action_head``)."""
        record = self._record()
        pa = dict(record.post_action)
        reviewed = str(pa.get("base") or "")
        head = self.worktrees.head(self.checkout.path, self.checkout.mirror)
        instruction = self.config.post_action.prompt if self.config.post_action else ""

        def settle(status: str, **more: Any) -> None:
            now = {**pa, "status": status, **more}
            self._set(post_action=now)
            self.store.event(
                self.key,
                "post_action",
                status=status,
                base=reviewed,
                sha=now.get("sha", ""),
                why=now.get("why", ""),
            )

        if not instruction:
            settle("none", why="loop.yml has no post_action any more")
            return self._after_post_action()
        if head != reviewed or not self.worktrees.is_clean(self.checkout):
            settle("failed", why="the branch is not at the approved head")
            return self._after_post_action()
        if self._cancelled():
            return self._finish(Status.CANCELLED, Reason.CANCELLED)
        spent = budget.Spent.of(record)
        smallest = budget.smallest_call(agent.model, MAX_TOKENS)
        if out := budget.before_turn(self.budget, spent, smallest):
            settle("failed", why=out.detail)  # best effort: the reviewed change stands
            return self._after_post_action()
        self._set(phase="post_action")
        self.store.update(self.key, _count_turn)
        self.store.event(self.key, "post_action_started", base=reviewed)
        self._status_comment()
        conversation = self.store.conversation(self.key)
        limits = Limits(
            step_cap=self.config.step_cap,
            tool_budget=self.config.tool_budget,
            budget=self.budget,
            spent=spent,
            stall_timeout=self.rt.settings.stall_timeout,
        )
        ignored_before = self.worktrees.ignored_files(self.checkout)
        outcome = agent.run_turn(conversation, prompts.post_action(instruction), limits)
        if self.lease.lost.is_set():
            return LEASE_LOST
        self.store.save_conversation(self.key, conversation)
        self._record_usage(outcome)
        if outcome.end in ("cancelled", "shutdown"):
            self.worktrees.drop_to(self.checkout, reviewed)
            self.sandbox.adopt()
            if outcome.end == "shutdown":  # still pending: the next worker runs it again
                return self._handoff("")
            return self._finish(Status.CANCELLED, Reason.CANCELLED)
        summary = self.gh.redact(outcome.text.strip())[:1000]
        why = "" if outcome.end in ("finished", "text_only") else f"the turn ended: {outcome.end}"
        sha: str | None = None
        if not why:
            self.worktrees.purge_ignored(self.checkout, ignored_before)
            first = one_line(self.gh.redact((summary.splitlines() or ["post-action"])[0])[:60])
            sha = self.worktrees.commit_all(self.checkout, f"loop(post-action): {first}")
        if sha is not None and not why:
            why = self._post_action_problem(reviewed, sha)
        verify: Any = None
        if sha is not None and not why:
            verify = self.sandbox.run(self.config.verify)
            if (problem := self.sandbox.worktree_problem()) is not None:
                why = f"verify: {problem}"
            elif not verify.passed:
                why = f"`{self.config.verify}` failed with it (exit {verify.exit_code})"
        if why:
            self.worktrees.drop_to(self.checkout, reviewed)
            self.sandbox.adopt()
            settle("dropped", why=why, summary=summary, sha="")
        elif sha is None:
            settle("none", summary=summary, why="it changed nothing")
        else:
            self.lease.check()
            self.worktrees.push(self.checkout, self.gh.token())
            self._set(
                head_sha=sha,
                last_verify={
                    "turn": record.turn,
                    "total": record.total_turns,
                    "passed": True,
                    "exit_code": verify.exit_code,
                    "seconds": round(verify.seconds, 3),
                    "timed_out": verify.timed_out,
                    "sha": sha,
                },
            )
            settle("kept", sha=sha, summary=summary)
            self._check_run(
                "completed", conclusion="success", title="post-action verified", new_head=True
            )
        self._refresh_pull(outcome)
        if self.store.feedback_waiting(self.key):  # asked while the post-action ran
            self._post_action_feedback(deferred=False)
            return self._turns(agent, base)
        return self._after_post_action()

    def _post_action_problem(self, reviewed: str, sha: str) -> str:
        """Why the post-action commit may not stand, or "": it is never reviewed, so it
        may not touch a protected path or grow past a small change."""
        touched = self.worktrees.numstat_between(self.checkout, reviewed, sha)
        hit = protected_changes([p for p, _ in touched], self.config.merge.protected_paths)
        if hit:
            return "it changed protected paths: " + ", ".join(hit[:5])
        # A binary file has no line count to bound it, and nobody could read it anyway.
        if binary := [p for p, n in touched if n is None]:
            return "it changed binary files: " + ", ".join(binary[:5])
        lines = sum(n or 0 for _, n in touched)
        if lines > POST_ACTION_MAX_LINES:
            return f"it changed {lines} lines (a post-action may change {POST_ACTION_MAX_LINES})"
        return ""

    def _after_post_action(self) -> str:
        if not self.config.merge.enabled:
            return self._finish(
                Status.COMPLETED,
                Reason.PR_OPENED,
                "reviewed; merging is disabled for this repository",
            )
        if not self._advance(Status.MERGING):
            return "post-action done; the loop was cancelled meanwhile"
        return "post-action done; merge gate queued"

    def _news(self, record: LoopRecord, base: str, *, first: bool) -> _News:
        """What the agent has not been given yet, as prompt sections: the maintainers'
        comments on the issue, and the nested AGENTS.md for the files it changed.

        In the first prompt (``first``: an empty conversation) everything counts as new,
        whatever the record says was delivered: a conversation lost with its worker took
        what it was given with it.
        """
        comments = self._discussion(set() if first else set(record.comments_delivered))
        guidance = self._nested_guidance(set() if first else set(record.guidance_delivered))
        return _News(
            first=first,
            comments=comments,
            guidance=tuple(guidance),
            sections=(
                prompts.discussion(comments, first=first),
                prompts.nested_guidance(guidance, base),
            ),
        )

    def _discussion(self, delivered: set[int]) -> discussion.Selection:
        """The issue's comments not delivered yet that may go to the agent: by people who
        can write (asked once per author per turn, and only for comments that pass the
        other rules), within the prompt's room (bot/core/rules/discussion.py)."""
        pending = discussion.candidates(self.gh.comments(self.repo, self.issue_number), delivered)
        writes = {
            login: self.gh.can_write(self.repo, login) for login in discussion.authors(pending)
        }
        return discussion.fit(discussion.by_writers(pending, writes))

    def _nested_guidance(self, delivered: set[str]) -> list[nested_guidance.Guidance]:
        """The nearest AGENTS.md below the root for each file the branch changed, not
        delivered yet, read from the default branch in the mirror (``checkout.base_sha``):
        never from the worktree, where the agent may have written its own."""
        checkout = self.checkout
        if not self.worktrees.changed_since_base(checkout):
            return []
        changed = self.worktrees.changed_files(checkout)
        wanted = nested_guidance.candidates(changed)
        if not wanted:
            return []
        present = files_at(checkout.mirror, checkout.base_sha, wanted)
        new = [p for p in nested_guidance.nearest(changed, present) if p not in delivered]
        return nested_guidance.fit({p: present[p] for p in new})

    def _delivered(self, news: _News, turn: int) -> None:
        """Record what the turn's prompt gave the agent, so no later prompt repeats it;
        the events name the comments and files, never their text."""
        comment_ids, paths = news.comments.ids, [g.path for g in news.guidance]
        if not comment_ids and not paths and not news.first:
            return

        def apply(r: LoopRecord) -> None:
            # A first prompt starts the record's lists over: its conversation is new.
            old_ids = [] if news.first else r.comments_delivered
            old_paths = [] if news.first else r.guidance_delivered
            r.comments_delivered = sorted({*old_ids, *comment_ids})
            r.guidance_delivered = sorted({*old_paths, *paths})

        self.store.update(self.key, apply)
        if comment_ids:
            self.store.event(
                self.key,
                "discussion",
                turn=turn,
                count=len(news.comments.shown),
                ids=[c.id for c in news.comments.shown],
                left_out=list(news.comments.dropped),
            )
        if paths:
            self.store.event(self.key, "nested_guidance", turn=turn, paths=paths)

    def _base_verify(self, checkout: Checkout) -> None:
        """Run verify on the base commit before the agent's first change (or take the
        cached result for this base), so every later stage knows what it said then.

        A slow or timed-out verify is evidence ("failed (timed out)"), never a failure
        of the loop. Only a checkout still at the base, with nothing of the agent's in
        it, can give that evidence.
        """
        head = self.worktrees.head(checkout.path, checkout.mirror)
        if head != checkout.base_sha or (
            checkout.resumed and not self.worktrees.is_clean(checkout)
        ):
            self.store.event(self.key, "base_verify_skipped", sha=checkout.base_sha, head=head)
            return
        self._set(phase="verifying_base")
        cache = evidence.BaseVerifyCache(self.rt.redis)
        key = evidence.cache_key(
            self.repo,
            head,
            self.config.verify,
            self.config.setup,
            [self.config.sandbox.network, self.config.sandbox.timeout_seconds],
        )
        found = cache.get(key)
        if found is not None:
            result = {**found, "sha": head, "cached": True}
        else:
            clean = self.worktrees.is_clean(checkout)
            result = evidence.outcome(self.sandbox.run(self.config.verify), head)
            if clean and not self.worktrees.is_clean(checkout):
                # What verify wrote (reports, snapshots) is not the agent's change.
                self.worktrees.restore_committed(checkout)
                self.sandbox.adopt()
            if evidence.cacheable(result):
                self.lease.check()
                cache.put(key, result)
        self._set(base_sha=head, base_verify=result)
        self.store.event(
            self.key, "base_verify", **{k: v for k, v in result.items() if k != "tail"}
        )

    def _tests_asked(self) -> bool:
        """Whether this loop already gave the agent its one turn to add a test (an event,
        so a resumed loop does not ask twice)."""
        after = "-"
        while True:
            events = self.store.events(self.key, after=after)
            if any(e.get("kind") == "test_requested" for e in events):
                return True
            if len(events) < 1000:
                return False
            after = events[-1]["id"]

    def _over_limit(self, detail: str) -> str:
        """Stop for a resource limit, dropping what was not committed: committing it would
        make git read all of it, and a restart would meet it again."""
        try:
            self.worktrees.discard_uncommitted(self.checkout)
        except GitError:
            # Git cannot clean what it cannot see (paths past PATH_MAX): drop the whole
            # worktree; every commit is pushed, and a restart recreates it from there.
            self.worktrees.remove(self.repo, self.issue_number)
        return self._finish(Status.FAILED, Reason.RESOURCE_LIMIT, detail)

    def _sync_base(self, base: str, token: str) -> None:
        """Merge the default branch in, as the gate asked after a conflict."""
        conflicted = self.worktrees.merge_base_in(self.checkout, base)
        self.sandbox.adopt()  # the merge wrote files as the worker
        if conflicted:
            note = (
                f"The pull request conflicts with `{base}`. The harness merged `{base}` into "
                "your branch; these files have conflict markers: "
                + ", ".join(f"`{p}`" for p in conflicted)
                + f". Resolve them, keeping what both sides meant, so `{self.config.verify}` "
                "passes; the merge is committed with your changes."
            )
        else:
            # Git merged it alone: push now, since the turn may change nothing more.
            self.lease.check()
            self.worktrees.push(self.checkout, token)
            note = (
                f"The pull request was behind `{base}`; the harness merged `{base}` into "
                f"your branch without conflicts. Check that `{self.config.verify}` still "
                "passes, and fix what the merge broke."
            )
        self._set(sync_base=False, resume_note=note)
        self.store.event(self.key, "base_merged", base=base, conflicts=conflicted)

    def _handoff(self, note: str) -> str:
        """The worker is shutting down: leave the loop, pushed and saved, to another one.

        ``note`` is what the next turn's prompt says (the pending verify failure, if any).
        The reconciler of any live worker resumes it at once (see ``jobs.drain``).
        """
        self._pushed()
        lifecycle.requeue(
            self.store,
            self.key,
            Requeue.HANDOFF,
            note=note,
            by=self.lease.owner,
            gh=self.gh,
            tail=self._verify_tail,
        )
        return "handed over: the worker is shutting down"

    # -- steps -----------------------------------------------------------------------------------

    def _commit_and_push(self, turn: int, outcome: Outcome) -> str | None:
        """Commit now; push in the background while verify runs.

        The push (seconds, against GitHub) overlaps verify and the next turn's start.
        ``_pushed()`` waits for it before anything that needs the remote branch: the
        next push, the pull request, the end of the loop.
        """
        # The commit lands on GitHub too: no secret of the worker's in its subject, and no
        # issue reference GitHub would cross-link from a pushed commit (defused).
        summary = one_line(
            self.gh.redact((outcome.text.strip().splitlines() or ["changes"])[0])[:72]
        )
        sha = self.worktrees.commit_all(self.checkout, f"loop(turn-{turn}): {summary}")
        sha = self._keep_results_table() or sha
        if sha is None:
            return None
        self._pushed()
        self.lease.check()  # a push is a write: not after the lease is gone
        token = self.gh.token()
        # Only git on the thread: GitHub calls stay on the job's thread and its client.
        self._push = (_Background(lambda: self.worktrees.push(self.checkout, token)), turn, sha)
        return sha

    def _keep_results_table(self) -> str | None:
        """A metric loop's ``loop-results.tsv`` is the harness's, written from the record:
        a fix turn after the pull request opened (findings, checks, a conflict) that
        changed it gets it restored in a commit of its own. The new head, or None."""
        record = self._record()
        if record.kind != "metric" or not record.metric_done:  # iterations commit their own
            return None
        table = metric_rules.tsv(metric_rules.rows_of(record.metric_results))
        restored = self.worktrees.commit_file(
            self.checkout,
            metric_rules.TSV_NAME,
            table,
            f"loop: {metric_rules.TSV_NAME} as measured (the results are the harness's)",
        )
        if restored is not None:
            self.sandbox.adopt()
            self.store.event(self.key, "results_table_restored", sha=restored)
        return restored

    def _pushed(self) -> None:
        """Wait for the background push, then report it; its failure fails the turn."""
        if self._push is None:
            return
        (push, turn, sha), self._push = self._push, None
        push.join()
        self.lease.check()
        self._set(head_sha=sha)
        self.store.event(self.key, "pushed", turn=turn, sha=sha)
        self._check_run("in_progress", title=f"turn {turn}: verified", new_head=True)

    def _open_pull(self, base: str, outcome: Outcome) -> str:
        self._pushed()
        record = self._record()
        if not self.worktrees.tree_changed(self.checkout):
            # Never an empty pull request, whatever path led here.
            return self._finish(
                Status.FAILED,
                Reason.NO_CHANGES,
                "the branch is identical to the base branch: there is nothing to propose, "
                "so no pull request was opened",
            )
        self._set(phase="opening_pr")
        issue = self.gh.issue(self.repo, self.issue_number)
        summary = outcome.text
        if record.pr_number is not None:
            summary = pull_summary(self.gh.pull(self.repo, record.pr_number), outcome.text)
        body = pull_body(record, summary, self.worktrees.diff_stat(self.checkout))
        self.lease.check()
        pull = self.gh.open_pull(
            self.repo,
            record.branch,
            base,
            record.approved_title or issue.title,
            body,
            closes=self.issue_number,
        )
        self._set(pr_number=pull.number, pr_url=pull.html_url, head_sha=pull.head_sha)
        # Opened once; a later verified turn (a review fix) updates the same pull request.
        opened = "pr_opened" if record.pr_number != pull.number else "pr_updated"
        self.store.event(self.key, opened, pr=pull.number, sha=pull.head_sha)
        self._check_run(
            "completed", conclusion="success", title=f"verify passed on turn {record.turn}"
        )
        if self.config.critic.enabled or self.config.merge.enabled:
            stage = Status.REVIEWING if self.config.critic.enabled else Status.MERGING
            if not self._advance(stage):
                return f"pull request #{pull.number} opened; the loop was cancelled meanwhile"
            job = "critic" if stage is Status.REVIEWING else "merge gate"
            return f"pull request #{pull.number} opened; {job} queued"
        return self._finish(Status.COMPLETED, Reason.PR_OPENED, f"pull request #{pull.number}")

    def _refresh_pull(self, outcome: Outcome) -> None:
        """The pull request stays true: after a later turn (a review fix, a checks or a
        conflict fix) its body shows the turns, cost and last verify as they are now.
        The summary on top stays what the agent wrote when it opened the pull request."""
        record = self._record()
        if record.pr_number is None:
            return
        pull = self.gh.pull(self.repo, record.pr_number)
        if pull.state != "open":
            return
        body = pull_body(
            record, pull_summary(pull, outcome.text), self.worktrees.diff_stat(self.checkout)
        )
        self.lease.check()
        self.gh.update_pull(
            self.repo, pull.number, body=body, closes=self.issue_number, current=pull
        )

    def _blocking_findings(self, record: LoopRecord) -> list[dict[str, Any]]:
        return [f for f in record.findings if f.get("severity") == "sev1" and not f.get("resolved")]

    # -- record, status comment, check run -------------------------------------------------------

    def _record(self) -> LoopRecord:
        record = self.store.get(self.key)
        assert record is not None
        return record

    def _set(self, **fields: Any) -> LoopRecord:
        return self.store.set_fields(self.key, **fields)

    def _record_usage(self, outcome: Outcome) -> None:
        def apply(r: LoopRecord) -> None:
            for model, usage in outcome.usage:
                r.record_usage(model, "agent", usage)

        self.store.update(self.key, apply)

    def _advance(self, stage: Status) -> bool:
        """On to the critic or the gate: the status comment says so before the job runs.
        False when a cancel landed meanwhile (it stands)."""
        moved = lifecycle.advance(
            self.store,
            self.key,
            stage,
            came_from=frozenset({Status.RUNNING}),
            gh=self.gh,
            tail=self._verify_tail,
        )
        return moved is not None

    def _stop(self, stop: transitions.Stop, fallback: str = "") -> str:
        """End as a turn rule said; ``fallback`` is the detail when the rule gives none."""
        return self._finish(stop.status, stop.reason, stop.detail or fallback)

    def _finish(self, status: Status, reason: Reason, detail: str = "") -> str:
        self._pushed()
        self.lease.check()
        # A cancel that landed meanwhile wins (unless the loop completed): a person asked.
        ended = lifecycle.finish(
            self.store,
            self.key,
            status,
            reason,
            detail,
            gh=self.gh,
            tail=self._verify_tail,
            best_effort=True,
        )
        record = ended or self._record()
        if ended is None:
            # The cancel's end stands; the stream still closes with the loop's last word.
            self.store.event(
                self.key,
                "loop_finished",
                status=record.status.value,
                reason=record.reason,
                detail=record.detail,
                turn=record.turn,
            )
        self.log.info("loop.finished", status=record.status.value, reason=record.reason)
        try:
            if ended is None:
                self._status_comment()  # the cancel's, with what this job did last
            if record.reason == Reason.BUDGET.value:
                # Only a person can give the issue more: ask for one.
                self.gh.add_labels(self.repo, self.issue_number, [self.config.labels.needs_human])
            if record.head_sha and status != Status.COMPLETED:
                self._check_run(
                    "completed",
                    conclusion=_conclusion(record.status),
                    title=f"{record.status.value}: {record.reason}",
                )
        except GitHubError:
            self.log.warning("loop.final_report_failed")
        return f"{record.status.value}: {record.reason}"

    def _status_comment(self) -> None:
        lifecycle.post_status(self.store, self.gh, self._record(), self._verify_tail)

    def _check_run(
        self,
        status: str,
        *,
        conclusion: str | None = None,
        title: str = "",
        new_head: bool = False,
    ) -> None:
        record = self._record()
        if not record.head_sha:
            return
        summary = messages.status_line(record)
        run = self.gh.upsert_check_run(
            self.repo,
            CHECK_NAME,
            record.head_sha,
            status=status,
            conclusion=conclusion,
            title=title or record.phase,
            summary=summary,
            known_id=self._check_runs.get(record.head_sha),
            new_head=new_head,
        )
        self._check_runs[record.head_sha] = run.id


@dataclass(frozen=True)
class _News:
    """What one turn's prompt gives the agent for the first time (``LoopRunner._news``)."""

    first: bool  # the conversation's first prompt
    comments: discussion.Selection
    guidance: tuple[nested_guidance.Guidance, ...]
    sections: tuple[str, ...]  # as the prompt shows them; "" for an empty one


@dataclass(frozen=True)
class _SectionNext:
    """A section audit's outcome that goes on coding: what the next prompt says first."""

    note: str


POST_ACTION_MAX_LINES = 300  # a post-action is never reviewed: a small change or none


def _count_turn(r: LoopRecord) -> None:
    r.total_turns += 1


class _Background:
    """Run ``fn`` on a thread; ``join()`` waits and re-raises what it raised."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="push")
        self._thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to join()
            self._error = exc

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def _max_tokens(spec: ModelSpec) -> int:
    """The agent's output limit per call, never above what the model allows. Thinking
    shares it with the answer; a reply cut by it is continued or retried larger
    (``bot.core.rules.agent_stop``), so the usual limit stays small for the budget's
    worst case."""
    return min(MAX_TOKENS, spec.max_output)


def _inc_error(r: LoopRecord, detail: str) -> None:
    r.error_count += 1
    r.detail = detail


def _conclusion(status: Status) -> str:
    return {Status.CANCELLED: "cancelled", Status.COMPLETED: "success"}.get(status, "failure")


TABLE_HEAD = "| turns | cost | verify |"


def pull_body(record: LoopRecord, summary: str, stat: str) -> str:
    """The pull request's body: the agent's summary, then the numbers as they are now."""
    tests = ", ".join(f"`{p}`" for p in record.tests_changed[:20]) or "none"
    if len(record.tests_changed) > 20:
        tests += f" and {len(record.tests_changed) - 20} more"
    last = record.last_verify
    verify = "passed" if last.get("passed") else evidence.describe(last)
    # The issue's turns so far: ``record.turn`` starts over after each review round.
    turns = max(record.total_turns, record.turn)
    return (
        f"{messages.safe_text(summary.strip()) or 'Changes made by loopbot.'}\n\n"
        f"{TABLE_HEAD}\n|---|---|---|\n"
        f"| {turns} | ${record.cost_usd:.2f} | `{record.verify_command}` {verify} |\n\n"
        f"Evidence: {evidence.evidence_line(record.base_verify, record.last_verify)}; "
        f"tests changed: {tests}.\n\n"
        + _milestone_lines(record)
        + "<details><summary>diff stat</summary>\n\n"
        f"{messages.code_block(stat.strip(chr(10)).rstrip())}\n</details>\n\n"
        "<sub>Opened by loopbot. `/loop <request>` on this PR asks for another turn.</sub>"
    )


def _milestone_lines(record: LoopRecord) -> str:
    """The pull request body's milestones and post-action lines ("" for neither)."""
    out = ""
    if record.sections:
        done = sum(1 for s in record.sections if s.get("done"))
        audited = sum(
            1
            for s in record.sections
            if s.get("done") and not s.get("preticked") and not s.get("unaudited")
        )
        out += (
            f"Milestones: {done} of {len(record.sections)} done, {audited} of them audited "
            "on their own (sections ticked in the issue, or worked with the critic off, are "
            "not).\n\n"
        )
    pa = record.post_action
    if pa.get("status") in ("kept", "dropped", "none"):
        said = messages.safe_text(str(pa.get("summary") or "").strip()) or "(no summary)"
        what = {
            "kept": f"committed as {str(pa.get('sha', ''))[:12]}, not reviewed again",
            "dropped": f"dropped: {messages.safe_text(str(pa.get('why', '')))}",
            "none": "no change",
        }[str(pa["status"])]
        out += f"Post-action ({what}): {said}\n\n"
    return out


def pull_summary(pull: PullInfo, fallback: str) -> str:
    """The summary on top of the body loopbot wrote for ``pull`` (``pull_body``), to keep
    it when the numbers below are refreshed; ``fallback`` when the body is not that."""
    text = (pull.body or "").partition("\n\n")[2]  # after loopbot's own "Closes #N"
    summary, found, _ = text.rpartition("\n\n" + TABLE_HEAD)
    return summary.strip() if found and summary.strip() else fallback
