"""What a base branch asks before a pull request merges, as GitHub judges it: approving
reviews by people with write access, code owners' reviews, resolved conversations and
required checks; and what the merge endpoint and GraphQL's ``reviewDecision`` and
``mergeStateStatus`` say about them.

GitHub's documented behaviour, kept here:
- Only the latest review of each reviewer counts, and only an APPROVED, CHANGES_REQUESTED
  or DISMISSED one (a COMMENTED review changes nothing). Only reviewers with write,
  maintain or admin permission count ("approving review ... by reviewers with write
  access"); a reader's approval is shown but does not count.
- ``dismiss_stale_reviews_on_push``: an approval of an earlier head is dismissed (here:
  read as DISMISSED once the head moved past the commit it approved).
- ``require_last_push_approval``: the most recent push must be approved by someone
  other than its pusher: an approval of an earlier head, still standing when stale
  approvals are not dismissed, does not satisfy it (community discussion 77578, GitHub
  support: "working as designed"). Whether ``reviewDecision`` then still says APPROVED
  is not documented; here it does (the merge is BLOCKED, the merge call refused), the
  stricter reading for a client that must not trust the decision alone. The pusher is
  not tracked here (loopbot's pushes are the App's, which cannot approve).
- Code owners: for every changed file that CODEOWNERS gives owners, one of them must
  approve (review_rules reads CODEOWNERS on the base branch).
- Conversation resolution: every review thread must be resolved.
"""

from __future__ import annotations

from bot.core.rules.pull import codeowners
from bot.standins import gitrepo
from bot.standins.github.state import Pull, Repo, ReviewRule
from bot.standins.github.wire import Json

# The merge endpoint's 405 where the base requires a merge queue (merge_queue.py).
QUEUE_REFUSAL = "Changes must be made through the merge queue"
WRITERS = frozenset({"write", "maintain", "admin"})
_COUNTED = frozenset({"APPROVED", "CHANGES_REQUESTED", "DISMISSED"})
_RUN_PASS = frozenset({"success", "neutral", "skipped"})


def rule_for(repo: Repo, branch: str) -> ReviewRule | None:
    return repo.review_rules.get(branch)


def effective_state(repo: Repo, pull: Pull, review: Json) -> str:
    """A review's state now: an approval of an older head is dismissed when the rule
    dismisses stale approvals."""
    rule = rule_for(repo, pull.base)
    state = str(review["state"])
    if (
        state == "APPROVED"
        and rule is not None
        and rule.dismiss_stale_reviews_on_push
        and review.get("commit_id") != repo.head_sha(pull)
    ):
        return "DISMISSED"
    return state


def latest_reviews(repo: Repo, pull: Pull) -> dict[str, str]:
    """Each reviewer's latest counted review state."""
    latest: dict[str, str] = {}
    for review in repo.reviews.get(pull.number, []):
        state = effective_state(repo, pull, review)
        if state in _COUNTED:
            latest[review["user"]["login"]] = state
    return latest


def writers_approving(repo: Repo, pull: Pull) -> set[str]:
    return {
        login
        for login, state in latest_reviews(repo, pull).items()
        if state == "APPROVED" and repo.permissions.get(login) in WRITERS
    }


def changes_requested(repo: Repo, pull: Pull) -> set[str]:
    return {
        login
        for login, state in latest_reviews(repo, pull).items()
        if state == "CHANGES_REQUESTED" and repo.permissions.get(login) in WRITERS
    }


def codeowners_text(repo: Repo, ref: str) -> str | None:
    for path in codeowners.LOCATIONS:
        data = gitrepo.show(repo.path, ref, path)
        if data is not None:
            return data.decode("utf-8", "replace")
    return None


def owners_waited_on(repo: Repo, pull: Pull) -> list[str]:
    """The owner groups none of whose members with write access has approved."""
    text = codeowners_text(repo, pull.base)
    head = repo.head_sha(pull)
    if text is None or not head:
        return []
    paths = [str(f["filename"]) for f in gitrepo.changed_files(repo.path, pull.base, head)]
    approving = writers_approving(repo, pull)
    waiting: list[str] = []
    for group in codeowners.required_owners(text, paths):
        logins = [o.removeprefix("@") for o in group]
        if not any(login in approving for login in logins):
            waiting.extend(o for o in group if o not in waiting)
    return waiting


def threads(repo: Repo, number: int) -> list[Json]:
    """Review threads: each top-level review comment starts one."""
    return [c for c in repo.review_comments.get(number, []) if not c.get("in_reply_to_id")]


def unresolved_threads(repo: Repo, number: int) -> list[Json]:
    return [c for c in threads(repo, number) if c["id"] not in repo.resolved_threads]


def last_push_unapproved(repo: Repo, pull: Pull) -> bool:
    """The rule asks for an approval of the most recent push and no writer's latest
    review approves the head."""
    rule = rule_for(repo, pull.base)
    if rule is None or not rule.require_last_push_approval:
        return False
    head = repo.head_sha(pull)
    latest: dict[str, Json] = {}
    for review in repo.reviews.get(pull.number, []):
        if effective_state(repo, pull, review) in _COUNTED:
            latest[review["user"]["login"]] = review
    return not any(
        effective_state(repo, pull, r) == "APPROVED"
        and r.get("commit_id") == head
        and repo.permissions.get(login) in WRITERS
        for login, r in latest.items()
    )


def review_blockers(repo: Repo, pull: Pull) -> list[str]:
    """Why the rule keeps ``pull`` from merging, in GitHub's words (empty: it does not)."""
    rule = rule_for(repo, pull.base)
    if rule is None:
        return []
    out = []
    need = rule.required_approving_review_count
    if changes_requested(repo, pull) and need:
        out.append("Changes requested by reviewers with write access.")
    if need and len(writers_approving(repo, pull)) < need:
        noun = "review is" if need == 1 else "reviews are"
        out.append(f"At least {need} approving {noun} required by reviewers with write access.")
    if last_push_unapproved(repo, pull):
        out.append(
            "The most recent push must be approved by someone other than the person who pushed it."
        )
    if rule.require_code_owner_review and (waiting := owners_waited_on(repo, pull)):
        out.append(f"Waiting on code owner review from {', '.join(waiting)}.")
    if rule.required_review_thread_resolution and unresolved_threads(repo, pull.number):
        out.append("A conversation must be resolved before this pull request can be merged.")
    return out


def required_checks_pending(repo: Repo, pull: Pull) -> list[str]:
    contexts = [*repo.protection.get(pull.base, []), *repo.ruleset_checks.get(pull.base, [])]
    head = repo.head_sha(pull)
    passed = {
        r["name"]
        for r in repo.check_runs.values()
        if r["head_sha"] == head
        and r.get("status") == "completed"
        and r.get("conclusion") in _RUN_PASS
    }
    latest: dict[str, str] = {}
    for s in repo.statuses.get(head, []):
        latest[s["context"]] = s["state"]
    passed |= {c for c, st in latest.items() if st == "success"}
    return [c for c in contexts if c not in passed]


def review_decision(repo: Repo, pull: Pull) -> str | None:
    """GraphQL ``reviewDecision``: null when the base requires no review."""
    rule = rule_for(repo, pull.base)
    if rule is None or not (rule.required_approving_review_count or rule.require_code_owner_review):
        return None
    if changes_requested(repo, pull):
        return "CHANGES_REQUESTED"
    if len(writers_approving(repo, pull)) < rule.required_approving_review_count:
        return "REVIEW_REQUIRED"
    if rule.require_code_owner_review and owners_waited_on(repo, pull):
        return "REVIEW_REQUIRED"
    return "APPROVED"


def merge_state_status(repo: Repo, pull: Pull) -> str:
    """GraphQL ``mergeStateStatus`` (CLEAN, BLOCKED, DIRTY, UNKNOWN...)."""
    issue = repo.issues[pull.number]
    head = repo.head_sha(pull)
    base = gitrepo.resolve(repo.path, f"refs/heads/{pull.base}")
    if issue.state != "open" or not head or not base:
        return "UNKNOWN"
    if gitrepo.merge_tree(repo.path, base, head) is None:
        return "DIRTY"
    if review_blockers(repo, pull) or required_checks_pending(repo, pull):
        return "BLOCKED"
    return "CLEAN"


def method_refusal(repo: Repo, pull: Pull, method: str) -> str | None:
    """GitHub's 405 for a merge method the repository or the base's ruleset disallows."""
    allowed = {
        "squash": repo.allow_squash_merge,
        "merge": repo.allow_merge_commit,
        "rebase": repo.allow_rebase_merge,
    }
    words = {"squash": "Squash merges", "merge": "Merge commits", "rebase": "Rebase merges"}
    if method not in allowed:
        return None
    if not allowed[method]:
        return f"{words[method]} are not allowed on this repository."
    rule = rule_for(repo, pull.base)
    if rule is not None and method not in rule.allowed_merge_methods:
        return (
            "Repository rule violations found\n\n"
            f"Merge method {method} is not allowed for this branch."
        )
    return None


def rules_json(repo: Repo, branch: str) -> list[Json]:
    """The ``pull_request`` rule as ``GET rules/branches/{branch}`` lists it (rulesets
    only: classic protection is not a rule)."""
    rule = rule_for(repo, branch)
    if rule is None or rule.source != "ruleset":
        return []
    return [
        {
            "type": "pull_request",
            "ruleset_source_type": "Repository",
            "ruleset_source": repo.full_name,
            "ruleset_id": 2,
            "parameters": {
                "required_approving_review_count": rule.required_approving_review_count,
                "dismiss_stale_reviews_on_push": rule.dismiss_stale_reviews_on_push,
                "require_code_owner_review": rule.require_code_owner_review,
                "require_last_push_approval": rule.require_last_push_approval,
                "required_review_thread_resolution": rule.required_review_thread_resolution,
                "allowed_merge_methods": list(rule.allowed_merge_methods),
            },
        }
    ]
