"""The merge gate job: re-read the issue and PR now, decide (``bot.core.rules.pull.merge``), act.

Woken by the critic, by ``check_suite``/``check_run`` webhooks, and by its own timer
while checks are pending. The squash merge pins the reviewed sha, so GitHub itself
refuses (409) if the head moved between our read and the merge. Before merging (or when
refusing) it posts the receipt (``bot.core.text.receipt``): every condition on the exact sha; after
the merge it adds the merge commit. A condition it cannot establish refuses; a GitHub error
while reading one goes to the retry path (``jobs.retries``) and ends in ``gate_error``.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, assert_never

from bot.core import repo_config
from bot.core.evidence import held_out
from bot.core.ids import LoopId
from bot.core.record import TERMINAL, LoopRecord, Reason, Status, tidy_pending
from bot.core.rules.lifecycle import Guard, Requeue
from bot.core.rules.pull.codeowners import required_owners
from bot.core.rules.pull.merge import (
    AlreadyMerged,
    AwaitPeople,
    CheckResult,
    Decision,
    Enqueue,
    Facts,
    FixChecks,
    FixConflicts,
    InQueue,
    Merge,
    Refuse,
    Review,
    Wait,
    WaitTurn,
    classify_checks,
    decide,
    fold_checks,
    head_approvers,
    needs_slot,
    people_wanted,
    post_action_head,
    protected_changes,
    queue_removal,
)
from bot.core.rules.pull.review import TESTS_CHANGED_FINGERPRINT, dismissal_holds
from bot.core.spend import lines as spend_lines
from bot.core.text import messages, receipt
from bot.io.github import tally
from bot.io.github.client import Installation
from bot.io.github.failures import Conflict
from bot.io.github.issues import IssueInfo
from bot.io.github.pulls import PullInfo
from bot.io.github.rules import ReviewState
from bot.io.logs import get_logger
from bot.io.queues import enqueue_gate
from jobs import lifecycle, merge_slot
from jobs.retries import with_retries
from jobs.review import merged_branch
from jobs.runtime import Runtime, current, instrumented
from jobs.tree.worktree import Worktrees

log = get_logger("loopbot.gate")
RECHECK_SECONDS = 60
# While people are waited for, their review's webhook wakes the gate within seconds; this
# timer (a scheduled job, no worker held) is the sweep for a webhook GitHub never sent.
PEOPLE_RECHECK_SECONDS = 300
AWAITING = "awaiting_approval"  # the phase of a loop waiting for people
# In a merge queue: the queue's webhooks (pull_request dequeued/closed, merge_group) wake
# the gate; this timer is the sweep for one GitHub never sent.
QUEUE_RECHECK_SECONDS = 120
IN_QUEUE = "in_merge_queue"
# A gate run that fails (GitHub down past the client's own retries) is run again from the
# start, re-reading everything, after these pauses; then the loop ends with ``gate_error``.
ERROR_ATTEMPTS = 3
ERROR_BACKOFF = (15.0, 60.0)


@instrumented("gate")
def run_gate(repo: str, issue: int) -> str:
    return Gate(current(), repo, issue).run()


def refuse_closed(rt: Runtime, gh: Installation, key: str, actor: str) -> str:
    """The issue was closed while its pull request waited: refuse it, saying why.

    Runs under the gate's lock, so it never interleaves with a merge in progress.
    """
    record = rt.store.get(key)
    assert record is not None
    gate = Gate(rt, record.repo, record.issue)
    with rt.store.lock(f"gate:{key}", timeout=120, renew=True):
        fresh = rt.store.get(key)
        if fresh is None or fresh.status is Status.COMPLETED or fresh.pr_number is None:
            return "already completed"
        if gh.pull(fresh.repo, fresh.pr_number).merged:
            return "closed by the merge"
        lifecycle.cancel(rt.redis, key, Reason.ISSUE_CLOSED, actor)  # stop what runs
        why = "the issue was closed while the loop ran"
        return gate._refuse(gh, fresh, Reason.ISSUE_CLOSED, why)


AT_GATE = frozenset({Status.MERGING})
MOVED_ON = "the loop moved on (cancelled or ended) while the gate ran"


class Gate:
    def __init__(self, rt: Runtime, repo: str, issue: int) -> None:
        self.rt, self.repo, self.issue = rt, repo, issue
        self.key = LoopId(repo, issue).key
        self.store = rt.store

    def run(self) -> str:
        """Decide and act; never leave the loop in ``merging`` when the run fails for good.

        Every attempt re-reads the issue and the pull request, so one after a merge whose
        answer was lost finds the pull request merged and completes the loop.
        """
        return with_retries(
            self._run_once,
            self._give_up,
            kind="gate",
            key=self.key,
            store=self.store,
            attempts=ERROR_ATTEMPTS,
            backoff=ERROR_BACKOFF,
        )

    def _give_up(self, error: str, attempts: int) -> str:
        detail = messages.gave_up("merge gate", error, attempts)
        with self.store.lock(f"gate:{self.key}", timeout=120, renew=True):
            updated = lifecycle.finish(
                self.store,
                self.key,
                Status.FAILED,
                Reason.GATE_ERROR,
                detail,
                guard=Guard.WHILE_MERGING,
            )
            if updated is None:
                moved = self.store.get(self.key)
                if moved is not None and tidy_pending(moved):
                    # Merged, and GitHub failed every try of what follows (the branch,
                    # the receipt, the status comment's "merged"): nothing on GitHub says
                    # the loop ended, so the gate comes back to say it.
                    self._recheck_later()
                return f"gate error after the loop moved on: {error}"
            record = updated
        try:  # best effort: GitHub may be what is failing; the record says it all already
            gh = self.rt.github.installation(record.installation_id)
            if record.pr_number is not None:
                gh.upsert_comment(
                    self.repo,
                    record.pr_number,
                    "gate-error",
                    f"⚠️ loopbot stopped trying to merge this pull request: "
                    f"{messages.safe_text(detail)}.",
                )
            lifecycle.post_status(self.store, gh, updated)
        except Exception as exc:  # noqa: BLE001
            log.warning("gate.comment_failed", loop=self.key, error=str(exc)[:300])
        return "failed: gate_error"

    def _run_once(self) -> str:
        tally.enter("facts")  # what it reads before it decides; then the decision's own
        store = self.store
        with store.lock(f"gate:{self.key}", timeout=120, renew=True):
            record = store.get(self.key)
            if record is not None and tidy_pending(record):
                # Merged and recorded, and its tidying up (the branch, the receipt's one
                # post) failed: the retry does it, since nothing else on GitHub says it.
                gh = self.rt.github.installation(record.installation_id)
                self._tidy_merged(gh, record, record.branch)
                return "merged: receipt posted"
            if record is None or record.status != Status.MERGING or record.pr_number is None:
                merge_slot.pass_on(self.rt.redis, self.repo)  # woken, but no longer waiting
                return "not waiting to merge"
            gh = self.rt.github.installation(record.installation_id)
            config = self.rt.config(gh, self.repo)
            issue = gh.issue(self.repo, self.issue)
            pull = gh.pull(self.repo, record.pr_number)
            now = time.time()
            since = record.gate_since or now
            named, read = gh.required_checks_read(self.repo, pull.base_ref)
            required = (named or None) if config.merge.require_checks else None
            # A clean catch-up's head whose loop run was left to the critic, which
            # carried its approval there: a rule requiring that run by name (one added
            # since the loop and the critic read the rules), or rules that cannot be
            # read, get it written before any merge (red team, issue 43).
            if not read or lifecycle.LOOP_CHECK in named:
                self._loop_check_owed(gh, record, pull.head_sha)
            loop = LoopId(self.repo, self.issue)
            # A holder of the repository's merge slot keeps it while its gate runs, whatever
            # it decides (its new head's checks can take longer than the slot's time).
            merge_slot.keep(self.rt.redis, loop)
            facts = self._facts(gh, record, config, issue, pull, required, now - since)
            if facts.merge_queue:
                facts = replace(facts, **self._queue(gh, record, pull, required))
            decision = decide(facts)
            settled = isinstance(decision, AwaitPeople | Merge | Enqueue)
            if settled and self._resolve_own_threads(gh, pull):
                # The critic's verdict on this head stands: its own threads are settled
                # (fixed, dismissed, or advice it let pass). Read what GitHub asks again.
                facts = replace(facts, **self._people(gh, record, config, pull, now))
                decision = decide(facts)
            if needs_slot(decision):
                taken = self._take_slot(gh, loop, pull, facts, decision)
                if taken is None:
                    return MOVED_ON
                decision, facts = taken
            table = receipt.rows(facts, ready_label=config.labels.of_kind(record.kind))
            store.event(
                self.key,
                "gate",
                decision=type(decision).__name__,
                checks=facts.checks,
                required=sorted(required) if required is not None else "all",
                head=pull.head_sha,
                reviewed=record.reviewed_sha,
                **({"holder": decision.holder} if isinstance(decision, WaitTurn) else {}),
            )
            try:
                return self._act(gh, record, config, decision, table, issue, pull, since, facts)
            finally:
                after = store.get(self.key)
                if after is None or after.status in TERMINAL:  # ended, however: let go
                    merge_slot.release(self.rt.redis, loop)
                else:  # woken from the line but did not take the slot: the next's turn
                    merge_slot.pass_on(self.rt.redis, self.repo)

    def _take_slot(
        self, gh: Installation, loop: LoopId, pull: PullInfo, facts: Facts, decision: Decision
    ) -> tuple[Decision, Facts] | None:
        """The repository's merge slot for ``decision`` (a merge, or catching up): while
        another loop merges or catches up to merge, this one waits rather than race it
        (jobs/merge_slot.py). None when the loop ended while its facts were read."""
        other = merge_slot.take(self.rt.redis, loop)
        if other is not None:
            return WaitTurn(other), facts
        # A cancel does not wait for the gate's lock: it may have ended the loop (and let
        # go of nothing yet held) while the facts were read. An ended loop holds no slot.
        current = self.store.get(self.key)
        if current is None or current.status != Status.MERGING:
            merge_slot.release(self.rt.redis, loop)
            return None
        if isinstance(decision, Merge):
            # The slot's last holder may have merged after the facts were read: the head
            # must contain the default branch as it is now, read again under the slot.
            facts = replace(facts, **self._base(gh, pull.base_ref, pull.head_sha))
            decision = decide(facts)
        return decision, facts

    def _act(
        self,
        gh: Installation,
        record: LoopRecord,
        config: repo_config.RepoConfig,
        decision: Decision,
        table: list[receipt.Row],
        issue: IssueInfo,
        pull: PullInfo,
        since: float,
        facts: Facts,
    ) -> str:
        """Carry out ``decision`` (under the gate's lock)."""
        tally.enter(_snake(type(decision).__name__))
        if isinstance(decision, Merge | Enqueue) and (unmet := receipt.unmet(table)):
            # The decision and its receipt disagree: a condition the receipt cannot show
            # as passed is not one to merge on.
            why = "the merge receipt does not hold: " + ", ".join(
                f"{r.condition} ({r.result})" for r in unmet
            )
            decision = Refuse(Reason.GATE_ERROR, why)
        if record.receipt_text and not isinstance(decision, Merge | AlreadyMerged):
            # A merge call that failed (an error, retried) left its receipt held: another
            # decision now, so it is not this loop's receipt any more (red team).
            record = self._set(receipt_text="")
        match decision:
            case Merge(sha=sha):
                # Posted once, after the merge, with its commit (issue 43: one write where
                # a receipt before and its edit after were two); held in the record first.
                text = receipt.render(table, head=pull.head_sha, outcome=f"Merging {sha} now.")
                record = self._set(receipt_text=text)
                return self._merge(gh, record, config, facts, sha, issue.title, pull)
            case Enqueue(sha=sha):
                self._post_receipt(
                    gh, record, table, pull.head_sha, f"Adding {sha} to the merge queue now."
                )
                return self._enqueue(gh, record, sha, pull)
            case InQueue(why=why):
                return self._in_queue(gh, record, pull, why)
            case AlreadyMerged():
                if record.queue_head:  # the merge queue merged what loopbot enqueued
                    self.store.event(
                        self.key,
                        "merged",
                        sha=pull.merge_commit_sha or "",
                        pr=pull.number,
                        via="merge_queue",
                    )
                return self._completed(gh, record, pull.merge_commit_sha or "", pull.head_sha)
            case Refuse(reason=reason, why=why, to_person=to_person):
                self._post_receipt(gh, record, table, pull.head_sha, f"Not merged: {why}.")
                if reason is Reason.NEEDS_HUMAN or to_person:
                    gh.add_labels(self.repo, self.issue, [config.labels.needs_human])
                return self._refuse(gh, record, reason, why)
            case Review(why=why):
                moved = lifecycle.advance(
                    self.store, self.key, Status.REVIEWING, came_from=AT_GATE, detail=why
                )
                return "review again: " + why if moved else MOVED_ON
            case FixChecks(failing=failing, queue=queue):
                note = (
                    "The merge queue removed the pull request: its required checks failed "
                    f"on the merge group (this branch merged with the latest `{pull.base_ref}`"
                    "): " + ", ".join(failing) + ". Merge the latest "
                    f"`{pull.base_ref}` in if needed, and fix the code so they pass."
                    if queue
                    else "The pull request's required checks fail: "
                    + ", ".join(failing)
                    + ". Fix the code so they pass."
                )
                if lifecycle.requeue(self.store, self.key, Requeue.CHECKS, note=note) is None:
                    return MOVED_ON
                return "fixing checks"
            case FixConflicts(why=why):
                note = (
                    f"The pull request conflicts with `{pull.base_ref}`."
                    if why.startswith("the pull request conflicts")
                    else f"`{pull.base_ref}` moved since verify: loopbot merged it in; "
                    "check that the change still fits, then finish."
                )
                lifecycle.requeue(self.store, self.key, Requeue.CONFLICTS, note=note)
                self.store.event(self.key, "conflicts", base=pull.base_ref, why=why)
                return "resolving conflicts"
            case WaitTurn(holder=other):
                # Woken when the slot's holder ends; the timer is only the fallback. The
                # checks' clock does not run meanwhile. The status comment says it once:
                # a wake-up that finds the slot taken again changes nothing people see
                # (fifty loops' edits, every time one merges, would clog GitHub's line).
                why = "another loop of this repository merges first"
                if (record.phase, record.detail) != ("waiting_to_merge", why):
                    waiting = self._set(phase="waiting_to_merge", detail=why)
                    lifecycle.post_status(self.store, gh, waiting)
                self._recheck_later(merge_slot.RECHECK_SECONDS)
                return f"waiting: {why} ({other})"
            case AwaitPeople(why=why):
                return self._await_people(gh, record, pull, why)
            case Wait(why=why):
                waiting = self._set(gate_since=since, phase="waiting_for_checks", detail=why)
                self._recheck_later()
                lifecycle.post_status(self.store, gh, waiting)
                return "waiting: " + why
            case _:
                assert_never(decision)

    def _await_people(self, gh: Installation, record: LoopRecord, pull: PullInfo, why: str) -> str:
        """Wait for people without a worker: say so (status comment, check run, status),
        ask the writer who approved the issue to review (once), let go of the merge slot
        (people take hours; other loops merge meanwhile), and end the job. Their review's
        webhook wakes the gate; the timer is the sweep for a lost one."""
        merge_slot.release(self.rt.redis, LoopId(self.repo, self.issue))
        fields: dict[str, Any] = {"phase": AWAITING, "detail": why}
        if not record.review_since or record.review_head != pull.head_sha:
            fields |= {"review_since": time.time(), "review_head": pull.head_sha}
        asker = record.approved_by or record.started_by
        ask = [asker] if asker and asker not in record.review_asked else []
        if ask and record.pr_number is not None:
            gh.request_review(self.repo, record.pr_number, ask)
            fields["review_asked"] = [*record.review_asked, *ask]
        changed = (record.phase, record.detail) != (AWAITING, why)
        waiting = self._set(**fields)
        if changed:
            self.store.event(self.key, "awaiting_people", why=why, head=pull.head_sha)
            lifecycle.post_status(self.store, gh, waiting)
        self._recheck_later(PEOPLE_RECHECK_SECONDS)
        return "waiting for people: " + why

    def _queue(
        self,
        gh: Installation,
        record: LoopRecord,
        pull: PullInfo,
        required: frozenset[str] | None,
    ) -> dict[str, Any]:
        """Where the pull request stands in its base's merge queue, read now: in it (and
        where), or let go of since loopbot enqueued this head, and why (the timeline's
        last removal: the webhook may be lost), and what failed on the merge group."""
        state = gh.queue_state(self.repo, pull.number)
        enqueued = record.queue_head if record.queue_head == pull.head_sha else ""
        removed = queue_removal(
            enqueued_head=enqueued,
            removals_then=record.queue_removals,
            removals_now=state.removals,
            removed_head=state.removed_head,
            reason=state.removed_reason,
        )
        failing: tuple[str, ...] = ()
        if removed in ("CI_FAILURE", "CI_TIMEOUT") and record.queue_group:
            group = record.queue_group
            runs = [(c.name, c.status, c.conclusion) for c in gh.check_runs(self.repo, group)]
            results = classify_checks(runs, gh.commit_statuses(self.repo, group), required)
            failing = fold_checks(results)[1]
        return {
            "queue_in": state.in_queue and not removed,
            "queue_position": state.position,
            "queue_removed": removed,
            "queue_removed_by": state.removed_by if removed else "",
            "queue_failing": failing,
        }

    def _enqueue(self, gh: Installation, record: LoopRecord, sha: str, pull: PullInfo) -> str:
        """Add the pull request to the merge queue, pinned to ``sha``, the head the gate
        judged (GitHub refuses if the head moved). What it records first (the head and
        the count of earlier removals) is how a later gate knows the queue let go of it."""
        assert record.pr_number is not None
        state = gh.queue_state(self.repo, pull.number)
        if state.in_queue:
            return self._in_queue(gh, record, pull, "in the merge queue")
        record = self._set(merge_queue=True, queue_head=sha, queue_removals=state.removals)
        self.store.event(self.key, "enqueue", head=sha)
        result = gh.enqueue(state.node_id, sha)
        if not result.ok and not gh.queue_state(self.repo, pull.number).in_queue:
            now = gh.pull(self.repo, pull.number)
            if now.merged:  # a retried enqueue, and the queue merged the first meanwhile
                return self._completed(gh, record, now.merge_commit_sha or "", now.head_sha)
            hint = (
                " (the App needs the Merge queues permission: accept its new permissions)"
                if "not accessible" in result.error.lower()
                else ""
            )
            why = (
                "GitHub did not add the pull request to the merge queue: "
                + messages.safe_text(result.error[:300])
                + hint
            )
            return self._refuse(gh, record, Reason.NOT_MERGEABLE, why)
        self.store.event(self.key, "enqueued", head=sha, position=result.position)
        where = f" (position {result.position})" if result.position else ""
        return self._in_queue(
            gh,
            record,
            pull,
            f"in the merge queue{where}: its required checks run on the merge group",
        )

    def _in_queue(self, gh: Installation, record: LoopRecord, pull: PullInfo, why: str) -> str:
        """Wait for the queue without a worker, and let go of the repository's merge slot
        (the queue orders merges now). The queue's webhooks wake the gate; the timer is
        the sweep for a lost one."""
        merge_slot.release(self.rt.redis, LoopId(self.repo, self.issue))
        changed = (record.phase, record.detail) != (IN_QUEUE, why)
        waiting = self._set(phase=IN_QUEUE, detail=why)
        if changed:
            self.store.event(self.key, "in_merge_queue", why=why, head=pull.head_sha)
            lifecycle.post_status(self.store, gh, waiting)
        self._recheck_later(QUEUE_RECHECK_SECONDS)
        return "in the merge queue: " + why

    def _recheck_later(self, after: int = RECHECK_SECONDS) -> None:
        # Webhooks (or the merge slot let go) wake the gate sooner; this timer is the
        # fallback if one is lost. One timer per loop at a time, however often it wakes.
        if self.rt.redis.set(f"loopbot:gate-timer:{self.key}", "1", nx=True, ex=after - 5):
            enqueue_gate(self.rt.redis, self.repo, self.issue, after=after)

    def _loop_check_owed(self, gh: Installation, record: LoopRecord, head: str) -> None:
        """The loop's own check run (``lifecycle.LOOP_CHECK``, "verify passed") on
        ``head`` when the head is a clean catch-up's, verify passed there, and no such
        run is on it: the loop left it to the critic (``LoopRecord.loop_check_waiting``),
        and the approval carried without it. One left ``in_progress`` is completed."""
        verify = record.last_verify
        if record.catch_up.get("to") != head or verify.get("sha") != head:
            return
        if verify.get("passed") is not True:
            return
        runs = gh.check_runs(self.repo, head)
        if any(c.name == lifecycle.LOOP_CHECK and c.status == "completed" for c in runs):
            return  # one still in progress (a held update that went out) is completed
        gh.upsert_check_run(
            self.repo,
            lifecycle.LOOP_CHECK,
            head,
            status="completed",
            conclusion="success",
            title=f"verify passed on turn {record.turn}",
            summary=messages.status_line(record),
        )
        self.store.event(self.key, "loop_check_written", sha=head, by="gate")

    def _facts(
        self,
        gh: Installation,
        record: LoopRecord,
        config: repo_config.RepoConfig,
        issue: IssueInfo,
        pull: PullInfo,
        required: frozenset[str] | None,
        waited: float,
    ) -> Facts:
        """Everything the decision and its receipt rest on, read now for ``pull``'s head."""
        head = pull.head_sha
        results: tuple[CheckResult, ...] = ()
        if config.merge.require_checks:
            runs = [(c.name, c.status, c.conclusion) for c in gh.check_runs(self.repo, head)]
            results = classify_checks(runs, gh.commit_statuses(self.repo, head), required)
        checks, failing = fold_checks(results)
        protected = protected_changes(
            gh.pull_files(self.repo, pull.number), config.merge.protected_paths
        )
        open_log = [e for e in record.finding_log if e.get("status") == "open"]
        verify = record.last_verify
        post_action = self._post_action(gh, record, head)
        judged = record.reviewed_sha if post_action else head  # whose verdict counts
        return Facts(
            issue_open=issue.open,
            pr_open=pull.state == "open",
            pr_merged=pull.merged,
            head_sha=head,
            reviewed_sha=record.reviewed_sha,
            open_sev1=max(
                sum(1 for e in open_log if e.get("severity") == "sev1"),
                # The last review's own findings, should the log not carry them.
                sum(
                    1
                    for f in record.findings
                    if f.get("severity") == "sev1" and f.get("sha") == head
                ),
            ),
            checks=checks,
            failing_checks=failing,
            mergeable=pull.mergeable,
            require_checks=config.merge.require_checks,
            fix_turns_used=record.check_fixes,
            max_fix_turns=config.merge.max_fix_turns,
            waited_seconds=waited,
            max_wait_seconds=config.merge.wait_checks_minutes * 60,
            protected_changes=protected,
            ready_label=config.labels.of_kind(record.kind) in issue.labels,  # the loop's own
            verify_sha=str(verify.get("sha") or ""),
            verify_passed=verify.get("passed") is True,
            # The last review's verdict is on this head too when it reviewed this head:
            # the critic writes both in one update.
            verdict=record.verdicts.get(judged)
            or (record.verdict if record.reviewed_sha == judged else ""),
            post_action_sha=post_action,
            **self._base(gh, pull.base_ref, head),
            **self._people(gh, record, config, pull, time.time()),
            dismissed_by=", ".join(
                sorted(
                    {
                        f"@{e.get('dismissed_by')}"
                        for e in record.finding_log
                        if e.get("status") == "dismissed"
                        and e.get("severity") == "sev1"
                        and e.get("dismissed_sha") == head
                    }
                )
            ),
            **_held_out(record, judged),
            changed_lines=(
                None
                if pull.additions is None or pull.deletions is None
                else pull.additions + pull.deletions
            ),
            changed_files=pull.changed_files,
            max_changed_lines=config.limits.max_changed_lines,
            max_changed_files=config.limits.max_changed_files,
            check_results=results,
            open_findings=tuple(
                (str(e.get("id", "")), str(e.get("severity", "")), str(e.get("title", "")))
                for e in open_log
            ),
        )

    def _people(
        self,
        gh: Installation,
        record: LoopRecord,
        config: repo_config.RepoConfig,
        pull: PullInfo,
        now: float,
    ) -> dict[str, Any]:
        """What the base branch asks of people, read now: the rulesets' pull_request
        rule, GitHub's review decision (which covers classic protection), the unresolved
        threads of people, the merge method's being allowed, and how long it has waited."""
        rules = gh.branch_review_rules(self.repo, pull.base_ref)
        info = gh.repo(self.repo)
        method = config.merge.method
        allowed = {
            "squash": info.allow_squash_merge,
            "merge": info.allow_merge_commit,
            "rebase": info.allow_rebase_merge,
        }.get(method, False) and (rules.methods is None or method in rules.methods)
        state = gh.review_state(self.repo, pull.number)
        own = self._own_logins(gh)
        people: list[str] = []
        if rules.threads or _blocked_unexplained(state):
            # Only a rule makes a person's open thread hold the merge (GitHub merges past
            # it otherwise); a thread anyone but loopbot wrote in is theirs to resolve.
            people = sorted(
                {a for t in state.threads if not t.resolved for a in t.authors if a not in own}
            )
            if state.threads_total > len(state.threads):
                people.append("(threads beyond the first 100 not read)")
        last_push_approved = True
        if rules.last_push and state.decision != "CHANGES_REQUESTED":
            # GitHub's decision may say APPROVED on an approval of an earlier head (the
            # base merged in since, say): the rule asks a writer to approve this one.
            reviews = [
                (r.author, r.state, r.commit_id or "") for r in gh.reviews(self.repo, pull.number)
            ]
            last_push_approved = any(
                gh.can_write(self.repo, login)
                for login in sorted(head_approvers(reviews, pull.head_sha, own))
            )
        owners: tuple[str, ...] = ()
        if rules.code_owners and state.decision == "REVIEW_REQUIRED":
            text = gh.codeowners(self.repo, pull.base_ref)
            if text is not None:
                groups = required_owners(text, gh.pull_files(self.repo, pull.number))
                owners = tuple(dict.fromkeys(o for g in groups for o in g))
        return {
            "review_decision": state.decision,
            "approvals_required": rules.approvals,
            "code_owners_waiting": owners,
            "people_threads": tuple(people),
            "method": method,
            "method_allowed": allowed,
            "last_push_approved": last_push_approved,
            "review_waited_seconds": (
                now - record.review_since
                if record.review_since and record.review_head == pull.head_sha
                else 0.0
            ),
            "max_review_wait_seconds": config.merge.approval_timeout_hours * 3600.0,
            "merge_queue": rules.merge_queue or record.merge_queue,
        }

    def _own_logins(self, gh: Installation) -> frozenset[str]:
        slug = gh.app.slug()
        return frozenset({slug, f"{slug}[bot]"})

    def _resolve_own_threads(self, gh: Installation, pull: PullInfo) -> bool:
        """Resolve loopbot's own unresolved review threads when the base branch asks for
        resolved conversations (a ruleset says so; classic protection's setting is not
        readable, so also when GitHub blocks the merge and no review explains it). Never
        a person's thread. Whether any was resolved."""
        state = gh.review_state(self.repo, pull.number)
        own = self._own_logins(gh)
        # Loopbot's own: every comment in it is loopbot's. Once a person has replied
        # (say, "not fixed"), the thread is theirs as much as loopbot's: never resolved.
        mine = [
            t
            for t in state.threads
            if not t.resolved and t.authors and all(a in own for a in t.authors)
        ]
        if not mine:
            return False
        rules = gh.branch_review_rules(self.repo, pull.base_ref)
        if not (rules.threads or _blocked_unexplained(state)):
            return False
        for thread in mine:
            gh.resolve_thread(thread.id)
        self.store.event(self.key, "threads_resolved", count=len(mine), head=pull.head_sha)
        return True

    def _post_action(self, gh: Installation, record: LoopRecord, head: str) -> str:
        """``head`` when it is the post-action commit the loop recorded, exactly one
        commit on top of the approved reviewed sha as GitHub compares them; else ""."""
        pa = record.post_action
        if pa.get("status") != "kept" or pa.get("sha") != head or not record.reviewed_sha:
            return ""  # no need to ask GitHub
        compare = gh.compare_counts(self.repo, record.reviewed_sha, head)
        ok = post_action_head(
            pa,
            reviewed_sha=record.reviewed_sha,
            verdict=record.verdicts.get(record.reviewed_sha, ""),
            head_sha=head,
            compare=compare,
        )
        return head if ok else ""

    def _base(self, gh: Installation, base_ref: str, head: str) -> dict[str, Any]:
        """Whether ``head`` contains the default branch's tip now (an API error is raised:
        the retry path, never a pass)."""
        status, base_sha = gh.compare_status(self.repo, base_ref, head)
        included = {"ahead": True, "identical": True, "behind": False, "diverged": False}
        return {"base_included": included.get(status), "base_sha": base_sha}

    def _merge(
        self,
        gh: Installation,
        record: LoopRecord,
        config: repo_config.RepoConfig,
        facts: Facts,
        sha: str,
        title: str,
        pull: PullInfo,
    ) -> str:
        assert record.pr_number is not None
        try:
            result = gh.merge_pull(
                self.repo,
                record.pr_number,
                sha,
                "squash",
                messages.squash_title(title),
                messages.merge_message(record, sha),
                closes=self.issue,
            )
        except Conflict as exc:
            if exc.status == 409:  # the head moved between our read and the merge
                self._set(receipt_text="")  # not this merge's: the next decision has its own
                why = "the head moved while merging"
                moved = lifecycle.advance(
                    self.store, self.key, Status.REVIEWING, came_from=AT_GATE, detail=why
                )
                return "head moved: review again" if moved else MOVED_ON
            now = gh.pull(self.repo, record.pr_number)  # 405: merged already, or not mergeable
            if now.merged:
                # This merge's answer was lost (a retried PUT): the held receipt is its,
                # and the head it merged is the one the PUT was pinned to.
                return self._completed(gh, record, now.merge_commit_sha or "", sha)
            self._set(receipt_text="")  # not this merge's: the next decision has its own
            if "merge queue" in str(exc).lower():
                # A merge queue the rules did not show (classic protection's, which the App
                # cannot read): the one refused merge says so; the queue takes it from here.
                self.store.event(self.key, "merge_queue_required", why=str(exc)[:300])
                return self._enqueue(gh, self._set(merge_queue=True), sha, pull)
            # A person may have acted between the read and the call (a thread opened, an
            # approval dismissed, changes requested): that is a wait for them, not a
            # reason to end the loop. Read what the base branch asks again.
            people = self._people(gh, record, config, now, time.time())
            if now.head_sha == sha and (wanted := people_wanted(replace(facts, **people))):
                return self._await_people(gh, record, now, wanted)
            if record.receipt_text:  # what the gate checked, and GitHub's refusal
                self._post_text(gh, record, receipt.refused(record.receipt_text, str(exc)))
            return self._refuse(gh, record, Reason.NOT_MERGEABLE, str(exc))
        self._set(merge_sha=result.sha)
        self.store.event(self.key, "merged", sha=result.sha, pr=record.pr_number)
        return self._completed(gh, record, result.sha, sha)

    def _post_receipt(
        self,
        gh: Installation,
        record: LoopRecord,
        table: list[receipt.Row],
        head: str,
        outcome: str,
    ) -> None:
        self._post_text(gh, record, receipt.render(table, head=head, outcome=outcome))

    def _post_text(self, gh: Installation, record: LoopRecord, text: str) -> None:
        assert record.pr_number is not None
        posted = gh.upsert_comment(
            self.repo, record.pr_number, receipt.COMMENT_KEY, text, record.receipt_comment_id
        )
        self._set(receipt_comment_id=posted.id, receipt_text="")

    def _receipt_merged(self, gh: Installation, record: LoopRecord, merge_sha: str) -> None:
        """Show the receipt of the merge with its commit and the loop's total cost and
        tokens in the status comment's last edit; or add them to a receipt posted on the
        pull request before (a merge queue's, a refused merge's), if there is one."""
        if record.pr_number is None or not merge_sha:
            return
        now = self.store.get(self.key)
        if now is not None and now.receipt_text:
            held, total = now.receipt_text, spend_lines.total(now)
            text = receipt.merged(held, merge_sha, total) or held
            if now.receipt_comment_id is not None:
                self._post_text(gh, now, text)
                return
            # One write: the status comment says "merged" and shows what the gate checked.
            # Sent now, raising as it fails: the text stays held, and the gate's retry
            # shows it (``tidy_pending``).
            shown = self._set(merge_receipt=text)
            lifecycle.post_status(self.store, gh, shown, now=True)
            self._set(receipt_text="")
            return
        posted = gh.find_comment(self.repo, record.pr_number, receipt.COMMENT_KEY)
        if posted is None:
            return  # merged by someone else, before loopbot posted a receipt
        added = receipt.merged(posted.body, merge_sha, spend_lines.total(record))
        if added is not None:
            gh.upsert_comment(self.repo, record.pr_number, receipt.COMMENT_KEY, added, posted.id)

    def _completed(self, gh: Installation, record: LoopRecord, merge_sha: str, head: str) -> str:
        # Record the merge first: everything after it is tidying up that a retry may redo.
        updated = lifecycle.finish(
            self.store,
            self.key,
            Status.COMPLETED,
            Reason.MERGED,
            f"merged pull request #{record.pr_number} through the merge queue"
            if record.queue_head
            else f"squash-merged pull request #{record.pr_number}",
            merge_sha=merge_sha or record.merge_sha,  # GitHub may not say: keep what was
            merged_head=head,
        )
        assert updated is not None  # a merge ends any loop, a cancelled one too
        self._tidy_merged(gh, updated, record.branch)
        return "merged"

    def _tidy_merged(self, gh: Installation, record: LoopRecord, branch: str) -> None:
        """After the merge: the branch goes, then the receipt is shown. The held receipt
        text is cleared last (``_receipt_merged``), so a run that fails anywhere here is
        redone whole by the gate's retry (``tidy_pending``): the branch's deletion
        again finds it gone."""
        tally.enter("tidy")
        mirror = Worktrees(self.rt.settings.data_dir).mirror_path(self.repo)
        merged_branch.tidy(self.store, gh, record, branch, mirror)
        self._receipt_merged(gh, record, record.merge_sha)
        # As it is now: with the receipt just shown (``record`` is from before it).
        lifecycle.post_status(self.store, gh, self.store.get(self.key) or record)

    def _refuse(self, gh: Installation, record: LoopRecord, reason: Reason, why: str) -> str:
        # Always: the gate decided on the status it read under its lock, and an issue
        # closed under an open pull request is refused after the gate cancelled the loop.
        updated = lifecycle.finish(
            self.store, self.key, Status.REFUSED, reason, why, guard=Guard.ALWAYS
        )
        assert updated is not None  # Guard.ALWAYS applies
        self.store.event(self.key, "merge_refused", reason=reason.value, why=why)
        text = f"🛑 loopbot did not merge this pull request: {why}."
        if record.pr_number is not None:
            gh.upsert_comment(self.repo, record.pr_number, f"refused:{record.reviewed_sha}", text)
        lifecycle.post_status(self.store, gh, updated)
        return f"refused: {why}"

    def _set(self, **fields: object) -> LoopRecord:
        return self.store.set_fields(self.key, **fields)


def _blocked_unexplained(state: ReviewState) -> bool:
    """GitHub blocks the merge and no review decision explains it: with the checks green
    (the gate asks only then), classic protection's conversation rule, unreadable to the
    App, is what is left."""
    return state.merge_state == "BLOCKED" and state.decision in (None, "APPROVED")


def _held_out(record: LoopRecord, judged: str) -> dict[str, Any]:
    """Held-out verify on the judged head (bot/core/evidence/held_out.py): loopbot's own
    evidence, read from the record as the loop left it, not from the critic. Evidence on
    another head (a loop resumed past the check) is no evidence: when this head changed
    tests after a base whose verify failed, a person decides."""
    ev = record.test_evidence
    dismissed = sorted(
        {
            f"@{e.get('dismissed_by')}"
            for e in record.finding_log
            if e.get("fingerprint") == TESTS_CHANGED_FINGERPRINT and dismissal_holds(e, ev)
        }
    )
    out: dict[str, Any] = {"held_out": tuple(held_out.facts(ev)) if ev.get("sha") == judged else ()}
    why = ""
    if record.kind == "metric":
        return out
    if held_out.stands(ev, judged):
        why = held_out.summary(ev)
    elif (
        ev.get("sha") != judged
        and record.tests_changed
        and record.base_verify
        and record.base_verify.get("passed") is False
    ):
        why = (
            f"held-out verify was not run on {judged[:10]}, which changes tests after verify "
            "failed on the base: loopbot cannot show the tests as approved pass"
        )
    if why and dismissed:
        out["tests_dismissed_by"] = ", ".join(dismissed)
    elif why:
        out["tests_changed_to_pass"] = "the tests were changed to pass: " + why
    return out


def _snake(name: str) -> str:
    """``WaitTurn`` -> ``wait_turn``: a decision's name as a phase of the gate. Pure."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
