"""A pull request and its base branch's merge queue, as an installation reads and writes
them (GraphQL: REST has no merge queue): whether the pull request is in the queue and
where, the queue's removals of it (``RemovedFromMergeQueueEvent`` and its reason, which
the ``pull_request.dequeued`` webhook also carries, read here so a lost webhook loses
nothing), and ``enqueuePullRequest`` pinned to the head loopbot reviewed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from githubkit.exception import GraphQLFailed

from bot.io.github.plumbing import InstallationBase, _split

QUEUE_QUERY = """
query($owner: String!, $name: String!, $number: Int!) {
  repository(owner: $owner, name: $name) {
    pullRequest(number: $number) {
      id
      headRefOid
      isInMergeQueue
      mergeQueueEntry { state position }
      timelineItems(last: 1, itemTypes: [REMOVED_FROM_MERGE_QUEUE_EVENT]) {
        totalCount
        nodes {
          ... on RemovedFromMergeQueueEvent {
            reason
            actor { login }
            beforeCommit { oid }
          }
        }
      }
    }
  }
}
"""

ENQUEUE_MUTATION = """
mutation($id: ID!, $head: GitObjectID!) {
  enqueuePullRequest(input: {pullRequestId: $id, expectedHeadOid: $head}) {
    mergeQueueEntry { state position }
  }
}
"""


@dataclass(frozen=True)
class QueueState:
    node_id: str
    head: str
    in_queue: bool
    entry_state: str  # MergeQueueEntryState ("" when not in the queue)
    position: int
    removals: int  # how many times the queue has let go of the pull request
    removed_reason: str  # the last removal's reason (CI_FAILURE, MANUAL...), "" none
    removed_by: str
    removed_head: str


@dataclass(frozen=True)
class Enqueued:
    ok: bool
    position: int = 0
    error: str = ""  # GitHub's words when it refused


class MergeQueues(InstallationBase):
    def queue_state(self, repo: str, number: int) -> QueueState:
        owner, name = _split(repo)
        data = self._call(
            lambda gh: gh.graphql.request(
                QUEUE_QUERY, {"owner": owner, "name": name, "number": number}
            )
        )
        pull = ((data or {}).get("repository") or {}).get("pullRequest") or {}
        entry = pull.get("mergeQueueEntry") or {}
        timeline = pull.get("timelineItems") or {}
        nodes = [n for n in timeline.get("nodes") or [] if n]
        last = nodes[-1] if nodes else {}
        return QueueState(
            node_id=str(pull.get("id") or ""),
            head=str(pull.get("headRefOid") or ""),
            in_queue=bool(pull.get("isInMergeQueue")),
            entry_state=str(entry.get("state") or ""),
            position=int(entry.get("position") or 0),
            removals=int(timeline.get("totalCount") or 0),
            removed_reason=str(last.get("reason") or ""),
            removed_by=str((last.get("actor") or {}).get("login") or ""),
            removed_head=str((last.get("beforeCommit") or {}).get("oid") or ""),
        )

    def enqueue(self, node_id: str, head: str) -> Enqueued:
        """Add the pull request to its base's merge queue, only if its head is still
        ``head`` (GitHub refuses otherwise). A refusal is an answer, not an error: the
        gate says what GitHub said."""

        def attempt(gh: Any) -> tuple[bool, Any]:
            # GitHub's GraphQL refusal comes back as errors in a 200: caught here, inside
            # the call, so a refusal is never retried and never taken for an outage.
            try:
                return True, gh.graphql.request(ENQUEUE_MUTATION, {"id": node_id, "head": head})
            except GraphQLFailed as exc:
                return False, "; ".join(str(e.message) for e in exc.response.errors or [])

        ok, data = self._call(attempt)
        if not ok:
            return Enqueued(False, error=data or "GitHub refused to enqueue the pull request")
        entry = ((data or {}).get("enqueuePullRequest") or {}).get("mergeQueueEntry") or {}
        return Enqueued(True, position=int(entry.get("position") or 0))
