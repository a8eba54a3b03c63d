"""The loop runner's state and what all its parts share (``RunnerBase``).

``jobs.loop.job.LoopRunner`` is ``RunnerBase`` with its parts, each a module that extends it:
the section audits (jobs/loop/section_audits.py), the post-action (jobs/loop/post_action.py), base
verify and evidence (jobs/loop/base_verify.py), the pull request (jobs/loop/pull_request.py), the
hand-over (jobs/loop/handover.py) and what a prompt gives for the first time (jobs/loop/news.py).
The turn loop itself is jobs/loop/job.py."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Reason, Status
from bot.core.rules import push_refusal
from bot.core.rules.loop import budget, discussion, nested_guidance
from bot.core.rules.loop import metric as metric_rules
from bot.core.rules.loop import turns as transitions
from bot.core.text import messages
from bot.core.text.defuse import one_line
from bot.io.github import tally
from bot.io.github.client import Installation
from bot.io.github.failures import GitHubError
from bot.io.github.issues import IssueInfo
from bot.io.logs import get_logger
from jobs import lifecycle
from jobs.agents.agent import Outcome, TurnAgent
from jobs.check_runs import CheckRuns, Update
from jobs.loop.attachments import Given
from jobs.loop.lease import Lease
from jobs.loop.setup_phase import SetupPhase
from jobs.runtime import Runtime
from jobs.sandbox.bwrap import Result, Sandbox
from jobs.spend import SpendGate
from jobs.tree.worktree import Checkout, FileState, GitError, PushRefused, Worktrees

log = get_logger("loopbot.loop")


CHECK_NAME = "loopbot"
# Seconds a verified head's in_progress run waits for its completion (the pull request
# opened or updated on it): a few on a pull request a person may be looking at; longer
# on a head no pull request shows yet, where opening it can wait that long in a fleet's
# line of writes (the fleet still wrote both with 5 s). The job's end sends it anyway.
HOLD_VERIFIED = 5.0
HOLD_BEFORE_PR = 120.0
LEASE_LOST = "lease lost: another worker took this loop over"


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

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


@dataclass(frozen=True)
class _News:
    """What one turn's prompt gives the agent for the first time (``TurnNews._news``)."""

    first: bool  # the conversation's first prompt
    comments: discussion.Selection
    guidance: tuple[nested_guidance.Guidance, ...]
    sections: tuple[str, ...]  # as the prompt shows them; "" for an empty one
    # Images and PDFs attached to those comments, as content blocks (the built-in agent's).
    blocks: tuple[dict[str, Any], ...] = ()


class PushStop(Exception):
    """GitHub refused a push in a way the loop cannot fix itself: the loop stops
    ``push_refused`` with GitHub's words (``LoopRunner.run`` catches it)."""

    def __init__(self, refusal: push_refusal.Refusal, *, repeated: bool = False) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal
        self.repeated = repeated


WORKFLOWS_COMMENT_KEY = "workflows-left-out"


def _count_turn(r: LoopRecord) -> None:
    r.total_turns += 1


def _conclusion(status: Status) -> str:
    return {Status.CANCELLED: "cancelled", Status.COMPLETED: "success"}.get(status, "failure")


class RunnerBase(ABC):
    """A loop job's state and what every part of ``LoopRunner`` shares: the record and
    its writes, the status comment and check run, a turn's commit and push, the end of
    the loop. What one part asks of another is declared here, abstract."""

    # Set as the job starts (``LoopRunner.run``, ``_run``, ``_prepared``).
    lease: Lease
    gh: Installation
    config: repo_config.RepoConfig
    checkout: Checkout
    sandbox: Sandbox
    setup_phase: SetupPhase | None = None  # `setup`'s own sandbox (jobs/loop/setup_phase.py)
    budget: budget.Budget
    # The spend caps above the loop (jobs/spend.py), set once loop.yml is read.
    spend: SpendGate | None = None

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
        self.given = Given()  # the approved issue's attachments (jobs/loop/attachments.py)
        self._checks: CheckRuns | None = None  # the loop's check runs, once it has a head
        self._push: tuple[_Background, int, str] | None = None
        # Milestones: the next prompt gives the current section's whole text (a new
        # section, or a new job on the conversation), else a one-line reminder.
        self._section_full = True
        self._review_guidance: str | None = None  # the reviewer's, read once per job
        self._nested_at: dict[str, bool] = {}  # base sha -> has AGENTS.md below the root
        # What the next prompt must tell the agent about its last push: a refusal it can
        # fix (the turn loop runs another turn for it), and workflow changes left out.
        self._refusal_note = ""
        self._aside_note = ""
        self._workflows: bool | None = None  # the App may push workflow changes
        self._refused_at: str | None = None  # the head GitHub has, after a refusal

    def _hold_for_spend(self, words: str) -> str:
        """The loop waits, queued, for room under a spend cap (``words`` name it)."""
        self.lease.check()
        need = self.spend.refused_usd if self.spend is not None else 0.0
        held = lifecycle.hold_for_spend(self.store, self.key, words, need, gh=self.gh)
        self.log.info("loop.spend_held", held=held is not None, detail=words[:200])
        return f"held by a spend cap: {words}" if held is not None else "moved on"

    def _cancelled(self) -> bool:
        return self.lease.lost.is_set() or self.store.cancel_requested(self.key) is not None

    def _over_limit(self, detail: str) -> str:
        """Stop for a resource limit, dropping what was not committed: committing it would
        make git read all of it, and a restart would meet it again."""
        self._pushed()  # "every commit is pushed", below: the last turn's push has ended
        try:
            self.worktrees.discard_uncommitted(self.checkout)
        except GitError:
            # Git cannot clean what it cannot see (paths past PATH_MAX): drop the whole
            # worktree; every commit is pushed, and a restart recreates it from there.
            self.worktrees.remove(self.repo, self.issue_number)
        return self._finish(Status.FAILED, Reason.RESOURCE_LIMIT, detail)

    def _harness(self, command: str, *, setup: bool = False) -> Result:
        """``setup`` (``setup=True``: in its own phase, jobs/loop/setup_phase.py), ``verify`` or
        a metric command, run by the harness. What it leaves that the repository does not
        ignore, and that was not there before it ran, is its own output, never the
        agent's: it is kept out of every later commit (``exclude_leftovers``)."""
        before = self.worktrees.untracked(self.checkout)
        phase = self.setup_phase
        result = phase.run(command) if setup and phase is not None else self.sandbox.run(command)
        left = self.worktrees.exclude_leftovers(self.checkout, before)
        if left:
            self.store.event(self.key, "leftovers_excluded", paths=left[:50], count=len(left))
        return result

    def _restore_setup(self, before: dict[str, FileState], turn: int) -> None:
        """Setup's output (ignored files) that the agent deleted is made again before
        verify runs: verify must not pass on a tree setup would not leave (a plugin, a
        stricter config removed)."""
        missing = self.worktrees.missing_ignored(self.checkout, before)
        if not missing:
            return
        self.store.event(self.key, "ignored_missing", turn=turn, paths=missing[:50])
        if self.config.setup:
            # On a tree the agent wrote (its requirements, its scripts): in the agent's
            # sandbox, with the agent's network and no cache. setup's own network and the
            # repository's cache are for the default branch's tree only (red team).
            result = self._harness(self.config.setup)
            self.store.event(
                self.key, "setup", exit_code=result.exit_code, seconds=result.seconds, again=True
            )

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
        # The last push first: a refusal of it undoes its commits (``_refused``).
        self._pushed()
        if self._refused_at is not None:
            # Commits after a refusal, not pushed yet: all of them become this one
            # commit, the agent's tree as it is now, so refused content it has since
            # removed is in no commit that is pushed.
            self.worktrees.unpushed_to_index(self.checkout, self._refused_at)
        self._keep_workflows_out(turn)
        sha = self.worktrees.commit_all(self.checkout, f"loop(turn-{turn}): {summary}")
        sha = self._keep_results_table() or sha
        if sha is None:
            return None
        if self._refusal_note:
            # Found just now: this turn ran without knowing. The agent hears of it first;
            # its next turn's commit is pushed.
            return sha
        self._refused_at = None
        lease = self._linearized()
        if lease is not None:
            sha = self.worktrees.head(self.checkout.path, self.checkout.mirror)
        self.lease.check()  # a push is a write: not after the lease is gone
        token = self.gh.token()
        # Only git on the thread: GitHub calls stay on the job's thread and its client.
        push = _Background(lambda: self.worktrees.push(self.checkout, token, sha, lease=lease))
        self._push = (push, turn, sha)
        return sha

    def _workflows_allowed(self) -> bool:
        """Whether the App may push changes under ``.github/workflows/`` (the installation
        granted ``workflows``): GitHub refuses such a push otherwise."""
        if self._workflows is None:
            self._workflows = self.gh.permissions().get("workflows") == "write"
        return self._workflows

    def _keep_workflows_out(self, turn: int) -> None:
        """Without the ``workflows`` permission, what the agent changed under
        ``.github/workflows/`` stays out of the commit (GitHub would refuse the push):
        kept as a patch for the pull request and a person, and the agent is told."""
        if self._workflows_allowed():
            return
        aside = self.worktrees.set_aside(self.checkout, push_refusal.WORKFLOWS_DIR)
        if not aside:
            return
        self.sandbox.adopt()  # the restore wrote files as the worker
        self.store.update(self.key, lambda r: r.workflow_patches.update(aside))
        self.store.event(self.key, "workflows_left_out", turn=turn, paths=sorted(aside))
        names = ", ".join(f"`{p}`" for p in sorted(aside))
        self._aside_note = (
            f"Your changes to {names} were left out of the commit: loopbot's GitHub App may "
            "not push changes under `.github/workflows/` (it does not have the `workflows` "
            "permission), so GitHub would refuse them. They are in the pull request as a "
            "patch for a person to apply. Do not change files there again; make the fix "
            "work without them."
        )
        record = self._record()
        self.gh.upsert_comment(
            self.repo,
            self.issue_number,
            WORKFLOWS_COMMENT_KEY,
            messages.workflows_left_out(record.workflow_patches),
        )

    def _linearized(self) -> str | None:
        """A merge of the default branch that changed a workflow cannot be pushed by an
        App without ``workflows``: the branch becomes one commit on the default branch
        (``Worktrees.linearize``), pushed with a lease on the head GitHub has. The lease,
        or None when nothing was rewritten."""
        if self._workflows_allowed() or not self.worktrees.merge_touches(
            self.checkout, push_refusal.WORKFLOWS_DIR
        ):
            return None
        pushed = self.worktrees.remote_sha(self.checkout.mirror, self.checkout.branch)
        squashed = self.worktrees.linearize(self.checkout)
        if squashed is None:
            return None
        self.store.event(self.key, "merge_linearized", sha=squashed, replaces=pushed or "")
        return pushed or ""

    def _settle_push(self) -> None:
        """When the job ends on an error (or any way but through ``_pushed()``): wait for
        a push still running (the work horse exits after the job, which would cut it
        off) and report it if it landed, so the record, the events and the check run
        know the head GitHub has. Best effort: its own failure is logged, not raised,
        since the job is already ending on something else."""
        if self._push is None:
            return
        try:
            self._pushed()
        except Exception as exc:  # noqa: BLE001 - LeaseLost included: nothing more to write
            log.warning("loop.push_unreported", loop=self.key, error=str(exc)[:200])

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

    def _pushed(self, *, wait: bool = True) -> None:
        """Wait for the background push, then report it; its failure fails the turn.

        ``wait=False``: report it only if it has ended, else leave it running. After
        verify the loop does not wait: a push to GitHub can take longer than a quick
        verify, and the next turn does not need the remote branch. Its start reports a
        push that ended meanwhile; its commit (and the pull request, a hand-over, the
        loop's end) waits for one that has not.
        """
        if self._push is None or not (wait or self._push[0].done()):
            return
        (push, turn, sha), self._push = self._push, None
        try:
            push.join()
        except PushRefused as exc:
            self._refused(exc.refusal, turn, sha)
            return
        self.lease.check()
        self._set(head_sha=sha)
        self.store.event(self.key, "pushed", turn=turn, sha=sha)
        # Not waited for: with many loops, GitHub's line for writes is long (a minute).
        # A head verify passed on is held a moment: the pull request opens on it within
        # seconds, and its run is then created once, completed (one write, not two).
        passed = self._record().last_verify
        held = 0.0
        if passed.get("sha") == sha and passed.get("passed"):
            held = HOLD_VERIFIED if self._record().pr_number is not None else HOLD_BEFORE_PR
        self._check_run(
            "in_progress", title=f"turn {turn}: verified", new_head=True, wait=False, hold=held
        )

    def _refused(self, refusal: push_refusal.Refusal, turn: int, sha: str) -> None:
        """GitHub refused the turn's push. Content the agent can take out (a secret, a
        large file) becomes the next turn's prompt, and the refused commits are undone
        (their changes kept) so none of them is ever pushed; the second refusal of a
        kind, and any other, stops the loop (``PushStop``). Never a bypass."""
        self.lease.check()
        kind = refusal.kind.value
        record = self.store.update(
            self.key, lambda r: r.push_refusals.update({kind: r.push_refusals.get(kind, 0) + 1})
        )
        count = record.push_refusals[kind]
        self.store.event(
            self.key,
            "push_refused",
            turn=turn,
            sha=sha,
            rule=kind,
            reason=refusal.reason[:500],
            count=count,
        )
        if not refusal.fixable:
            raise PushStop(refusal)
        if count >= push_refusal.MAX_SAME:
            raise PushStop(refusal, repeated=True)
        pushed = self.worktrees.remote_sha(self.checkout.mirror, self.checkout.branch)
        self._refused_at = pushed or self.worktrees.fork_point(self.checkout, sha)
        self.worktrees.unpushed_to_index(self.checkout, self._refused_at)
        self._refusal_note = push_refusal.agent_note(refusal)

    def _harness_notes(self, failure: str) -> str:
        """``failure`` with what the harness must tell the agent first (a refused push,
        workflow changes left out), each once."""
        notes = [n for n in (self._refusal_note, self._aside_note) if n]
        self._refusal_note = self._aside_note = ""
        return "\n\n".join([*notes, failure] if failure else notes)

    def _blocking_findings(self, record: LoopRecord) -> list[dict[str, Any]]:
        return [f for f in record.findings if f.get("severity") == "sev1" and not f.get("resolved")]

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

    def _advance(self, stage: Status, *, quiet: bool = False) -> bool:
        """On to the critic or the gate: the status comment says so before the job runs
        (``quiet``: unless the job ends first, see ``post_status``). False when a cancel
        landed meanwhile (it stands)."""
        moved = lifecycle.advance(
            self.store,
            self.key,
            stage,
            came_from=frozenset({Status.RUNNING}),
            gh=self.gh,
            tail=self._verify_tail,
            quiet=quiet,
        )
        return moved is not None

    def _stop(self, stop: transitions.Stop, fallback: str = "") -> str:
        """End as a turn rule said; ``fallback`` is the detail when the rule gives none."""
        return self._finish(stop.status, stop.reason, stop.detail or fallback)

    def _finish(self, status: Status, reason: Reason, detail: str = "") -> str:
        tally.enter("end")
        self._pushed()
        self.lease.check()
        spend = self.spend
        if reason is Reason.BUDGET and spend is not None and spend.held_back():
            # A spend cap refused this job's first call: the loop never really started,
            # so it waits, queued, rather than ending (jobs/spend.py).
            return self._hold_for_spend(spend.held_back())
        # A loop a spend cap stopped remembers the call it could not make: the reconciler
        # may restart it once there is room (LOOPBOT_SPEND_RESUME_ON_ROLLOVER).
        capped = reason is Reason.BUDGET and spend is not None and bool(spend.refused)
        need = spend.refused_usd if capped and spend is not None else 0.0
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
            spend_need_usd=need,
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

    def _status_comment(self, *, quiet: bool = False) -> None:
        lifecycle.post_status(self.store, self.gh, self._record(), self._verify_tail, quiet=quiet)

    def _check_run(
        self,
        status: str,
        *,
        conclusion: str | None = None,
        title: str = "",
        new_head: bool = False,
        wait: bool = True,
        hold: float = 0.0,
    ) -> None:
        """The loop's check run on the record's head. ``wait=False``: handed to the job's
        check-run thread (jobs/check_runs.py), for a turn's new head ``in_progress``."""
        record = self._record()
        if not record.head_sha:
            return
        update = Update(
            head_sha=record.head_sha,
            status=status,
            conclusion=conclusion,
            title=title or record.phase,
            summary=messages.status_line(record),
            new_head=new_head,
            hold=hold,
        )
        if self._checks is None:
            self._checks = CheckRuns(self.gh, self.repo, CHECK_NAME, self.lease.check, self.key)
        if wait:
            self._checks.send(update)
        else:
            self._checks.submit(update)

    def _checks_written(self) -> None:
        """Before the lease is given back: the check-run update handed over is written."""
        if self._checks is not None:
            self._checks.flush()

    # -- what the parts implement (jobs/loop/job.py and the modules beside it) ---------------

    @abstractmethod
    def _turns(self, agent: TurnAgent, base: str) -> str: ...

    @abstractmethod
    def _prepared(
        self, record: LoopRecord, sandbox: Sandbox, checkout: Checkout, base: str, token: str
    ) -> str: ...

    @abstractmethod
    def _news(self, record: LoopRecord, base: str, *, first: bool) -> _News: ...

    @abstractmethod
    def _delivered(self, news: _News, turn: int) -> None: ...

    @abstractmethod
    def _turn_completed(self, turn: int, outcome: Outcome) -> None: ...

    @abstractmethod
    def _before_turn(
        self, record: LoopRecord, issue: IssueInfo, max_turns: int
    ) -> transitions.RunTurn | str: ...

    @abstractmethod
    def _handoff(self, note: str) -> str: ...

    @abstractmethod
    def _open_pull(self, base: str, outcome: Outcome, *, caught_up: bool = False) -> str: ...

    @abstractmethod
    def _refresh_pull(self, outcome: Outcome) -> None: ...
