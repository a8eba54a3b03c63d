"""The loop job: labelled issue → worktree → agent turns → verify → pull request.

One RQ job per issue (its id derived from repo and issue) and, inside it, a Redis lease
renewed on a wall-clock timer, so exactly one worker runs a loop however often GitHub
or the reconciler asks. Every turn's commit is pushed at once: a worker that dies loses
at most the turn in progress.

"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_never

import anthropic

from bot.core import openai_models, repo_config
from bot.core.models import ModelSpec, thinking_params
from bot.core.record import ACTIVE, LoopRecord, Reason, Status, intake_hash
from bot.core.rules import intake, push_refusal
from bot.core.rules.loop import budget
from bot.core.rules.loop import turns as transitions
from bot.core.text import messages, prompts
from bot.io.attachments import Attachments
from bot.io.github import tally
from bot.io.github.failures import GitHubError, new_error_id, public_error
from bot.io.github.issues import IssueInfo
from bot.io.github.pace import waited_here
from bot.io.logs import get_logger
from bot.io.store import FencedStore, LeaseLost
from jobs import lifecycle, precall
from jobs.agents import mcp
from jobs.agents.agent import MAX_TOKENS, Agent, Limits, Outcome, TurnAgent
from jobs.agents.backends import CLI_BACKENDS
from jobs.agents.cli import CliAgent
from jobs.agents.cli import turn_limit as cli_turn_limit
from jobs.agents.tools import ToolBox
from jobs.drain import DRAIN
from jobs.intake import triage
from jobs.loop import attachments as loop_attachments
from jobs.loop import evidence, setup_phase
from jobs.loop import metric as metric_loop
from jobs.loop.base_verify import BaseVerify
from jobs.loop.handover import Handover
from jobs.loop.held_out import HeldOut
from jobs.loop.lease import Lease, silence_bound
from jobs.loop.news import TurnNews
from jobs.loop.post_action import PostAction
from jobs.loop.pull_request import PullRequests
from jobs.loop.runner import LEASE_LOST, PushStop
from jobs.loop.section_audits import SectionAudits, _AllAudited, _SectionNext, resumed_outcome
from jobs.loop.setup_phase import SetupPhase
from jobs.models import UnknownModel
from jobs.runtime import current, instrumented
from jobs.sandbox.bwrap import Sandbox, SandboxUnavailable
from jobs.spend import SpendGate
from jobs.tree.worktree import Checkout, GitError, PushRefused

log = get_logger("loopbot.loop")


MAX_ERRORS = 3
DEFAULT_STEP_TIMEOUT = repo_config.SandboxConfig().timeout_seconds  # loop.yml's default


@instrumented("loop")
def run_loop(repo: str, issue: int) -> str:
    """RQ entry point."""
    return LoopRunner(current(), repo, issue).run()


class LoopRunner(SectionAudits, PostAction, BaseVerify, HeldOut, PullRequests, Handover, TurnNews):
    """One loop job: the lease, the worktree and sandbox, the turns. Its parts are the
    classes it extends (see ``jobs.loop.runner``)."""

    def run(self) -> str:
        record = self.store.get(self.key)
        if record is None or record.status not in ACTIVE:
            return f"nothing to run ({record.status.value if record else 'no record'})"
        settings = self.rt.settings
        lease = Lease(
            self.store,
            self.key,
            settings.lease_ttl,
            # Until loop.yml is read: the default step timeout (``_run`` sets the repo's).
            max_silence=silence_bound(
                DEFAULT_STEP_TIMEOUT, settings.stall_timeout, settings.lease_ttl
            ),
        )
        if not lease.acquire():
            return "another worker holds this loop"
        self.lease = lease
        # Every store write from here on checks the lease (record writes atomically in Redis).
        self.store = FencedStore(self.store.redis, self.key, lease.owner, lease.check)
        try:
            try:
                return self._run(record)
            except PushStop as stop:
                return self._push_stopped(stop.refusal, repeated=stop.repeated)
            except PushRefused as exc:  # a push the harness made itself (a merge, a fix)
                self._settle_push()
                return self._push_stopped(exc.refusal)
            except (GitHubError, GitError, SandboxUnavailable, anthropic.APIError, OSError) as exc:
                # The last turn's push first: reported if it landed, and its own failure
                # (logged) not raised again by the error's end (``_finish`` waits for it).
                self._settle_push()
                return self._error(exc)
        except LeaseLost as exc:
            # Another worker may own the loop now: write nothing more, not even the error.
            self.log.warning("lease.lost", owner=lease.owner, error=str(exc))
            return LEASE_LOST
        finally:
            self._settle_push()
            self._checks_written()
            if self.spend is not None:  # a reservation no call's answer settled
                self.spend.release()
            self.store = self.rt.store
            lease.release()

    def _push_stopped(self, refusal: push_refusal.Refusal, *, repeated: bool = False) -> str:
        """The loop ends ``push_refused``: GitHub's words (defused) and what the
        maintainer can do are the loop's detail, on the issue."""
        detail = push_refusal.maintainer_detail(refusal, repeated=repeated)
        return self._finish(Status.FAILED, Reason.PUSH_REFUSED, detail)

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

    def _run(self, record: LoopRecord) -> str:
        tally.enter("start")  # its config, the status comment, the worktree, setup
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
        if record.task_loop:  # a scheduled task's `loop:` settings (docs/repositories.md)
            config, lowered = repo_config.with_task(config, record.task_loop, self.rt.ceilings)
            clamped = [*clamped, *lowered]
        if record.approved_backend:  # a writer's loop:agent-<name> label
            config, picked = repo_config.with_backend(
                config, record.approved_backend, self.rt.ceilings
            )
            clamped = [*clamped, *picked]
        if config.agent.mcp_servers and config.agent.backend not in CLI_BACKENDS:
            clamped = [
                *clamped,
                "`agent.mcp_servers`: the built-in agent does not start MCP servers "
                "(docs/repositories.md#mcp-servers), so this loop runs without them; "
                "`agent.backend: claude-code`, "
                "`opencode` or `codex` starts them",
            ]
        self.config = config
        stall = self.rt.settings.stall_timeout
        step = float(config.sandbox.timeout_seconds)
        if config.agent.backend in CLI_BACKENDS:  # a CLI's whole turn is one command
            step = max(step, cli_turn_limit(stall))
        self.lease.max_silence = silence_bound(step, stall, self.lease.ttl)
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
        # One budget over the issue's life (bot/core/rules/loop/budget.py); the record keeps the
        # limits for the status comment and the dashboard.
        self.budget = budget.Budget.of(config, self.rt.ceilings)
        self._set(
            max_turns=config.max_turns,
            verify_command=config.verify,
            budget_limits=self.budget.limits(),
            backend=config.agent.backend,
        )
        # The spend caps above the loop (jobs/spend.py): a loop that could not make even
        # the smallest call waits, queued, instead of starting and stopping.
        self.spend = SpendGate.of(
            self.rt.redis, self.rt.settings, record, config, config.agent.backend
        )
        if full := self.spend.room(budget.smallest_call(self.rt.settings.model, MAX_TOKENS)):
            return self._hold_for_spend(full)
        # Catching up with the base branch (the gate found it moved): a clean merge
        # goes on to the critic and the gate without a turn, and the gate's edit shows
        # how it ended; a conflict or a failing verify starts a turn, which shows it.
        self._status_comment(quiet=record.sync_base and record.pr_number is not None)

        # The approved text's attachments, while their signed URLs live (jobs/loop/attachments.py).
        got = loop_attachments.read(
            Attachments(self.rt.settings.data_dir, self.rt.settings.api_url),
            gh,
            self.store,
            self._record(),
            self.repo,
        )
        if isinstance(got, loop_attachments.Changed):
            label = config.labels.of_kind(record.kind)
            gh.upsert_comment(
                self.repo, self.issue_number, intake.COMMENT_KEY, intake.stopped_comment("", label)
            )
            detail = "attached files changed after a writer approved them: " + ", ".join(got.names)
            return self._stop(transitions.Stop(Status.CANCELLED, Reason.ISSUE_EDITED, detail))
        self.given = got

        # Readiness triage (jobs/intake/triage.py): before the first turn ever, once per approved
        # text, and before any git or sandbox work: an issue with no checkable outcome, or
        # too large, is refused uncoded and costs one small call. Metric loops have their
        # own preconditions instead.
        if record.kind != "metric" and (
            stop := triage.before_coding(
                self.rt, gh, self.store, self._record(), config, spend=self.spend
            )
        ):
            return self._finish(Status.REFUSED, stop.reason, stop.detail)
        # Rules on the loop's branch that would refuse its first push (creation restricted,
        # signed commits required): stop before any git, sandbox or model work.
        rules = None if record.head_sha else gh.branch_rules(self.repo, record.branch)
        if rules and (refused := push_refusal.branch_rules_stop(rules, record.branch, new=True)):
            return self._finish(Status.FAILED, Reason.PUSH_REFUSED, refused)
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
            # A CLI backend reads the attachments there, read-only, outside the worktree.
            readonly=(mirror, *self.given.folders()),
        )
        setup = None
        if config.setup:  # its own sandbox: its network, the repository's caches
            setup = SetupPhase(
                checkout.path,
                settings=self.rt.settings,
                network=(
                    config.sandbox.network if config.setup_network is None else config.setup_network
                ),
                timeout=config.sandbox.timeout_seconds,
                readonly=(mirror,),
                cache=setup_phase.cache_dir(
                    self.rt.settings.data_dir,
                    record.installation_id,
                    repo_info.id,
                    self.repo,
                ),
            )
        self.setup_phase = setup
        try:
            return self._prepared(record, sandbox, checkout, repo_info.default_branch, token)
        finally:
            sandbox.close()
            if setup is not None:
                setup.close()

    def _prepared(
        self, record: LoopRecord, sandbox: Sandbox, checkout: Checkout, base: str, token: str
    ) -> str:
        config = self.config
        self.checkout = checkout
        self.sandbox = sandbox
        if config.setup and not checkout.resumed:
            self._set(phase="setup")
            result = self._harness(config.setup, setup=True)
            self.store.event(
                self.key,
                "setup",
                exit_code=result.exit_code,
                seconds=result.seconds,
                cache_emptied=bool(self.setup_phase and self.setup_phase.emptied),
            )
            if (problem := sandbox.worktree_problem()) is not None:
                return self._over_limit(f"setup: {problem}")
        if config.agent.mcp_servers and config.agent.backend in CLI_BACKENDS:
            checked = mcp.check(sandbox, config.agent.mcp_servers)
            self.store.event(
                self.key,
                "mcp_checked",
                servers={c.name: list(c.tools) or c.problem for c in checked},
            )
            problems = [c.problem for c in checked if c.problem]
            if problems:
                self.gh.upsert_comment(
                    self.repo,
                    self.issue_number,
                    "config-error",
                    messages.config_error(problems, record.started_by),
                )
                return self._finish(Status.FAILED, Reason.BAD_CONFIG, "; ".join(problems))
        if record.sync_base:
            self._sync_base(base, token)
        if not record.base_verify:
            self._base_verify(checkout)
        model = config.agent_model(self.rt.ceilings)
        codex = config.agent.backend == "codex"  # OpenAI's model, not Anthropic's
        try:
            spec = (
                openai_models.spec(model, self.rt.settings.context_window)
                if codex
                else self.rt.models.spec(model)
            )
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
        agent: TurnAgent
        backend = CLI_BACKENDS.get(config.agent.backend)
        if backend is not None:  # a CLI inside the sandbox: jobs/agents/cli.py
            agent = backend(
                client=self.rt.openai if codex else self.rt.model,
                model=model,
                spec=spec,
                effort=effort,
                max_tokens=_max_tokens(spec),
                sandbox=sandbox,
                store=self.store,
                key=self.key,
                guard=self._openai_guard if codex else self._gateway_guard,
                verify=config.verify,
                network=bool(config.sandbox.network),
                cancelled=self._cancelled,
                draining=DRAIN.is_set,
                on_event=lambda kind, data: self.store.event(self.key, kind, **data),
                on_step=lambda n, what: self.store.event(self.key, "step", step=n, tool=what),
            )
        else:
            agent = self._builtin_agent(model, spec, effort, sandbox, checkout)
        agent.spend = self.spend
        if isinstance(agent, CliAgent):
            agent.mcp_servers = dict(config.agent.mcp_servers)
        if self.guidance:
            agent.system += "\n\n" + self.guidance
        if isinstance(agent, Agent):  # images and PDFs in its first message
            agent.attachments = self.given.blocks
        # The stored conversation's thinking blocks are tied to the model that wrote them.
        agent.last_model = record.conversation_model or None
        if record.kind == "metric":  # a metric loop (labels.optimize): jobs/loop/metric.py
            return metric_loop.run(self, agent, base)
        return self._turns(agent, base)

    def _gateway_guard(self, request: dict[str, Any]) -> budget.Call:
        """The budget check the model gateway makes before each of the backend's calls."""
        return precall.guard(
            self.rt.model, request, self._record(), self.rt.settings, spend=self.spend
        )

    def _openai_guard(self, request: dict[str, Any]) -> budget.Call:
        """The same for Codex's calls, counted near the edge by OpenAI's token count."""
        return precall.guard(
            None,
            request,
            self._record(),
            self.rt.settings,
            count=self.rt.openai.count,
            spend=self.spend,
        )

    def _builtin_agent(
        self, model: str, spec: ModelSpec, effort: str | None, sandbox: Sandbox, checkout: Checkout
    ) -> Agent:
        config = self.config
        return Agent(
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

    def _turns(self, agent: TurnAgent, base: str) -> str:
        if self._record().post_action.get("status") == "pending":  # after the final audit
            if not self.store.feedback_waiting(self.key):
                return self._post_action(agent, base)
            # A maintainer asked for changes on the approved pull request before the
            # post-action began: those first; the post-action follows the next clean review.
            self._post_action_feedback(deferred=True)
        conversation = self.store.conversation(self.key)
        if conversation and self._record().base_clean:
            merged = self._merged_base_verified(base, conversation)
            if merged is not None:
                return merged
        failure = self._record().resume_note if conversation else ""
        if conversation:  # resumed: a verified head may want its section audit first
            match self._resumed_sections(conversation):
                case str() as stopped:
                    return stopped
                case _AllAudited():
                    # Resumed past the held-out check (a worker killed after verify)?
                    head = self.worktrees.head(self.checkout.path, self.checkout.mirror)
                    issue = self.gh.issue(self.repo, self.issue_number)
                    approved = intake.approved_text(self._record(), issue.title, issue.body)
                    failure = self._tests_changed_to_pass(head, None, *approved)
                    if not failure:
                        return self._open_pull(base, resumed_outcome(conversation))
                    self._status_comment()
                case _SectionNext(note=first_note):
                    failure = first_note
                    self._status_comment()
                case None:
                    if standing := self._standing_note(reserve=len(failure) + 2):
                        failure = f"{failure}\n\n{standing}" if failure else standing
        while True:
            if self.lease.lost.is_set():
                return LEASE_LOST
            if DRAIN.is_set():
                return self._handoff(failure)
            tally.enter("turn")
            self._pushed(wait=False)  # the last turn's push, if it has ended since verify
            # A refusal GitHub gave it is this turn's first news (``_refused``); one found
            # later, at this turn's commit, is the next turn's, before anything is pushed.
            failure = self._harness_notes(failure)
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
                # Seconds this job has waited for GitHub's pace so far (bench/fleet.py
                # takes them out of loopbot's own overhead per turn).
                github_wait=round(waited_here(), 3),
            )
            self.store.count("turns")
            if not conversation:
                title, shown = intake.approved_shown(record, issue.title, issue.body)
                if shown.removed:
                    # What the writer could not see on GitHub's page is not sent; the
                    # status comment says so, so nothing goes silently.
                    self.store.event(
                        self.key,
                        "hidden_text_removed",
                        turn=turn,
                        comments=shown.comments,
                        chars=shown.chars,
                    )
            self._status_comment()
            news = self._news(record, base, first=not conversation)
            if not conversation:
                prompt = prompts.issue_prompt(
                    self.repo,
                    self.issue_number,
                    title,
                    shown.text,
                    self.config.verify,
                    record.base_verify,
                    extra=(
                        self.given.section(cli=self.config.agent.backend in CLI_BACKENDS),
                        *news.sections,
                        *self._section_extra(record),
                    ),
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
            if isinstance(agent, Agent):  # a writer's comment's images, with its words
                agent.pending = list(news.blocks)
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
            if cut is not None and outcome.end == "cancelled":
                # A person asked to stop: nothing more reaches GitHub. What the turn did is
                # committed here only; a restart on this worker goes on from it.
                kept = self.worktrees.commit_all(self.checkout, f"loop(turn-{turn}): cancelled")
                if kept is not None:
                    self.store.event(self.key, "cancelled_unpushed", turn=turn, sha=kept)
                return self._stop(cut, outcome.detail)
            if cut is not None:
                self._commit_and_push(turn, outcome)  # keep what the turn did
                self._refresh_pull(outcome)
                return self._stop(cut, outcome.detail)
            # verify must judge the commit: files the agent left where git does not look
            # (ignored paths) would count for verify and never reach the pull request.
            hidden = self.worktrees.purge_ignored(self.checkout, ignored_before)
            if hidden:
                self.store.event(self.key, "ignored_removed", turn=turn, paths=hidden[:50])
            self._restore_setup(ignored_before, turn)
            committed = self._commit_and_push(turn, outcome)
            head = committed or self.worktrees.head(self.checkout.path, self.checkout.mirror)
            self._set(phase="verifying")
            verify = self._harness(self.config.verify)  # while the push runs
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
            changed = self.worktrees.tree_changed(self.checkout, head)
            tests = (
                evidence.tests_changed(self.worktrees.files_with_added_lines(self.checkout, head))
                if changed
                else []
            )
            idle = 0 if changed else record.idle_turns + 1
            self._set(last_verify=result, idle_turns=idle, tests_changed=tests)
            # The output's tail too: the session log shows what verify said, turn by turn.
            self.store.event(self.key, "verify", **result, tail=self._verify_tail)
            # The push, if it has ended (else at the next turn's start, or its commit):
            # after verify's result is recorded, so a verified head's check run is held
            # for the pull request's (``_pushed``).
            self._pushed(wait=False)
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
            if verify.passed:
                # What follows (an audit, the pull request) needs the head on GitHub; a
                # refusal of it is another turn for the agent (``_refused``).
                self._pushed()
            if self._refusal_note and not isinstance(after, transitions.Stop):
                failure = getattr(after, "failure", "")
                self._status_comment()
                continue
            if not isinstance(after, transitions.Verified):  # _open_pull writes it then
                self._refresh_pull(outcome)
            match after:
                case transitions.Stop():
                    return self._stop(after)
                case transitions.Verified():
                    # Did it pass by changing the tests? One turn to fix the code instead.
                    approved = intake.approved_text(record, issue.title, issue.body)
                    if note := self._tests_changed_to_pass(head, verify, *approved):
                        failure = note
                        self._status_comment()
                        continue
                    audited = self._section_audit(head)  # milestones: audit before going on
                    if isinstance(audited, str):
                        return audited
                    if isinstance(audited, _AllAudited):
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

    def _merged_base_verified(self, base: str, conversation: list[dict[str, Any]]) -> str | None:
        """The default branch merged in without conflicts (the gate asked: another loop
        merged first): verify on the merged head before any turn. When it passes with
        the tests as approved, the pull request moves on, no model asked (a turn only to
        hear "still passes" cost a call and a fleet's writes, issue 43); else None, and a
        turn follows with what verify said."""
        tally.enter("catch_up")  # a turn follows unless it passes (the turn's own then)
        record = self._set(base_clean=False)
        if record.kind == "metric" or record.sections or not record.catch_up.get("from"):
            return None  # their evidence is per turn
        if self.store.feedback_waiting(self.key):
            return None  # a writer's edit or request waits for the agent's next turn
        issue = self.gh.issue(self.repo, self.issue_number)
        label = self.config.labels.of_kind(record.kind)
        step = transitions.before_turn(
            turn=record.turn,
            max_turns=record.turn + 1,  # no turn runs: the turns left do not matter
            issue_open=issue.open,
            has_label=label in issue.labels,
            cancel=self.store.cancel_requested(self.key),
            intake_edited=intake.edited(record, issue.title, issue.body),
        )
        if isinstance(step, transitions.Stop):
            return None  # the turn's own rules say how the loop ends, and the comments
        head = self.worktrees.head(self.checkout.path, self.checkout.mirror)
        self._set(phase="verifying")
        verify = self._harness(self.config.verify)
        if (problem := self.sandbox.worktree_problem()) is not None:
            return self._over_limit(f"verify: {problem}")
        self._verify_tail = verify.output[-prompts.TAIL_CHARS :]
        result = {
            "turn": record.turn,
            "total": record.total_turns,
            "passed": verify.passed,
            "exit_code": verify.exit_code,
            "seconds": round(verify.seconds, 3),
            "timed_out": verify.timed_out,
            "sha": head,
        }
        self._set(last_verify=result)
        self.store.event(self.key, "verify", **result, tail=self._verify_tail, merged_base=True)
        if not verify.passed:
            self._set(resume_note=f"{record.resume_note}\n\nverify failed:\n{self._verify_tail}")
            return None
        approved = intake.approved_text(self._record(), issue.title, issue.body)
        if note := self._tests_changed_to_pass(head, verify, *approved):
            self._set(resume_note=note)  # the one turn it gives the agent follows
            return None
        # Its change may be the reviewed head's (the critic compares their diffs).
        self._set(catch_up={**record.catch_up, "to": head})
        return self._open_pull(base, resumed_outcome(conversation), caught_up=True)

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
        """The rules before every turn (bot/core/rules/loop/turns.py): the turn to run, or how
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
                    # next label is that confirmation (jobs.dispatch._unconfirmed), bound to
                    # this very edit.
                    edits = self.gh.latest_edits(self.repo, self.issue_number)
                    if intake.same_text((edits.title, edits.body), (issue.title, issue.body)):
                        digest = intake_hash(issue.title, issue.body)
                        self.store.ask_confirmation(self.key, digest, edits.stamp)
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


def _max_tokens(spec: ModelSpec) -> int:
    """The agent's output limit per call, never above what the model allows. Thinking
    shares it with the answer; a reply cut by it is continued or retried larger
    (``bot.core.rules.loop.agent_stop``), so the usual limit stays small for the budget's
    worst case."""
    return min(MAX_TOKENS, spec.max_output)


def _inc_error(r: LoopRecord, detail: str) -> None:
    r.error_count += 1
    r.detail = detail


__all__ = ["LEASE_LOST", "Lease", "LoopRunner", "run_loop"]
