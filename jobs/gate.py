"""The merge decision: a pure function of what the gate read at the moment of merging."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

import anthropic

from bot.failures import GitHubError, Unavailable
from bot.loopstate import Reason
from jobs.messages import code_span

OWN_CHECKS = frozenset({"loopbot", "loopbot/critic"})

ChecksState = Literal["none", "pending", "success", "failure"]


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
    ready_label: bool = True  # the issue still carries the ready label


@dataclass(frozen=True)
class Merge:
    sha: str


@dataclass(frozen=True)
class AlreadyMerged:
    pass


@dataclass(frozen=True)
class Wait:
    why: str


@dataclass(frozen=True)
class Review:
    why: str


@dataclass(frozen=True)
class FixChecks:
    failing: tuple[str, ...]


@dataclass(frozen=True)
class FixConflicts:
    """The branch conflicts with the base: merge the base in and let the agent resolve."""


@dataclass(frozen=True)
class Refuse:
    reason: Reason
    why: str


Decision = Merge | AlreadyMerged | Wait | Review | FixChecks | FixConflicts | Refuse


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
    if not f.reviewed_sha or f.head_sha != f.reviewed_sha:
        return Review(
            f"the head moved to {f.head_sha[:10]} after the review of "
            f"{f.reviewed_sha[:10] or 'nothing'}"
        )
    if f.protected_changes:
        shown = ", ".join(code_span(p) for p in f.protected_changes[:5])
        more = len(f.protected_changes) - 5
        return Refuse(
            Reason.NEEDS_HUMAN,
            f"the pull request changes protected paths ({shown}"
            + (f" and {more} more" if more > 0 else "")
            + "), which loopbot never merges on its own",
        )
    if f.require_checks:
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
    if f.mergeable is False:
        # Usual when several loops drain one repository's backlog: another merged first.
        if f.fix_turns_used < f.max_fix_turns:
            return FixConflicts()
        return Refuse(Reason.NOT_MERGEABLE, "the pull request conflicts with the default branch")
    if f.mergeable is None:
        return Wait("GitHub is still computing whether the pull request can merge")
    return Merge(f.reviewed_sha)


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
    loopbot's own runs are left out: the gate is what decides on them.
    """
    wanted = None if required is None else required - OWN_CHECKS
    failing: list[str] = []
    pending = False
    reported: set[str] = set()
    for name, status, conclusion in runs:
        if name in OWN_CHECKS or (wanted is not None and name not in wanted):
            continue
        reported.add(name)
        if status != "completed":
            pending = True
        elif conclusion not in ("success", "neutral", "skipped"):
            failing.append(name)
    for context, state in statuses:
        if wanted is not None and context not in wanted:
            continue
        reported.add(context)
        if state in ("failure", "error"):
            failing.append(context)
        elif state == "pending":
            pending = True
    if wanted is not None and wanted - reported:
        pending = True
    if failing:
        return "failure", tuple(failing)
    if pending:
        return "pending", ()
    return ("success" if reported else "none"), ()


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


def transient(exc: BaseException) -> bool:
    """Whether trying again later may succeed: GitHub or the model down, slow or rate
    limiting (after the client's own retries). Anything else fails the same way again."""
    if isinstance(exc, GitHubError):
        return isinstance(exc, Unavailable) or exc.status == 0 or exc.status >= 500
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 429)
    return isinstance(exc, anthropic.APIConnectionError)
