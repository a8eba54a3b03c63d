"""What a base branch asks before a merge, as an installation can read it: the rules that
apply to the branch (``GET rules/branches/{branch}``, readable with metadata read), the
pull request's review decision, merge state and review threads (GraphQL, which covers
classic branch protection too: loopbot's App has no ``administration`` permission, so
classic protection's review settings are not readable to it), CODEOWNERS, and the two
writes the gate makes: resolving its own review threads and asking a writer to review."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from bot.core.rules.pull import codeowners
from bot.io.github.failures import Forbidden, NotFound, Unprocessable
from bot.io.github.plumbing import _split
from bot.io.github.repos import Repos

REVIEW_QUERY = """
query($owner: String!, $name: String!, $number: Int!) {
  repository(owner: $owner, name: $name) {
    pullRequest(number: $number) {
      headRefOid
      reviewDecision
      mergeStateStatus
      reviewThreads(first: 100) {
        totalCount
        nodes {
          id isResolved
          comments(first: 100) { totalCount nodes { author { login } } }
        }
      }
    }
  }
}
"""

RESOLVE_MUTATION = """
mutation($id: ID!) {
  resolveReviewThread(input: {threadId: $id}) { thread { id isResolved } }
}
"""


@dataclass(frozen=True)
class BranchReviewRules:
    """The ``pull_request`` rules on a branch, folded (the strictest of each)."""

    approvals: int = 0
    code_owners: bool = False
    dismiss_stale: bool = False
    last_push: bool = False
    threads: bool = False
    methods: frozenset[str] | None = None  # None: the rules restrict no method
    merge_queue: bool = False  # a ``merge_queue`` rule: changes land only through the queue


@dataclass(frozen=True)
class Thread:
    id: str
    resolved: bool
    author: str  # the first comment's author (GraphQL names an App by its slug)
    # Everyone who wrote in the thread, in order (replies too); "(more)" when a thread
    # has comments beyond the first 100, so nobody unread is taken for loopbot.
    authors: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReviewState:
    head: str
    decision: str | None  # APPROVED, CHANGES_REQUESTED, REVIEW_REQUIRED; None: none required
    merge_state: str
    threads: tuple[Thread, ...]
    threads_total: int


class Rules(Repos):
    def branch_review_rules(self, repo: str, branch: str) -> BranchReviewRules:
        """The branch's ``pull_request`` rules from rulesets. Missing (older Enterprise
        Server) or hidden: no rule, and GraphQL's review decision still says what
        classic protection asks."""
        owner, name = _split(repo)
        approvals, flags = 0, {"code_owners": False, "dismiss": False, "last": False, "thr": False}
        methods: set[str] | None = None
        queue = False
        with contextlib.suppress(NotFound, Forbidden):
            for rule in self._list(
                lambda gh, n: gh.rest.repos.get_branch_rules(
                    owner, name, branch, per_page=100, page=n
                ).json()
            ):
                queue |= rule.get("type") == "merge_queue"
                if rule.get("type") != "pull_request":
                    continue
                p = rule.get("parameters") or {}
                approvals = max(approvals, int(p.get("required_approving_review_count") or 0))
                flags["code_owners"] |= bool(p.get("require_code_owner_review"))
                flags["dismiss"] |= bool(p.get("dismiss_stale_reviews_on_push"))
                flags["last"] |= bool(p.get("require_last_push_approval"))
                flags["thr"] |= bool(p.get("required_review_thread_resolution"))
                allowed = p.get("allowed_merge_methods")
                if isinstance(allowed, list):
                    given = {str(m) for m in allowed}
                    methods = given if methods is None else methods & given
        return BranchReviewRules(
            approvals,
            flags["code_owners"],
            flags["dismiss"],
            flags["last"],
            flags["thr"],
            None if methods is None else frozenset(methods),
            queue,
        )

    def branch_rules(self, repo: str, branch: str) -> list[dict[str, Any]] | None:
        """Every rule that applies to ``branch`` (which need not exist: rules match by
        name), as GitHub lists them; None when they cannot be read (older Enterprise
        Server has no rulesets; a hidden repository)."""
        owner, name = _split(repo)
        try:
            return [
                dict(rule)
                for rule in self._list(
                    lambda gh, n: gh.rest.repos.get_branch_rules(
                        owner, name, branch, per_page=100, page=n
                    ).json()
                )
            ]
        except (NotFound, Forbidden):
            return None

    def branch_protected(self, repo: str, branch: str) -> bool | None:
        """The branch summary's ``protected``: whether classic protection is on. Its
        settings (``.../protection``) need ``administration`` read, which loopbot's App
        does not ask for. None: the branch cannot be read."""
        owner, name = _split(repo)
        try:
            d = self._call(lambda gh: gh.rest.repos.get_branch(owner, name, branch).json())
        except (NotFound, Forbidden):
            return None
        return bool(d.get("protected"))

    def review_state(self, repo: str, number: int) -> ReviewState:
        owner, name = _split(repo)
        data = self._call(
            lambda gh: gh.graphql.request(
                REVIEW_QUERY, {"owner": owner, "name": name, "number": number}
            )
        )
        pull = ((data or {}).get("repository") or {}).get("pullRequest") or {}
        conn = pull.get("reviewThreads") or {}
        threads = []
        for node in conn.get("nodes") or []:
            if not node:
                continue
            comments = node.get("comments") or {}
            authors = [
                str(((c or {}).get("author") or {}).get("login") or "")
                for c in comments.get("nodes") or []
            ]
            if int(comments.get("totalCount") or 0) > len(authors):
                authors.append("(more)")
            threads.append(
                Thread(
                    str(node.get("id")),
                    bool(node.get("isResolved")),
                    authors[0] if authors else "",
                    tuple(authors),
                )
            )
        return ReviewState(
            head=str(pull.get("headRefOid") or ""),
            decision=pull.get("reviewDecision"),
            merge_state=str(pull.get("mergeStateStatus") or "UNKNOWN"),
            threads=tuple(threads),
            threads_total=int(conn.get("totalCount") or 0),
        )

    def resolve_thread(self, thread_id: str) -> None:
        self._call(lambda gh: gh.graphql.request(RESOLVE_MUTATION, {"id": thread_id}))

    def request_review(self, repo: str, number: int, logins: list[str]) -> None:
        """Ask ``logins`` to review; a login GitHub will not ask (not a collaborator,
        the author) is left out rather than failing the gate."""
        owner, name = _split(repo)
        with contextlib.suppress(Unprocessable):
            self._call(
                lambda gh: gh.rest.pulls.request_reviewers(owner, name, number, reviewers=logins)
            )

    def codeowners(self, repo: str, ref: str) -> str | None:
        """CODEOWNERS on ``ref``, where GitHub looks for it (the first found counts)."""
        for path in codeowners.LOCATIONS:
            text = self.file(repo, path, ref)
            if text is not None:
                return text
        return None
