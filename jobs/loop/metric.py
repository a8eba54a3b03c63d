"""The metric loop (label ``labels.optimize``, ``metric:`` in loop.yml; seed 004): keep
what measurably helps.

Run from ``LoopRunner._prepared`` (jobs/loop/job.py; typed against ``jobs.loop.runner.RunnerBase``,
so this module does not import jobs/loop/job.py) for a record of kind ``metric``, on the
runner's worktree, sandbox, agent, lease and GitHub client:

- Phase 0, on the base: the metric command prints a number, the guard (``metric.guard``,
  else ``verify``) passes, the scope matches tracked files. Otherwise a comment names
  what failed and the loop fails (``metric_preconditions``) before any model call. The
  baseline is iteration 0.
- Each iteration: one agent turn makes ONE change; the harness commits it
  (``loop(iter-N): …``), measures it, runs the guard on a change that improved the
  number, and keeps it or discards it (``git revert``: the history keeps it). A change
  outside the scope is discarded unmeasured; errors (no number, crash, timeout) are
  discards with their reason. The decision is pushed before it is recorded, so the
  branch on GitHub is never behind the record: a worker that dies loses at most the
  iteration in progress, which the next one undoes with a commit (``_recover``).
- Stuck detection: after a few discards in a row the prompt asks for another area or
  technique; ``max_consecutive_discards`` in a row stops the loop.
- The end (``max_iterations`` or stuck): a final report comment; with a change kept,
  ``loop-results.tsv`` is committed, verify runs on that head, and the pull request
  opens through ``LoopRunner._open_pull`` (critic and gate as for any loop); with
  nothing kept the loop fails with no pull request. After the pull request, review
  findings, requests and failing checks get ordinary fix turns (``LoopRunner._turns``).

The decisions are pure (``bot/core/rules/loop/metric.py``); the texts are in
``bot/core/text/metric.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_never

from bot.core.record import LoopRecord, Reason, Status
from bot.core.repo_config import MetricConfig
from bot.core.rules import intake
from bot.core.rules.loop import budget
from bot.core.rules.loop import metric as rules
from bot.core.rules.loop import turns as transitions
from bot.core.text import metric as text
from bot.core.text import prompts
from bot.core.text.defuse import one_line
from jobs.agents.agent import MAX_TOKENS, Limits, Outcome, TurnAgent
from jobs.drain import DRAIN
from jobs.loop.runner import LEASE_LOST, RunnerBase
from jobs.sandbox import safefs
from jobs.sandbox.bwrap import Result
from jobs.tree.worktree import FileState

TAIL_CHARS = 2000  # of a command's output, in events and the preconditions comment
NORMAL_ENDS = ("finished", "text_only", "shutdown")


def run(runner: RunnerBase, agent: TurnAgent, base: str) -> str:
    """The metric loop on ``runner``'s prepared worktree; returns the job's result."""
    return _MetricLoop(runner, agent, base).run()


class _MetricLoop:
    def __init__(self, runner: RunnerBase, agent: TurnAgent, base: str) -> None:
        self.r = runner
        self.agent = agent
        self.base = base
        self.cfg: MetricConfig | None = runner.config.metric
        # The guard defaults to the repository's verify: a kept change must not break it.
        self.guard = (self.cfg.guard if self.cfg else None) or runner.config.verify
        self.named: list[str] = []  # what the metric and guard commands run: never in scope

    # -- entry -----------------------------------------------------------------------------

    def _read(self, path: str) -> str | None:
        """A tracked file's text for following the guard statically (a makefile, a
        package.json): never through a symlink, at most 256 KB, None when unreadable."""
        try:
            text, _ = safefs.read_text(
                self.r.checkout.path / path, 256 * 1024, root=self.r.checkout.path, whole=True
            )
        except (OSError, safefs.AccessError, safefs.TooLarge):
            return None
        return text

    def run(self) -> str:
        r = self.r
        record = r._record()
        if record.metric_done and record.pr_number is None:
            # The iterations ended and the results were committed, verified and pushed,
            # but opening the pull request failed (GitHub): open it now. A coding turn
            # here would be an unmeasured change outside any iteration.
            return self._open(record)
        if record.metric_done:
            # Iterations over and the pull request open: a review's findings, a writer's
            # request, failing checks or a conflict get fix turns like any loop's.
            return r._turns(self.agent, self.base)
        if self.cfg is None:
            return r._finish(
                Status.FAILED,
                Reason.BAD_CONFIG,
                "this is a metric loop, but `.github/loop.yml` has no `metric:` section; "
                "add it back and comment `/loop-restart`",
            )
        cfg = self.cfg
        self.named = rules.protected_paths(
            cfg.command, self.guard, r.worktrees.tracked_files(r.checkout), self._read
        )
        self.agent.system += "\n\n" + text.system(cfg, self.guard, self.named)
        record = self._allowance(record, cfg)
        # loop.yml's metric changed since the baseline: measure the base of the next
        # iteration again (a new baseline row), or the comparisons would mix two metrics.
        changed = (record.metric_command, record.metric_direction) != (cfg.command, cfg.direction)
        if record.metric_results:
            self._recover(record)
            if changed:
                r.store.event(
                    r.key, "metric_changed", command=cfg.command, was=record.metric_command
                )
        if not record.metric_results or changed:
            ended = self._preconditions(cfg)
            if ended is not None:
                return ended
        r._set(metric_command=cfg.command, metric_direction=cfg.direction)
        return self._iterations(cfg)

    def _allowance(self, record: LoopRecord, cfg: MetricConfig) -> LoopRecord:
        """A writer's restart (``restarts`` went up: ``/loop-restart``, the label again)
        gives a new allowance: ``max_iterations`` more, the discard streak counted
        afresh. A resume after a lost worker goes on with the allowance it had."""
        fresh = record.restarts != record.metric_restarts
        since = (
            rules.last_iteration(rules.rows_of(record.metric_results))
            if fresh
            else record.metric_since
        )
        if fresh:
            self.r.store.event(self.r.key, "metric_allowance", since=since)
        return self.r._set(
            metric_since=since,
            metric_restarts=record.restarts,
            metric_max_iterations=cfg.max_iterations,
        )

    # -- phase 0 ---------------------------------------------------------------------------

    def _preconditions(self, cfg: MetricConfig) -> str | None:
        """Phase 0 on the base: None when the loop may start (the baseline recorded), else
        the job's end, with a comment naming what failed."""
        r = self.r
        r._set(phase="metric_preconditions")
        head = r.worktrees.head(r.checkout.path, r.checkout.mirror)
        matched = rules.matching(r.worktrees.tracked_files(r.checkout), cfg.scope, self.named)
        globs = ", ".join(f"`{g}`" for g in cfg.scope)
        checks = [
            text.Check(
                "scope",
                bool(matched),
                f"{len(matched)} tracked file(s) match {globs}"
                if matched
                else f"no tracked file matches {globs}",
            )
        ]
        measured = r._harness(cfg.command)
        if (problem := r.sandbox.worktree_problem()) is not None:
            return r._over_limit(f"metric: {problem}")
        reading = rules.reading(
            measured.exit_code, measured.timed_out, measured.output, measured.seconds
        )
        self._clean()
        checks.append(
            text.Check(
                "metric",
                reading.ok,
                f"`{cfg.command}` printed {rules.fmt(reading.value)}"
                if reading.ok
                else reading.error,
                tail=measured.output[-TAIL_CHARS:],
            )
        )
        guard = self._guard_on_base(head)
        if isinstance(guard, str):
            return guard
        passed, detail, tail = guard
        checks.append(text.Check("guard", passed, detail, tail=tail))
        r.store.event(
            r.key,
            "metric_preconditions",
            sha=head,
            passed=all(c.ok for c in checks),
            checks={c.name: c.ok for c in checks},
            value=reading.value,
        )
        if not all(c.ok for c in checks) or reading.value is None:
            r.lease.check()
            r.gh.upsert_comment(
                r.repo, r.issue_number, text.PRECONDITIONS_KEY, text.preconditions_failed(checks)
            )
            failed = ", ".join(c.name for c in checks if not c.ok)
            return r._finish(
                Status.FAILED,
                Reason.METRIC_PRECONDITIONS,
                f"phase 0 failed on the base ({failed}): see the comment above",
            )
        rows = rules.rows_of(r._record().metric_results)
        row = rules.baseline_row(head, reading.value, rules.last_iteration(rows))
        r.store.update(r.key, _append(row, head))
        r.store.event(r.key, "metric_baseline", value=reading.value, sha=head)
        return None

    def _guard_on_base(self, head: str) -> tuple[bool, str, str] | str:
        """(passed, detail, output tail) of the guard on the base; the verify run on the
        base already is the guard's when there is no ``metric.guard``. A str: the job ended."""
        r = self.r
        base = r._record().base_verify
        if (
            self.cfg is not None
            and self.cfg.guard is None
            and base.get("sha") == head
            and not base.get("timed_out")
        ):
            ok = bool(base.get("passed"))
            return (
                ok,
                _guard_words(self.guard, ok, base.get("exit_code")),
                str(base.get("tail", "")),
            )
        result = r._harness(self.guard)
        if (problem := r.sandbox.worktree_problem()) is not None:
            return r._over_limit(f"guard: {problem}")
        self._clean()
        return (
            result.passed,
            _guard_words(self.guard, result.passed, result.exit_code, result.timed_out),
            result.output[-TAIL_CHARS:],
        )

    def _recover(self, record: LoopRecord) -> None:
        """Back to where the last decision left the branch: uncommitted changes dropped,
        and an iteration a lost worker committed (and perhaps pushed) but never decided
        undone by a commit, so the history keeps it and the push stays a fast-forward."""
        r = self.r
        self._clean()
        head = r.worktrees.head(r.checkout.path, r.checkout.mirror)
        if not record.metric_head or head == record.metric_head:
            return
        sha = r.worktrees.restore_tree(
            r.checkout,
            record.metric_head,
            f"loop: undo an unfinished iteration (back to {record.metric_head[:10]})",
        )
        self.r.sandbox.adopt()
        now = sha or head
        self._push(now, f"recovered at {now[:10]}")
        r._set(metric_head=now)
        r.store.event(r.key, "metric_recovered", was=head, back_to=record.metric_head, sha=now)

    # -- iterations --------------------------------------------------------------------------

    def _iterations(self, cfg: MetricConfig) -> str:
        r = self.r
        conversation = r.store.conversation(r.key)
        note = r._record().resume_note if conversation else ""
        while True:
            if r.lease.lost.is_set():
                return LEASE_LOST
            if DRAIN.is_set():
                return r._handoff(note)
            record = r._record()
            issue = r.gh.issue(r.repo, r.issue_number)
            # Iterations are bounded by rules.next_step, not by max_turns.
            step = r._before_turn(record, issue, max_turns=record.turn + 1)
            if isinstance(step, str):
                return step
            rows = rules.rows_of(record.metric_results)
            nxt = rules.next_step(
                rows,
                since=record.metric_since,
                max_iterations=record.metric_max_iterations or cfg.max_iterations,
                max_consecutive_discards=cfg.max_consecutive_discards,
            )
            match nxt:
                case rules.End():
                    return self._end(cfg, nxt, rows)
                case rules.Go():
                    pass
                case _:
                    assert_never(nxt)
            smallest = budget.smallest_call(self.agent.model, MAX_TOKENS)
            if out := budget.before_turn(r.budget, budget.Spent.of(record), smallest):
                return r._finish(Status.FAILED, Reason.BUDGET, out.detail)
            n = nxt.iteration
            record = r.store.update(r.key, transitions.started(step.turn, "iterating"))
            r.store.event(
                r.key,
                "turn_started",
                turn=step.turn,
                total=record.total_turns,
                messages=len(conversation),
                iteration=n,
            )
            r.store.count("turns")
            r._status_comment()
            news = r._news(record, self.base, first=not conversation)
            if not conversation:
                title, body = intake.approved_text(record, issue.title, issue.body)
                prompt = text.first_prompt(
                    r.repo, r.issue_number, title, body, cfg, rows, n, extra=news.sections
                )
            else:
                feedback = r.store.take_feedback(r.key)  # an approved edit of the issue
                prompt = text.iteration_prompt(
                    n,
                    cfg,
                    rows,
                    hint=nxt.hint,
                    note=note,
                    feedback=feedback,
                    extra=news.sections,
                    since=record.metric_since,
                )
            if nxt.hint:
                streak = rules.streak(rows, record.metric_since)
                r.store.event(r.key, "metric_hint", iteration=n, streak=streak)
            limits = Limits(
                step_cap=r.config.step_cap,
                tool_budget=r.config.tool_budget,
                budget=r.budget,
                spent=budget.Spent.of(record),
                stall_timeout=r.rt.settings.stall_timeout,
            )
            ignored_before = r.worktrees.ignored_files(r.checkout)
            outcome = self.agent.run_turn(conversation, prompt, limits)
            if r.lease.lost.is_set():
                return LEASE_LOST  # presumed dead and taken over: the record is another's
            r.store.save_conversation(r.key, conversation)
            if self.agent.last_model and self.agent.last_model != record.conversation_model:
                r._set(conversation_model=self.agent.last_model)
            r._delivered(news, step.turn)
            r._record_usage(outcome)
            if outcome.end not in NORMAL_ENDS:
                r.store.event(
                    r.key, "turn_capped", turn=step.turn, reason=outcome.end, detail=outcome.detail
                )
            # Before any end too: what a cut turn left in ignored paths would otherwise be in
            # the snapshot of the next iteration (a resume), and count for its measurement.
            hidden = r.worktrees.purge_ignored(r.checkout, ignored_before)
            if hidden:
                r.store.event(r.key, "ignored_removed", turn=step.turn, paths=hidden[:50])
            if (ended := self._cut(outcome, n)) is not None:
                return ended
            decided = self._iteration(cfg, n, outcome, rows, ignored_before)
            if isinstance(decided, str):
                return decided
            r._turn_completed(step.turn, outcome)
            note = ""
            if hidden:
                note = (
                    "loopbot removed files you left in paths git ignores ("
                    + ", ".join(hidden[:5])
                    + (", …" if len(hidden) > 5 else "")
                    + "): they never reach the commit, so the metric ran without them."
                )
            r._status_comment()

    def _cut(self, outcome: Outcome, n: int) -> str | None:
        """The job's end when the turn ended so that its change cannot be judged (the
        change is dropped, uncommitted: the next iteration starts clean), else None."""
        r = self.r
        end = outcome.end
        if end == "shutdown":
            self._clean()
            return r._handoff(
                f"Your worker shut down during iteration {n}; its unfinished change was "
                "dropped. Make this iteration's change again, or another one."
            )
        if end == "model_refused":
            self._clean()
            return r._finish(Status.FAILED, Reason.MODEL_REFUSED, outcome.detail)
        cut = transitions.cut_short(end)
        if cut is not None and end == "resource_limit":
            return r._over_limit(outcome.detail)
        if cut is not None:
            self._clean()
            return r._stop(cut, outcome.detail)
        cost = r._record().cost_usd
        if cost >= r.config.max_cost_usd:
            self._clean()
            return r._finish(
                Status.FAILED, Reason.BUDGET, f"${cost:.2f} spent of ${r.config.max_cost_usd:.2f}"
            )
        return None

    def _iteration(
        self,
        cfg: MetricConfig,
        n: int,
        outcome: Outcome,
        rows: list[rules.Row],
        ignored: dict[str, FileState],
    ) -> rules.Row | str:
        """Commit the turn's change, judge it, keep or revert it, push, record the row.
        ``ignored``: the ignored files as they were before the turn. A str: the job ended
        (a resource limit)."""
        r = self.r
        best = rules.best_kept(rows)
        assert best is not None  # phase 0 recorded the baseline
        # The description lands in a commit on GitHub: no secret of the worker's in it.
        description = one_line(rules.clean_description(r.gh.redact(_first_line(outcome.text))))
        r._set(phase="measuring")
        sha = r.worktrees.commit_all(r.checkout, f"loop(iter-{n}): {description[:72] or 'change'}")
        outside: list[str] = []
        reading: rules.Reading | None = None
        measured: Result | None = None
        if sha is not None:
            outside = rules.outside_scope(
                r.worktrees.commit_paths(r.checkout, sha), cfg.scope, self.named
            )
            if not outside:
                measured = r._harness(cfg.command)
                if (problem := r.sandbox.worktree_problem()) is not None:
                    return r._over_limit(f"metric: {problem}")
                reading = rules.reading(
                    measured.exit_code, measured.timed_out, measured.output, measured.seconds
                )
                self._settle(ignored, n)  # before the guard: it must not run on them either
        verdict = rules.first_look(
            changed=sha is not None,
            outside=outside,
            reading=reading,
            direction=cfg.direction,
            min_delta=cfg.min_delta,
            best=best,
        )
        guard: Result | None = None
        if verdict.run_guard:
            guard = r._harness(self.guard)
            if (problem := r.sandbox.worktree_problem()) is not None:
                return r._over_limit(f"guard: {problem}")
            self._settle(ignored, n)
            verdict = rules.with_guard(
                verdict, guard.passed, _guard_result(guard.exit_code, guard.timed_out)
            )
        head = r._record().metric_head
        if sha is not None and verdict.status == "discard":
            head = r.worktrees.revert_head(r.checkout)
            r.sandbox.adopt()  # the revert wrote files as the worker
        else:
            self._clean()
            head = sha or head
        self._push(head, f"iteration {n}: {verdict.status}")
        row = rules.iteration_row(
            n, sha or "", reading.value if reading else None, best, verdict, description
        )
        r.store.update(r.key, _append(row, head))
        r.store.event(
            r.key,
            "metric_iteration",
            **row.as_dict(),
            head=head,
            outside=outside[:20],
            metric_tail=measured.output[-TAIL_CHARS:] if measured else "",
            guard_passed=guard.passed if guard else None,
            guard_tail=guard.output[-TAIL_CHARS:] if guard else "",
        )
        return row

    # -- the end -----------------------------------------------------------------------------

    def _end(self, cfg: MetricConfig, end: rules.End, rows: list[rules.Row]) -> str:
        """The final report; the pull request of the kept changes, or none."""
        r = self.r
        rep = rules.report(rows, cfg.direction)
        r.store.event(
            r.key,
            "metric_finished",
            why=end.why,
            iterations=rep.iterations,
            kept=rep.kept,
            discarded=rep.discarded,
            baseline=rep.baseline,
            best=rep.best,
        )
        if not rep.kept:
            self._report(rep, rows, end.detail, cfg, pull=False)
            reason = Reason.METRIC_STUCK if end.why == "stuck" else Reason.NO_IMPROVEMENT
            return r._finish(
                Status.FAILED, reason, f"{end.detail}; nothing was kept, so no pull request"
            )
        r._set(phase="results")
        r.worktrees.commit_file(
            r.checkout,
            rules.TSV_NAME,
            rules.tsv(rows),
            f"loop: results of {rep.iterations} iteration(s) ({rules.TSV_NAME})",
        )
        r.sandbox.adopt()
        head = r.worktrees.head(r.checkout.path, r.checkout.mirror)
        # The gate merges only a head verify passed on: this one, with the table in it.
        r._set(phase="verifying")
        verify = r._harness(r.config.verify)
        if (problem := r.sandbox.worktree_problem()) is not None:
            return r._over_limit(f"verify: {problem}")
        self._clean()
        r._verify_tail = verify.output[-prompts.TAIL_CHARS :]
        result = {
            "turn": r._record().turn,
            "passed": verify.passed,
            "exit_code": verify.exit_code,
            "seconds": round(verify.seconds, 3),
            "timed_out": verify.timed_out,
            "sha": head,
        }
        r._set(last_verify=result)
        r.store.event(r.key, "verify", **result, tail=r._verify_tail)
        self._push(head, "results committed")
        r._set(metric_head=head)
        self._report(rep, rows, end.detail, cfg, pull=verify.passed)
        if not verify.passed:
            return r._finish(
                Status.FAILED,
                Reason.METRIC_VERIFY,
                f"`{r.config.verify}` fails on the kept changes (exit {verify.exit_code}), so "
                f"no pull request; the branch `{r._record().branch}` keeps them. Fix the guard "
                "or the repository and comment `/loop-restart`",
            )
        return self._open(r._set(metric_done=True))

    def _open(self, record: LoopRecord) -> str:
        """The pull request of the kept changes, its body the results (from the record:
        also when a retry opens it)."""
        rows = rules.rows_of(record.metric_results)
        direction: rules.Direction = "lower" if record.metric_direction == "lower" else "higher"
        rep = rules.report(rows, direction)
        summary = text.pull_summary(rep, rows, record.metric_command, direction)
        return self.r._open_pull(self.base, Outcome(end="finished", text=summary))

    def _report(
        self, rep: rules.Report, rows: list[rules.Row], ended: str, cfg: MetricConfig, *, pull: bool
    ) -> None:
        r = self.r
        r.lease.check()
        r.gh.upsert_comment(
            r.repo,
            r.issue_number,
            text.REPORT_KEY,
            text.final_report(
                rep, rows, ended, cfg.command, pull=pull, since=r._record().metric_since
            ),
        )

    # -- helpers -----------------------------------------------------------------------------

    def _settle(self, ignored: dict[str, FileState], n: int) -> None:
        """After the metric or the guard ran the change's code: back to the last commit,
        and every ignored file new or changed since before the turn removed. Those runs
        execute the agent's code, and what it leaves where git does not look (a forged
        ``__pycache__`` entry, a package shadowing a module) would survive a discard's
        revert and score the next change, or pass its guard, with nothing of it in the
        pull request."""
        self._clean()
        removed = self.r.worktrees.purge_ignored(self.r.checkout, ignored)
        if removed:
            self.r.store.event(
                self.r.key, "ignored_removed", iteration=n, after="measuring", paths=removed[:50]
            )

    def _clean(self) -> None:
        """Back to the last commit, keeping ignored files (caches, installed packages):
        what a command wrote into the tree is not a change."""
        self.r.worktrees.restore_committed(self.r.checkout)
        self.r.sandbox.adopt()

    def _push(self, head: str, title: str) -> None:
        """Push the branch when its head moved; the record's ``head_sha`` and the check
        run follow. Before the row is recorded: GitHub is never behind the record."""
        r = self.r
        record = r._record()
        if head == record.head_sha or (head == record.metric_head and not record.head_sha):
            return  # pushed already, or still the base that nothing was pushed over
        r.lease.check()  # a push is a write: not after the lease is gone
        r.worktrees.push(r.checkout, r.gh.token())
        r._set(head_sha=head)
        r.store.event(r.key, "pushed", turn=r._record().turn, sha=head)
        r._check_run("in_progress", title=title, new_head=True, wait=False)


def _append(row: rules.Row, head: str) -> Callable[[LoopRecord], None]:
    def apply(rec: LoopRecord) -> None:
        rec.metric_results = [*rec.metric_results, row.as_dict()]
        rec.metric_head = head

    return apply


def _first_line(text_: str) -> str:
    return next((ln.strip() for ln in text_.splitlines() if ln.strip()), "")


def _guard_result(exit_code: int, timed_out: bool) -> str:
    return "timed out" if timed_out else f"exit {exit_code}"


def _guard_words(guard: str, passed: bool, exit_code: Any, timed_out: bool = False) -> str:
    if passed:
        return f"`{guard}` passed"
    return f"`{guard}` failed ({_guard_result(int(exit_code or 0), timed_out)})"
