"""Merge queues, as GitHub documents them: a base branch whose ruleset has a
``merge_queue`` rule takes changes only through its queue.

GitHub's documented behaviour, kept here:
- The merge endpoint refuses a pull request into such a branch: 405 "Changes must be
  made through the merge queue" (pulls.py records the refusal).
- GraphQL ``enqueuePullRequest(input: {pullRequestId, expectedHeadOid})`` adds it (only
  when the head is ``expectedHeadOid``, its required checks passed and the review rules
  hold); ``dequeuePullRequest(input: {id})`` takes it out (a person's "manual" removal).
- For the entry at the front, the queue builds a merge group: a commit of the base's tip
  with the pull request's changes, on a temporary branch
  ``gh-readonly-queue/<base>/pr-<n>-<base sha>``, and sends ``merge_group``
  ``checks_requested`` (head_sha, head_ref, base_sha, base_ref) to Apps subscribed to it.
  The base's required checks must pass on that commit: when they do, the base is
  fast-forwarded to it (the merge group's commit is the pull request's merge commit),
  the pull request is closed as merged, the group is ``destroyed`` (reason ``merged``),
  and ``pull_request`` ``dequeued`` (reason ``MERGE``: the timeline counts a merge as a
  removal too) and ``closed`` (merged true) are sent. A required check that fails
  removes the entry: ``merge_group`` ``destroyed`` (``dequeued``) and ``pull_request``
  ``dequeued`` with reason ``CI_FAILURE``; a person's removal is reason ``MANUAL``.
- The timeline shows ``AddedToMergeQueueEvent`` and ``RemovedFromMergeQueueEvent`` (its
  ``reason``), GraphQL's ``PullRequest.isInMergeQueue`` and ``mergeQueueEntry``.
- ``merge_group`` is sent only to an App granted the "Merge queues" permission and
  subscribed to the event; enqueueing as an App needs ``merge_queues: write`` here
  (stricter than a guess: an App without it is refused).

Simplified: one merge group is built at a time (the front entry only), the status
check timeout is not enforced, and REBASE lands like SQUASH (one commit on the base).
"""

from __future__ import annotations

from bot.standins import gitrepo
from bot.standins.github.issues import set_issue_state
from bot.standins.github.merging import review_rules
from bot.standins.github.pulls import after_merge, closing_references
from bot.standins.github.shapes import event_base, pull_json
from bot.standins.github.state import MergeQueueRule, Pull, QueueEntry, Repo, State, User
from bot.standins.github.wire import Json, now

REFUSAL = review_rules.QUEUE_REFUSAL
GROUP_PREFIX = "gh-readonly-queue"
QUEUE_BOT = "github-merge-queue[bot]"
_RUN_PASS = frozenset({"success", "neutral", "skipped"})
_RUN_FAIL = frozenset({"failure", "timed_out", "cancelled", "action_required", "stale"})


class QueueError(Exception):
    """A mutation GitHub refuses, with its message and GraphQL error type."""

    def __init__(self, message: str, kind: str = "UNPROCESSABLE") -> None:
        super().__init__(message)
        self.kind = kind


def queue_bot(state: State) -> User:
    """The account the queue acts as (GitHub's github-merge-queue App)."""
    return state.users.get(QUEUE_BOT) or state.new_user(QUEUE_BOT, type="Bot")


def rule_for(repo: Repo, branch: str) -> MergeQueueRule | None:
    return repo.merge_queues.get(branch)


def rules_json(repo: Repo, branch: str) -> list[Json]:
    rule = rule_for(repo, branch)
    if rule is None or rule.source != "ruleset":
        return []
    return [
        {
            "type": "merge_queue",
            "ruleset_source_type": "Repository",
            "ruleset_source": repo.full_name,
            "ruleset_id": 3,
            "parameters": {
                "merge_method": rule.merge_method,
                "max_entries_to_build": rule.max_entries_to_build,
                "min_entries_to_merge": rule.min_entries_to_merge,
                "max_entries_to_merge": rule.max_entries_to_merge,
                "min_entries_to_merge_wait_minutes": rule.min_entries_to_merge_wait_minutes,
                "grouping_strategy": rule.grouping_strategy,
                "check_response_timeout_minutes": rule.check_response_timeout_minutes,
            },
        }
    ]


def entry_of(repo: Repo, pull: Pull) -> QueueEntry | None:
    for e in repo.queue.get(pull.base, []):
        if e.number == pull.number:
            return e
    return None


def position(repo: Repo, pull: Pull) -> int:
    entries = repo.queue.get(pull.base, [])
    return next((i + 1 for i, e in enumerate(entries) if e.number == pull.number), 0)


def enqueue(state: State, repo: Repo, pull: Pull, expected: str | None, actor: User) -> QueueEntry:
    """``enqueuePullRequest``: under ``state.lock``."""
    repo.enqueue_calls.append((pull.number, expected or "", actor.login))
    issue = repo.issues[pull.number]
    if rule_for(repo, pull.base) is None:
        raise QueueError(f"Merge queue is not enabled for the branch '{pull.base}'.")
    if pull.merged or issue.state != "open":
        raise QueueError("Pull request is closed.")
    if entry_of(repo, pull) is not None:
        raise QueueError("Pull request is already in the merge queue.")
    head = repo.head_sha(pull)
    if expected and expected != head:
        raise QueueError("Head branch was modified. Review and try the merge again.")
    if actor.type == "Bot":
        grant = state.grants.get(repo.installation_id or 0) or {}
        if (grant.get("permissions") or {}).get("merge_queues") != "write":
            raise QueueError("Resource not accessible by integration", "FORBIDDEN")
    elif repo.permissions.get(actor.login) not in review_rules.WRITERS:
        raise QueueError(f"{actor.login} does not have permission to enqueue.", "FORBIDDEN")
    base = gitrepo.resolve(repo.path, f"refs/heads/{pull.base}") or ""
    if gitrepo.merge_tree(repo.path, base, head) is None:
        raise QueueError("Pull request is not mergeable: the branch has conflicts.")
    blockers = review_rules.review_blockers(repo, pull)
    pending = review_rules.required_checks_pending(repo, pull)
    if blockers or pending:
        why = blockers[0] if blockers else f"Required status check {pending[0]!r} is expected."
        raise QueueError(f"Pull request is not mergeable: {why}")
    entry = QueueEntry(pull.number, head, actor.login, now())
    repo.queue.setdefault(pull.base, []).append(entry)
    repo.queue_events.setdefault(pull.number, []).append(
        {"type": "added", "actor": actor.login, "at": entry.enqueued_at, "commit": head}
    )
    _pull_event(state, repo, pull, "enqueued", actor)
    advance(state, repo, pull.base)
    return entry


def dequeue(state: State, repo: Repo, pull: Pull, actor: User, reason: str = "MANUAL") -> None:
    """``dequeuePullRequest`` (a person's removal), or the queue's own (failing checks)."""
    entry = entry_of(repo, pull)
    if entry is None:
        raise QueueError("Pull request is not in the merge queue.")
    _remove(state, repo, pull.base, entry, reason, actor)
    advance(state, repo, pull.base)


def advance(state: State, repo: Repo, base: str) -> None:
    """Build the front entry's merge group if it has none, then judge its checks."""
    entries = repo.queue.get(base, [])
    if not entries:
        return
    entry = entries[0]
    if not entry.group_sha:
        _build_group(state, repo, base, entry)
        if entry not in repo.queue.get(base, []):
            return
    evaluate(state, repo, base)


def _build_group(state: State, repo: Repo, base: str, entry: QueueEntry) -> None:
    pull = repo.pulls[entry.number]
    rule = rule_for(repo, base) or MergeQueueRule()
    base_sha = gitrepo.resolve(repo.path, f"refs/heads/{base}") or ""
    tree = gitrepo.merge_tree(repo.path, base_sha, entry.head)
    if tree is None:
        _remove(state, repo, base, entry, "MERGE_CONFLICT", state.bot)
        return
    title = repo.issues[pull.number].title
    if rule.merge_method == "MERGE":
        message = f"Merge pull request #{pull.number} from {repo.owner}/{pull.head}\n\n{title}"
        parents = ["-p", base_sha, "-p", entry.head]
    else:
        message = f"{title} (#{pull.number})"
        parents = ["-p", base_sha]
    sha = gitrepo.git(repo.path, "commit-tree", tree, *parents, "-m", message).strip()
    ref = f"{GROUP_PREFIX}/{base}/pr-{pull.number}-{base_sha}"
    gitrepo.git(repo.path, "update-ref", f"refs/heads/{ref}", sha)
    entry.group_sha, entry.group_ref, entry.base_sha = sha, ref, base_sha
    entry.state = "AWAITING_CHECKS"
    _group_event(state, repo, base, entry, "checks_requested")
    conclusion = repo.queue_ci.get(base, "")
    if conclusion:  # the stand-in is the CI: it reports the required checks on the group
        for context in _required(repo, base):
            _report(state, repo, sha, context, conclusion)


def _required(repo: Repo, base: str) -> list[str]:
    return [*repo.protection.get(base, []), *repo.ruleset_checks.get(base, [])]


def _report(state: State, repo: Repo, sha: str, context: str, conclusion: str) -> None:
    rid = state.next_id()
    run: Json = {
        "id": rid,
        "name": context,
        "head_sha": sha,
        "status": "completed",
        "conclusion": conclusion,
        "output": {"title": f"{context}: {conclusion}", "summary": ""},
        "details_url": None,
        "app": {"id": 1, "slug": "ci"},
        "check_suite": {"head_branch": repo.branch_at(sha)},
    }
    repo.check_runs[rid] = run


def report_group_checks(state: State, repo: Repo, base: str, conclusion: str) -> str:
    """The test's CI reports every required check on the front merge group; returns
    the group's commit."""
    with state.lock:
        entries = repo.queue.get(base, [])
        assert entries and entries[0].group_sha, "no merge group is waiting for checks"
        sha = entries[0].group_sha
        for context in _required(repo, base):
            _report(state, repo, sha, context, conclusion)
        evaluate(state, repo, base)
        return sha


def on_check(state: State, repo: Repo, sha: str) -> None:
    """A check run or status was reported on ``sha``: if it is a merge group's, judge it."""
    for base, entries in list(repo.queue.items()):
        if entries and entries[0].group_sha == sha:
            evaluate(state, repo, base)


def _outcome(repo: Repo, sha: str, context: str) -> str:
    runs = [r for r in repo.check_runs.values() if r["head_sha"] == sha and r["name"] == context]
    statuses = [s for s in repo.statuses.get(sha, []) if s["context"] == context]
    if runs:
        run = runs[-1]
        if run.get("status") != "completed":
            return "pending"
        conclusion = run.get("conclusion")
        return (
            "pass" if conclusion in _RUN_PASS else "fail" if conclusion in _RUN_FAIL else "pending"
        )
    if statuses:
        st = statuses[-1]["state"]
        return "pass" if st == "success" else "fail" if st in ("failure", "error") else "pending"
    return "pending"


def evaluate(state: State, repo: Repo, base: str) -> None:
    entries = repo.queue.get(base, [])
    if not entries or not entries[0].group_sha:
        return
    entry = entries[0]
    outcomes = [_outcome(repo, entry.group_sha, c) for c in _required(repo, base)]
    if "fail" in outcomes:
        _remove(state, repo, base, entry, "CI_FAILURE", state.bot)
        advance(state, repo, base)
    elif all(o == "pass" for o in outcomes):
        _merge(state, repo, base, entry)


def _merge(state: State, repo: Repo, base: str, entry: QueueEntry) -> None:
    pull = repo.pulls[entry.number]
    issue = repo.issues[pull.number]
    moved = gitrepo.resolve(repo.path, f"refs/heads/{base}") != entry.base_sha
    if moved:  # the base moved under the group (a push by an admin): build it again
        gitrepo.git(repo.path, "update-ref", "-d", f"refs/heads/{entry.group_ref}")
        entry.group_sha = entry.group_ref = entry.base_sha = ""
        entry.state = "QUEUED"
        advance(state, repo, base)
        return
    gitrepo.git(repo.path, "update-ref", f"refs/heads/{base}", entry.group_sha, entry.base_sha)
    entry.state = "MERGEABLE"
    pull.merged = True
    pull.merge_commit_sha = entry.group_sha
    pull.closed_head_sha = entry.head
    issue.state = "closed"
    after_merge(repo, pull)
    repo.queue[base].remove(entry)
    gitrepo.git(repo.path, "update-ref", "-d", f"refs/heads/{entry.group_ref}")
    _group_event(state, repo, base, entry, "destroyed", reason="merged")
    merger = queue_bot(state)
    # As GitHub: a merge is a removal from the queue too (timeline and webhook, reason
    # MERGE), recorded before the pull request's closed event.
    repo.queue_events.setdefault(pull.number, []).append(
        {
            "type": "removed",
            "actor": merger.login,
            "at": now(),
            "commit": entry.head,
            "reason": "MERGE",
        }
    )
    _pull_event(state, repo, pull, "dequeued", merger, reason="MERGE")
    _pull_event(state, repo, pull, "closed", merger)
    # As a merge does: closing keywords in the pull request's body close issues.
    for target_repo, closed in closing_references(state, repo, issue.body):
        target = target_repo.issues.get(closed)
        if target is not None and target.state == "open":
            set_issue_state(state, target_repo, target, "closed", merger)
    advance(state, repo, base)


def _remove(
    state: State, repo: Repo, base: str, entry: QueueEntry, reason: str, actor: User
) -> None:
    pull = repo.pulls[entry.number]
    repo.queue[base].remove(entry)
    repo.queue_events.setdefault(pull.number, []).append(
        {
            "type": "removed",
            "actor": actor.login,
            "at": now(),
            "commit": entry.head,
            "reason": reason,
        }
    )
    if entry.group_ref:
        gitrepo.git(repo.path, "update-ref", "-d", f"refs/heads/{entry.group_ref}", check=False)
        _group_event(state, repo, base, entry, "destroyed", reason="dequeued")
    _pull_event(state, repo, pull, "dequeued", actor, reason=reason)


def _subscribed(state: State, repo: Repo, event: str, permission: str) -> bool:
    grant = state.grants.get(repo.installation_id or 0)
    if grant is None:
        return False
    return event in (grant.get("events") or []) and bool(
        (grant.get("permissions") or {}).get(permission)
    )


def _pull_event(
    state: State, repo: Repo, pull: Pull, action: str, actor: User, reason: str = ""
) -> None:
    if not _subscribed(state, repo, "pull_request", "pull_requests"):
        return
    payload: Json = {
        "action": action,
        "number": pull.number,
        "pull_request": pull_json(state, repo, pull),
        **event_base(state, repo, actor),
    }
    if action == "dequeued":
        payload["reason"] = reason
    state.emit("pull_request", payload)


def _group_event(
    state: State, repo: Repo, base: str, entry: QueueEntry, action: str, reason: str = ""
) -> None:
    if not _subscribed(state, repo, "merge_group", "merge_queues"):
        return
    head_commit = gitrepo.git(repo.path, "log", "-1", "--format=%B", entry.group_sha, check=False)
    payload: Json = {
        "action": action,
        "merge_group": {
            "head_sha": entry.group_sha,
            "head_ref": f"refs/heads/{entry.group_ref}",
            "base_sha": entry.base_sha,
            "base_ref": f"refs/heads/{base}",
            "head_commit": {"id": entry.group_sha, "message": head_commit.strip()},
        },
        **event_base(state, repo, queue_bot(state)),
    }
    if reason:
        payload["reason"] = reason
    state.emit("merge_group", payload)
