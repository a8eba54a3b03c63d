"""The merge decision: a pure function of what the gate read at the moment of merging."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from bot.core.record import Reason
from bot.core.text.messages import code_span

OWN_CHECKS = frozenset({"loopbot", "loopbot/critic"})

ChecksState = Literal["none", "pending", "success", "failure", "unknown"]
Outcome = Literal["pass", "fail", "pending", "unknown"]

# Every state the gate understands, as an allowlist: anything else GitHub reports (``stale``,
# ``startup_failure``, a value added next year, a missing field) is ``unknown``, and an
# unknown required check refuses the merge rather than counting as green.
RUN_PENDING = frozenset({"queued", "in_progress", "waiting", "requested", "pending"})
RUN_PASS = frozenset({"success", "neutral", "skipped"})
RUN_FAIL = frozenset({"failure", "timed_out", "cancelled", "action_required"})
STATUS_PASS = frozenset({"success"})
STATUS_FAIL = frozenset({"failure", "error"})
STATUS_PENDING = frozenset({"pending"})


@dataclass(frozen=True)
class CheckResult:
    """One check the gate counted, as GitHub reported it on the head."""

    name: str
    kind: Literal["check run", "commit status", "expected"]
    state: str  # what GitHub said: ``completed/success``, ``pending``, ``not reported``
    outcome: Outcome


@dataclass(frozen=True)
class Facts:
    issue_open: bool
    pr_open: bool
    pr_merged: bool
    head_sha: str
    reviewed_sha: str
    open_sev1: int
    checks: ChecksState
    failing_checks: tuple[str, ...]
    mergeable: bool | None
    require_checks: bool
    fix_turns_used: int
    max_fix_turns: int
    waited_seconds: float
    max_wait_seconds: float
    protected_changes: tuple[str, ...] = ()
    # The issue still carries the loop's label: the ready label, or the optimize label
    # for a metric loop (``LabelsConfig.of_kind``).
    ready_label: bool = True
    # Evidence on the head, each "not established" by default so that a caller that
    # forgets one gets a refusal, never a merge.
    verify_sha: str = ""  # the commit the last verify ran on
    verify_passed: bool = False
    verdict: str = ""  # the critic's verdict on ``head_sha``
    # Writers who dismissed (``/loop-dismiss``) the sev1 findings raised on ``head_sha``:
    # the critic's verdict stays what it was, and the receipt says who overrode it.
    dismissed_by: str = ""
    # Whether the head contains the default branch's current tip (GitHub's compare):
    # verify ran on the head, so a base that moved since is a combination never
    # verified. None: not established.
    base_included: bool | None = None
    base_sha: str = ""
    changed_lines: int | None = None  # additions + deletions against the base
    changed_files: int | None = None
    max_changed_lines: int = 1000
    max_changed_files: int = 100
    # post_action (loop.yml): the head is loopbot's own post-action commit, exactly one
    # commit on top of ``reviewed_sha`` (``post_action_head``); "" when it is not.
    post_action_sha: str = ""
    # What the base branch asks of people before a merge (bot/io/github/rules.py):
    # GraphQL's reviewDecision (None: no review required), the approvals a ruleset asks
    # (0 when only classic protection asks, which an App cannot read), the code owners
    # still to approve, the people whose review threads are unresolved, and whether the
    # repository and the rules allow loopbot's merge method.
    review_decision: str | None = None
    approvals_required: int = 0
    code_owners_waiting: tuple[str, ...] = ()
    people_threads: tuple[str, ...] = ()
    method: str = "squash"
    method_allowed: bool = True
    # require_last_push_approval: whether a writer's latest review approves the head
    # itself (an approval of an earlier head does not satisfy the rule, and GitHub's
    # review decision may still say APPROVED); True when the rule is not set.
    last_push_approved: bool = True
    review_waited_seconds: float = 0.0
    max_review_wait_seconds: float = 7 * 86400.0
    # The base requires a merge queue (a ``merge_queue`` rule, or the merge endpoint said
    # so): the queue merges, not loopbot. Whether the pull request is in it now and where,
    # and why the queue let go of the head loopbot enqueued ("" when it has not: see
    # ``queue_removal``), who removed it, and the required checks that failed on the
    # merge group.
    merge_queue: bool = False
    queue_in: bool = False
    queue_position: int = 0
    queue_removed: str = ""
    queue_removed_by: str = ""
    queue_failing: tuple[str, ...] = ()
    # Held-out verify (bot/core/evidence/held_out.py): why the head passes verify only with
    # the tests it changed ("" when it does not, or a writer dismissed loopbot's finding:
    # ``tests_dismissed_by``), and what was run, for the receipt.
    tests_changed_to_pass: str = ""
    tests_dismissed_by: str = ""
    held_out: tuple[str, ...] = ()
    # For the receipt only: what the checks were, and the findings still open.
    check_results: tuple[CheckResult, ...] = ()
    open_findings: tuple[tuple[str, str, str], ...] = ()  # (id, severity, title)


@dataclass(frozen=True)
class Merge:
    sha: str


@dataclass(frozen=True)
class Enqueue:
    """Every condition holds and the base requires a merge queue: add the pull request
    to it, pinned to ``sha`` (the head the critic reviewed)."""

    sha: str


@dataclass(frozen=True)
class InQueue:
    """The pull request is in the merge queue: the queue runs the required checks on
    its merge group and merges it; the loop waits without a worker."""

    why: str


@dataclass(frozen=True)
class AlreadyMerged:
    pass


@dataclass(frozen=True)
class Wait:
    why: str


@dataclass(frozen=True)
class AwaitPeople:
    """The base branch asks a person for something (an approval, a code owner's review,
    a resolved thread): the loop waits without a worker, woken by their review."""

    why: str


@dataclass(frozen=True)
class Review:
    why: str


@dataclass(frozen=True)
class FixChecks:
    failing: tuple[str, ...]
    queue: bool = False  # they failed on the merge queue's merge group, not on the head


@dataclass(frozen=True)
class FixConflicts:
    """The branch conflicts with the base, or is behind it: merge the base in, let the
    agent resolve what conflicts, and verify again."""

    why: str = "the pull request conflicts with the default branch"


@dataclass(frozen=True)
class Refuse:
    reason: Reason
    why: str
    # Hand it to a person (the needs-human label) though the reason is another: a merge
    # queue's checks that failed past the fix turns leave an open pull request to finish.
    to_person: bool = False


@dataclass(frozen=True)
class WaitTurn:
    """Another loop of the repository (``holder``) holds its merge slot: it merges, or
    catches up to merge, first (jobs/merge_slot.py). Not ``decide``'s: the gate's, when
    the slot it needed was taken."""

    holder: str


Decision = (
    Merge
    | Enqueue
    | InQueue
    | AlreadyMerged
    | Wait
    | AwaitPeople
    | Review
    | FixChecks
    | FixConflicts
    | Refuse
    | WaitTurn
)


def needs_slot(d: Decision) -> bool:
    """Whether carrying out ``d`` moves the default branch or catches up with it: a
    merge, or merging the base in. Those take the repository's merge slot first."""
    return isinstance(d, Merge | FixConflicts)


def decide(f: Facts) -> Decision:
    """Merge only reviewed code, for an open issue, with no blocking finding and green checks."""
    if f.pr_merged:
        return AlreadyMerged()
    if not f.issue_open:
        return Refuse(Reason.ISSUE_CLOSED, "the issue was closed while the loop ran")
    if not f.ready_label:
        # Re-read now: the unlabeled webhook may have been lost, and it is the label that
        # allows loopbot to act on the issue at all.
        return Refuse(
            Reason.ISSUE_INACTIVE, "the ready label was removed from the issue while the loop ran"
        )
    if not f.pr_open:
        return Refuse(Reason.PULL_CLOSED, "the pull request was closed")
    if f.open_sev1:
        return Refuse(Reason.CRITIC_ROUNDS, f"{f.open_sev1} sev1 finding(s) stand")
    if f.tests_changed_to_pass:  # loopbot's own evidence, whatever the critic said
        return Refuse(Reason.NEEDS_HUMAN, f.tests_changed_to_pass)
    if not reviewed_head(f):
        return Review(
            f"the head moved to {f.head_sha[:10]} after the review of "
            f"{f.reviewed_sha[:10] or 'nothing'}"
        )
    if f.verdict != "approve" and not (f.dismissed_by and f.verdict not in ("", "error")):
        return Refuse(
            Reason.NEEDS_HUMAN,
            f"the critic's verdict on {f.head_sha[:10]} is "
            + (f"`{f.verdict}`, not approve" if f.verdict else "not recorded"),
        )
    if f.verify_sha != f.head_sha or not f.verify_passed:
        return Refuse(Reason.NEEDS_HUMAN, verify_problem(f))
    if f.protected_changes:
        shown = ", ".join(code_span(p) for p in f.protected_changes[:5])
        more = len(f.protected_changes) - 5
        return Refuse(
            Reason.NEEDS_HUMAN,
            f"the pull request changes protected paths ({shown}"
            + (f" and {more} more" if more > 0 else "")
            + "), which loopbot never merges on its own",
        )
    if (scope := scope_problem(f)) is not None:
        return Refuse(Reason.NEEDS_HUMAN, scope)
    if f.require_checks:
        if f.checks == "unknown":
            return Refuse(
                Reason.NEEDS_HUMAN,
                "loopbot cannot tell whether these required checks passed: "
                + ", ".join(f.failing_checks),
            )
        if f.checks == "failure":
            if f.fix_turns_used < f.max_fix_turns:
                return FixChecks(f.failing_checks)
            return Refuse(
                Reason.CHECKS_FAILED, "required checks fail: " + ", ".join(f.failing_checks)
            )
        if f.checks == "pending":
            if f.waited_seconds >= f.max_wait_seconds:
                return Refuse(
                    Reason.CHECKS_TIMEOUT,
                    f"checks still pending after {f.waited_seconds / 60:.0f} minutes",
                )
            return Wait("required checks are still running")
    if f.base_included is None and not f.merge_queue:
        return Refuse(
            Reason.NEEDS_HUMAN,
            "loopbot cannot tell whether the head contains the default branch as it is now",
        )
    if f.base_included is False and f.mergeable is not False and not f.merge_queue:
        # (A merge queue tests the head merged with the base as it is when its turn
        # comes: that is its point; merging the base in would only push and re-review.)
        # The base moved after verify (another loop merged first): the squash would land
        # a combination nobody ran verify on. Merge the base in and verify again.
        if f.fix_turns_used < f.max_fix_turns:
            return FixConflicts(f"the default branch moved to {f.base_sha[:10]} since verify")
        return Refuse(
            Reason.NOT_MERGEABLE,
            "the default branch keeps moving ahead of the verified head; merge it by hand",
        )
    if f.mergeable is False:
        # Usual when several loops drain one repository's backlog: another merged first.
        if f.fix_turns_used < f.max_fix_turns:
            return FixConflicts()
        return Refuse(Reason.NOT_MERGEABLE, "the pull request conflicts with the default branch")
    if f.mergeable is None:
        return Wait("GitHub is still computing whether the pull request can merge")
    if not f.method_allowed and not f.merge_queue:  # the queue's own method lands it
        return Refuse(
            Reason.NOT_MERGEABLE,
            f"{f.method} merges are not allowed on this repository or its base branch, and "
            "loopbot merges only by squash; allow squash merging, or merge it by hand",
        )
    if (wanted := people_wanted(f)) is not None:
        if f.review_waited_seconds >= f.max_review_wait_seconds:
            hours = f.max_review_wait_seconds / 3600
            return Refuse(
                Reason.NEEDS_HUMAN,
                f"still {wanted} after {hours:.0f} hours (merge.approval_timeout_hours); "
                "a person takes it from here",
            )
        return AwaitPeople(wanted)
    if f.merge_queue:
        return through_queue(f)
    return Merge(f.head_sha)  # the reviewed sha, or the post-action commit on top of it


QUEUE_CHECKS = "the merge queue's required checks"


def through_queue(f: Facts) -> Decision:
    """Every condition for a merge holds and the base takes changes only through its
    merge queue: enqueue the head, wait while it is queued, and when the queue let go of
    it, act on why (GitHub's ``RemovedFromMergeQueueEvent`` reason): failing checks on the
    merge group get a fix turn while turns are left; a person's removal, or any other
    reason, goes to a person (loopbot does not put back what a person took out)."""
    if f.queue_in:
        where = f" (position {f.queue_position})" if f.queue_position else ""
        return InQueue(f"in the merge queue{where}: its required checks run on the merge group")
    reason = f.queue_removed
    if not reason:
        return Enqueue(f.head_sha)
    if reason in ("MERGE", "ALREADY_MERGED"):
        # GitHub records the removal a moment before the merge lands: the pull request's
        # ``merged`` follows (its closed webhook, or the next look).
        return InQueue("the merge queue is merging it")
    if reason in ("CI_FAILURE", "CI_TIMEOUT"):
        failing = f.queue_failing or (QUEUE_CHECKS,)
        if f.fix_turns_used < f.max_fix_turns:
            return FixChecks(failing, queue=True)
        what = "timed out" if reason == "CI_TIMEOUT" else "failed"
        return Refuse(
            Reason.CHECKS_FAILED,
            f"the merge queue removed the pull request: its required checks {what} on the "
            "merge group (" + ", ".join(failing) + "); a person takes it from here",
            to_person=True,
        )
    if reason == "MANUAL":
        who = f"@{f.queue_removed_by}" if f.queue_removed_by else "a person"
        return Refuse(
            Reason.NEEDS_HUMAN,
            f"{who} removed the pull request from the merge queue; loopbot does not put "
            "it back: a person decides what happens next",
        )
    return Refuse(
        Reason.NEEDS_HUMAN,
        f"the merge queue removed the pull request ({code_span(reason)}); a person takes it "
        "from here",
    )


def queue_removal(
    *, enqueued_head: str, removals_then: int, removals_now: int, removed_head: str, reason: str
) -> str:
    """Why the queue let go of the head loopbot enqueued: the last removal's reason when
    one happened since loopbot enqueued that head (the count of removals grew) and it
    was that head's; "" otherwise (never enqueued, or still in, or an older removal)."""
    if not enqueued_head or removals_now <= removals_then:
        return ""
    if removed_head and removed_head != enqueued_head:
        return ""
    # The webhook says CI_FAILURE, MANUAL...; the timeline has been seen to spell them in
    # lower case ("manual"): one vocabulary.
    return reason.upper() or "UNKNOWN_REMOVAL_REASON"


def people_wanted(f: Facts) -> str | None:
    """What the base branch still asks of people before the merge, said as the status
    comment shows it ("waiting for 1 approving review by a writer; code owners: @x"), or
    None when it asks nothing more. GitHub's review decision is what counts: it knows
    classic protection's rules too, which the App cannot read."""
    parts = []
    if f.review_decision == "REVIEW_REQUIRED":
        n = max(f.approvals_required, 1 if not f.code_owners_waiting else 0)
        ask = []
        if n:
            ask.append(f"{n} approving review{'s' if n > 1 else ''} by a writer")
        if f.code_owners_waiting:
            ask.append("code owners: " + ", ".join(f.code_owners_waiting))
        parts.append("waiting for " + "; ".join(ask or ["an approving review"]))
    elif f.review_decision == "CHANGES_REQUESTED":
        parts.append("waiting: a writer requested changes, and their review must approve")
    elif not f.last_push_approved:
        parts.append("waiting for a writer's approval of the latest push")
    if f.people_threads:
        who = ", ".join(f"@{p}" for p in f.people_threads)
        parts.append(f"waiting for {who} to resolve their review thread(s)")
    return "; ".join(parts) if parts else None


_COUNTED_REVIEWS = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})


def head_approvers(reviews: list[tuple[str, str, str]], head: str, own: frozenset[str]) -> set[str]:
    """Who approves ``head`` itself, from (author, state, commit) in submission order:
    each person's latest APPROVED, CHANGES_REQUESTED or DISMISSED review counts (a
    COMMENTED one changes nothing, as on GitHub); loopbot's own never does."""
    latest: dict[str, tuple[str, str]] = {}
    for author, state, commit in reviews:
        if state.upper() in _COUNTED_REVIEWS:
            latest[author] = (state.upper(), commit)
    return {a for a, (st, c) in latest.items() if st == "APPROVED" and c == head and a not in own}


def reviewed_head(f: Facts) -> bool:
    """Whether the head is what the critic reviewed, or loopbot's post-action commit
    right on top of it (``post_action_head`` established that)."""
    if not f.reviewed_sha:
        return False
    return f.head_sha == f.reviewed_sha or (
        bool(f.post_action_sha) and f.post_action_sha == f.head_sha
    )


def post_action_head(
    recorded: dict[str, object],
    *,
    reviewed_sha: str,
    verdict: str,
    head_sha: str,
    compare: tuple[str, int, int] | None,
) -> bool:
    """Whether ``head_sha`` is loopbot's post-action commit and nothing else: the loop
    recorded it as kept (``recorded``: ``LoopRecord.post_action``), made on the very
    sha the critic reviewed and approved, and GitHub's compare of the reviewed sha with
    the head (status, ahead by, behind by) shows exactly that one commit on top. A head
    that moved for any other reason (a push on top, a rebase, a different commit) is not
    it, and goes back to review."""
    return (
        recorded.get("status") == "kept"
        and bool(reviewed_sha)
        and verdict == "approve"
        and recorded.get("base") == reviewed_sha
        and bool(head_sha)
        and recorded.get("sha") == head_sha
        and head_sha != reviewed_sha
        and compare == ("ahead", 1, 0)
    )


def verify_problem(f: Facts) -> str:
    """Why the verify evidence does not cover the head (only called when it does not)."""
    if not f.verify_sha:
        return f"no verify run is recorded on the head {f.head_sha[:10]}"
    if f.verify_sha != f.head_sha:
        return f"verify last ran on {f.verify_sha[:10]}, not on the head {f.head_sha[:10]}"
    return f"verify failed on the head {f.head_sha[:10]}"


def scope_problem(f: Facts) -> str | None:
    """Why the change is too large to merge without a person, or None when it is not."""
    if f.changed_lines is None or f.changed_files is None:
        return "the size of the change could not be established"
    over = []
    if f.changed_lines > f.max_changed_lines:
        over.append(f"{f.changed_lines} changed lines (limit {f.max_changed_lines})")
    if f.changed_files > f.max_changed_files:
        over.append(f"{f.changed_files} changed files (limit {f.max_changed_files})")
    if not over:
        return None
    return (
        "the change is larger than this repository lets loopbot merge on its own: "
        + " and ".join(over)
        + "; a person should review it, or split the issue into smaller ones"
    )


def classify_checks(
    runs: list[tuple[str, str, str | None]],
    statuses: list[tuple[str, str]],
    required: frozenset[str] | None = None,
) -> tuple[CheckResult, ...]:
    """The checks that count, each with its outcome (see ``summarize_checks``)."""
    wanted = None if required is None else required - OWN_CHECKS
    results: list[CheckResult] = []
    for name, status, conclusion in runs:
        if name in OWN_CHECKS or (wanted is not None and name not in wanted):
            continue
        outcome: Outcome
        if status == "completed":
            state = f"completed/{conclusion}"
            if conclusion in RUN_PASS:
                outcome = "pass"
            elif conclusion in RUN_FAIL:
                outcome = "fail"
            else:
                outcome = "unknown"
        else:
            state = str(status)
            outcome = "pending" if status in RUN_PENDING else "unknown"
        results.append(CheckResult(name, "check run", state, outcome))
    for context, state in statuses:
        if wanted is not None and context not in wanted:
            continue
        if state in STATUS_PASS:
            outcome = "pass"
        elif state in STATUS_FAIL:
            outcome = "fail"
        elif state in STATUS_PENDING:
            outcome = "pending"
        else:
            outcome = "unknown"
        results.append(CheckResult(context, "commit status", str(state), outcome))
    reported = {r.name for r in results}
    for name in sorted((wanted or frozenset()) - reported):
        results.append(CheckResult(name, "expected", "not reported", "pending"))
    return tuple(results)


def fold_checks(results: tuple[CheckResult, ...]) -> tuple[ChecksState, tuple[str, ...]]:
    """One state for all ``results``, and the checks behind a failure or an unknown state.

    Unknown wins over everything: a check the gate cannot read may be the one that failed.
    """
    unknown = [
        f"{code_span(r.name)} ({r.kind} state {code_span(r.state)})"
        for r in results
        if r.outcome == "unknown"
    ]
    if unknown:
        return "unknown", tuple(unknown)
    failing = [r.name for r in results if r.outcome == "fail"]
    if failing:
        return "failure", tuple(failing)
    if any(r.outcome == "pending" for r in results):
        return "pending", ()
    return ("success" if results else "none"), ()


def summarize_checks(
    runs: list[tuple[str, str, str | None]],
    statuses: list[tuple[str, str]],
    required: frozenset[str] | None = None,
) -> tuple[ChecksState, tuple[str, ...]]:
    """Fold check runs (name, status, conclusion) and commit statuses (context, state).

    ``required`` is the set of check names the base branch requires (branch protection
    or rulesets). Then only those count, and one that has not reported yet is pending,
    as GitHub shows it ("Expected — waiting for status"): CI that has not started is
    not a green light. ``None`` (the branch requires nothing) counts every check.
    loopbot's own runs are left out: the gate is what decides on them. A state outside
    the gate's allowlist is ``unknown``, never success.
    """
    return fold_checks(classify_checks(runs, statuses, required))


def protected_changes(paths: list[str], patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The paths that match a protected pattern: ``dir/**`` or a glob (``*`` spans ``/``)."""
    hits = []
    for path in paths:
        for pattern in patterns:
            if pattern.endswith("/**"):
                matched = path.startswith(pattern[:-2])
            else:
                matched = fnmatchcase(path, pattern)
            if matched:
                hits.append(path)
                break
    return tuple(sorted(set(hits)))
