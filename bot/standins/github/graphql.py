"""``POST /graphql``: the part of GitHub's GraphQL API loopbot reads, executed by a real
GraphQL executor (graphql-core) against a schema cut from GitHub's: an unknown field, a
missing argument or a connection without ``first``/``last`` is an error, as on GitHub.

What it serves: who last edited an issue's body (``userContentEdits``, ``editor``,
``lastEditedAt``) and retitled it (``timelineItems`` of ``RENAMED_TITLE_EVENT``), which
REST does not say. Tokens only (installation or user), as GitHub's GraphQL API.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, abort, g, jsonify, request
from graphql import GraphQLError, build_schema, graphql_sync

from bot.standins.github.merging import merge_queue, review_rules
from bot.standins.github.state import Issue, Pull, Repo, State
from bot.standins.github.wire import Json, add_routes, error

SCHEMA = build_schema(
    """
    scalar DateTime

    type Query {
      repository(owner: String!, name: String!): Repository
    }

    type Mutation {
      resolveReviewThread(input: ResolveReviewThreadInput!): ResolveReviewThreadPayload
      enqueuePullRequest(input: EnqueuePullRequestInput!): EnqueuePullRequestPayload
      dequeuePullRequest(input: DequeuePullRequestInput!): DequeuePullRequestPayload
    }

    scalar GitObjectID

    input EnqueuePullRequestInput {
      pullRequestId: ID!
      expectedHeadOid: GitObjectID
      jump: Boolean
      clientMutationId: String
    }

    type EnqueuePullRequestPayload {
      clientMutationId: String
      mergeQueueEntry: MergeQueueEntry
    }

    input DequeuePullRequestInput {
      id: ID!
      clientMutationId: String
    }

    type DequeuePullRequestPayload {
      clientMutationId: String
      mergeQueueEntry: MergeQueueEntry
    }

    enum MergeQueueEntryState {
      AWAITING_CHECKS
      LOCKED
      MERGEABLE
      QUEUED
      UNMERGEABLE
    }

    type Commit {
      oid: GitObjectID!
    }

    type MergeQueueEntry {
      id: ID!
      state: MergeQueueEntryState!
      position: Int!
      enqueuedAt: DateTime!
      enqueuer: Actor!
      headCommit: Commit
      baseCommit: Commit
    }

    enum PullRequestTimelineItemsItemType {
      ADDED_TO_MERGE_QUEUE_EVENT
      REMOVED_FROM_MERGE_QUEUE_EVENT
    }

    type AddedToMergeQueueEvent {
      id: ID!
      actor: Actor
      createdAt: DateTime!
    }

    type RemovedFromMergeQueueEvent {
      id: ID!
      actor: Actor
      createdAt: DateTime!
      reason: String
      beforeCommit: Commit
    }

    union PullRequestTimelineItems = AddedToMergeQueueEvent | RemovedFromMergeQueueEvent

    type PullRequestTimelineItemsConnection {
      nodes: [PullRequestTimelineItems]
      totalCount: Int!
    }

    input ResolveReviewThreadInput {
      threadId: ID!
      clientMutationId: String
    }

    type ResolveReviewThreadPayload {
      clientMutationId: String
      thread: PullRequestReviewThread
    }

    type Repository {
      nameWithOwner: String!
      issue(number: Int!): Issue
      pullRequest(number: Int!): PullRequest
    }

    enum PullRequestReviewDecision {
      APPROVED
      CHANGES_REQUESTED
      REVIEW_REQUIRED
    }

    enum MergeStateStatus {
      BEHIND
      BLOCKED
      CLEAN
      DIRTY
      DRAFT
      HAS_HOOKS
      UNKNOWN
      UNSTABLE
    }

    type PullRequest {
      id: ID!
      number: Int!
      headRefOid: String!
      isInMergeQueue: Boolean!
      mergeQueueEntry: MergeQueueEntry
      timelineItems(
        first: Int, last: Int, after: String, before: String,
        itemTypes: [PullRequestTimelineItemsItemType!]
      ): PullRequestTimelineItemsConnection!
      reviewDecision: PullRequestReviewDecision
      mergeStateStatus: MergeStateStatus!
      reviewThreads(first: Int, last: Int, after: String, before: String):
        PullRequestReviewThreadConnection!
    }

    type PullRequestReviewThreadConnection {
      nodes: [PullRequestReviewThread]
      totalCount: Int!
    }

    type PullRequestReviewThread {
      id: ID!
      isResolved: Boolean!
      isOutdated: Boolean!
      path: String!
      line: Int
      comments(first: Int, last: Int, after: String, before: String):
        PullRequestReviewCommentConnection!
    }

    type PullRequestReviewCommentConnection {
      nodes: [PullRequestReviewComment]
      totalCount: Int!
    }

    type PullRequestReviewComment {
      databaseId: Int
      author: Actor
      body: String!
    }

    interface Actor {
      login: String!
    }

    type User implements Actor {
      login: String!
    }

    type Bot implements Actor {
      login: String!
    }

    type Issue {
      number: Int!
      title: String!
      body: String!
      author: Actor
      createdAt: DateTime!
      lastEditedAt: DateTime
      editor: Actor
      userContentEdits(first: Int, last: Int, after: String, before: String):
        UserContentEditConnection
      timelineItems(
        first: Int, last: Int, after: String, before: String,
        itemTypes: [IssueTimelineItemsItemType!]
      ): IssueTimelineItemsConnection!
    }

    type UserContentEdit {
      editedAt: DateTime!
      createdAt: DateTime!
      editor: Actor
      diff: String
    }

    type UserContentEditConnection {
      nodes: [UserContentEdit]
      totalCount: Int!
    }

    enum IssueTimelineItemsItemType {
      RENAMED_TITLE_EVENT
      LABELED_EVENT
    }

    type RenamedTitleEvent {
      actor: Actor
      createdAt: DateTime!
      previousTitle: String!
      currentTitle: String!
    }

    type LabeledEvent {
      actor: Actor
      createdAt: DateTime!
    }

    union IssueTimelineItems = RenamedTitleEvent | LabeledEvent

    type IssueTimelineItemsConnection {
      nodes: [IssueTimelineItems]
      totalCount: Int!
    }
    """
)

MAX_PAGE = 100


class _Failed(GraphQLError):
    """An error GitHub reports with a ``type`` (NOT_FOUND, EXCESSIVE_PAGINATION...)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message, extensions={"type": kind})


def register(app: Flask, state: State) -> None:
    add_routes(app, state, [("POST", "/graphql", query)])


def query(state: State) -> tuple[Response, int] | Response:
    kind, _ = g.auth
    if kind not in ("installation", "user"):
        abort(error(401, "This endpoint requires you to be authenticated."))
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        return jsonify({"errors": [{"message": "A query attribute must be specified"}]}), 200
    with state.lock:
        result = graphql_sync(
            SCHEMA,
            body["query"],
            root_value={
                "repository": lambda info, owner, name: _repository(state, owner, name),
                "resolveReviewThread": lambda info, input: _resolve_thread(state, input),
                "enqueuePullRequest": lambda info, input: _enqueue(state, input),
                "dequeuePullRequest": lambda info, input: _dequeue(state, input),
            },
            variable_values=body.get("variables") or None,
        )
    out: Json = {}
    if result.data is not None:
        out["data"] = result.data
    if result.errors:
        out["errors"] = [_error(e) for e in result.errors]
    return jsonify(out)


def _error(e: GraphQLError) -> Json:
    d: Json = {"message": e.message}
    if e.path:
        d["path"] = list(e.path)
    if e.locations:
        d["locations"] = [{"line": loc.line, "column": loc.column} for loc in e.locations]
    if e.extensions and "type" in e.extensions:
        d["type"] = e.extensions["type"]
    return d


def _repository(state: State, owner: str, name: str) -> Json:
    repo = state.repos.get(f"{owner}/{name}")
    kind, who = g.auth
    if repo is None or (kind == "installation" and repo.installation_id != who):
        raise _Failed(
            f"Could not resolve to a Repository with the name '{owner}/{name}'.", "NOT_FOUND"
        )
    return {
        "nameWithOwner": repo.full_name,
        "issue": lambda info, number: _issue(state, repo, number),
        "pullRequest": lambda info, number: _pull_request(state, repo, number),
    }


def _pull_request(state: State, repo: Repo, number: int) -> Json:
    pull = repo.pulls.get(number)
    if pull is None:
        raise _Failed(
            f"Could not resolve to a PullRequest with the number of {number}.", "NOT_FOUND"
        )
    entry = merge_queue.entry_of(repo, pull)
    return {
        "id": pull_node_id(repo, number),
        "number": number,
        "headRefOid": repo.head_sha(pull),
        "isInMergeQueue": entry is not None,
        "mergeQueueEntry": None if entry is None else _entry(state, repo, number),
        "timelineItems": lambda info, first=None, last=None, after=None, before=None, itemTypes=None: (  # noqa: E501
            _queue_timeline(state, repo, number, first, last, itemTypes)
        ),
        "reviewDecision": review_rules.review_decision(repo, pull),
        "mergeStateStatus": review_rules.merge_state_status(repo, pull),
        "reviewThreads": lambda info, first=None, last=None, after=None, before=None: _threads(
            state, repo, number, first, last
        ),
    }


def pull_node_id(repo: Repo, number: int) -> str:
    return f"PR_{repo.id}_{number}"


def _find_pull(state: State, node_id: str) -> tuple[Repo, Pull]:
    kind, who = g.auth
    for repo in state.repos.values():
        if kind == "installation" and repo.installation_id != who:
            continue
        for number, pull in repo.pulls.items():
            if pull_node_id(repo, number) == node_id:
                return repo, pull
    raise _Failed(f"Could not resolve to a node with the global id of '{node_id}'", "NOT_FOUND")


def _entry(state: State, repo: Repo, number: int) -> Json | None:
    pull = repo.pulls[number]
    entry = merge_queue.entry_of(repo, pull)
    if entry is None:
        return None
    return {
        "id": f"MQE_{repo.id}_{number}",
        "state": entry.state,
        "position": merge_queue.position(repo, pull),
        "enqueuedAt": entry.enqueued_at,
        "enqueuer": _actor(state, entry.enqueuer, _type(state, entry.enqueuer)),
        "headCommit": {"oid": entry.group_sha} if entry.group_sha else None,
        "baseCommit": {"oid": entry.base_sha} if entry.base_sha else None,
    }


def _type(state: State, login: str) -> str:
    user = state.users.get(login)
    return user.type if user else "User"


def _enqueue(state: State, input: Json) -> Json:
    repo, pull = _find_pull(state, str(input.get("pullRequestId") or ""))
    try:
        merge_queue.enqueue(state, repo, pull, input.get("expectedHeadOid"), state.actor())
    except merge_queue.QueueError as exc:
        raise _Failed(str(exc), exc.kind) from exc
    return {
        "clientMutationId": input.get("clientMutationId"),
        "mergeQueueEntry": _entry(state, repo, pull.number),
    }


def _dequeue(state: State, input: Json) -> Json:
    repo, pull = _find_pull(state, str(input.get("id") or ""))
    actor = state.actor()
    if actor.type != "Bot" and repo.permissions.get(actor.login) not in review_rules.WRITERS:
        raise _Failed(f"{actor.login} does not have permission to dequeue.", "FORBIDDEN")
    before = _entry(state, repo, pull.number)
    try:
        merge_queue.dequeue(state, repo, pull, actor)
    except merge_queue.QueueError as exc:
        raise _Failed(str(exc), exc.kind) from exc
    return {"clientMutationId": input.get("clientMutationId"), "mergeQueueEntry": before}


def _queue_timeline(
    state: State,
    repo: Repo,
    number: int,
    first: int | None,
    last: int | None,
    types: list[str] | None,
) -> Json:
    items: list[Json] = []
    for i, e in enumerate(repo.queue_events.get(number, [])):
        actor = _actor(state, e["actor"], _type(state, e["actor"]))
        if e["type"] == "added" and (types is None or "ADDED_TO_MERGE_QUEUE_EVENT" in types):
            items.append(
                {
                    "__typename": "AddedToMergeQueueEvent",
                    "id": f"AMQE_{number}_{i}",
                    "actor": actor,
                    "createdAt": e["at"],
                }
            )
        if e["type"] == "removed" and (types is None or "REMOVED_FROM_MERGE_QUEUE_EVENT" in types):
            items.append(
                {
                    "__typename": "RemovedFromMergeQueueEvent",
                    "id": f"RMQE_{number}_{i}",
                    "actor": actor,
                    "createdAt": e["at"],
                    "reason": e["reason"],
                    "beforeCommit": {"oid": e["commit"]},
                }
            )
    return {"nodes": _page(items, first, last, "timelineItems"), "totalCount": len(items)}


def _thread(state: State, repo: Repo, comment: Json) -> Json:
    replies = [
        c
        for c in repo.review_comments.get(comment["_pull"], [])
        if c["id"] == comment["id"] or c.get("in_reply_to_id") == comment["id"]
    ]

    def kind(login: str) -> str:  # each comment's own author: a person may reply to a bot
        user = state.users.get(login)
        return user.type if user else "User"

    return {
        "id": f"PRRT_{comment['id']}",
        "isResolved": comment["id"] in repo.resolved_threads,
        "isOutdated": False,
        "path": comment["path"],
        "line": comment.get("line"),
        "comments": lambda info, first=None, last=None, after=None, before=None: {
            "nodes": _page(
                [
                    {
                        "databaseId": c["id"],
                        "author": _actor(state, c["user"]["login"], kind(c["user"]["login"])),
                        "body": c["body"],
                    }
                    for c in replies
                ],
                first,
                last,
                "comments",
            ),
            "totalCount": len(replies),
        },
    }


def _threads(state: State, repo: Repo, number: int, first: int | None, last: int | None) -> Json:
    nodes = [
        _thread(state, repo, c | {"_pull": number}) for c in review_rules.threads(repo, number)
    ]
    return {"nodes": _page(nodes, first, last, "reviewThreads"), "totalCount": len(nodes)}


def _resolve_thread(state: State, input: Json) -> Json:
    """``resolveReviewThread``: by the pull request's author or anyone with write access
    (GitHub's rule), on a repository the caller can see."""
    tid = str(input.get("threadId") or "")
    kind, who = g.auth
    for repo in state.repos.values():
        if kind == "installation" and repo.installation_id != who:
            continue
        for number, comments in repo.review_comments.items():
            for c in comments:
                if f"PRRT_{c['id']}" != tid:
                    continue
                actor = state.actor()
                author = repo.pulls[number].user.login
                if actor.login != author and repo.permissions.get(actor.login) not in (
                    review_rules.WRITERS
                ):
                    raise _Failed(
                        f"{actor.login} does not have the correct permissions to execute "
                        "`ResolveReviewThread`",
                        "FORBIDDEN",
                    )
                repo.resolved_threads.add(c["id"])
                return {
                    "clientMutationId": input.get("clientMutationId"),
                    "thread": _thread(state, repo, c | {"_pull": number}),
                }
    raise _Failed(f"Could not resolve to a node with the global id of '{tid}'", "NOT_FOUND")


def _actor(state: State, login: str | None, kind: str = "User") -> Json | None:
    if login is None:
        return None
    # GraphQL names an App by its slug: "loopbot", where REST says "loopbot[bot]".
    if kind == "Bot":
        return {"__typename": "Bot", "login": login.removesuffix("[bot]")}
    return {"__typename": "User", "login": login}


def _page(items: list[Any], first: int | None, last: int | None, field: str) -> list[Any]:
    """GitHub's connection rules: ``first`` or ``last``, at most 100."""
    if first is None and last is None:
        raise _Failed(
            f"You must provide a `first` or `last` value to properly paginate the `{field}` "
            "connection.",
            "MISSING_PAGINATION_BOUNDARIES",
        )
    for arg, n in (("first", first), ("last", last)):
        if n is not None and not 0 <= n <= MAX_PAGE:
            raise _Failed(
                f"Requesting {n} records on the `{field}` connection exceeds the `{arg}` "
                f"limit of {MAX_PAGE} records.",
                "EXCESSIVE_PAGINATION",
            )
    if first is not None:
        items = items[:first]
    if last is not None:
        items = items[-last:] if last else []
    return items


def _issue(state: State, repo: Repo, number: int) -> Json:
    issue = repo.issues.get(number)
    if issue is None or issue.is_pull:
        raise _Failed(f"Could not resolve to an Issue with the number of {number}.", "NOT_FOUND")
    body_edits = [e for e in issue.edits if e["field"] == "body"]
    latest = body_edits[-1] if len(body_edits) > 1 else None  # [0] is the original
    return {
        "number": issue.number,
        "title": issue.title,
        "body": issue.body,
        "author": _actor(state, issue.user.login, issue.user.type),
        "createdAt": issue.created_at or "1970-01-01T00:00:00Z",
        "lastEditedAt": latest["at"] if latest else None,
        "editor": _actor(state, latest["editor"], latest["type"]) if latest else None,
        "userContentEdits": lambda info, first=None, last=None, after=None, before=None: _edits(
            state, body_edits, first, last
        ),
        "timelineItems": lambda info, first=None, last=None, after=None, before=None, itemTypes=None: (  # noqa: E501
            _timeline(state, issue, first, last, itemTypes)
        ),
    }


def _edits(state: State, edits: list[Json], first: int | None, last: int | None) -> Json:
    # Newest first, as GitHub lists a comment's edits (``first: 1`` is the latest; the
    # original version, by its author, comes last).
    nodes = [
        {
            "editedAt": e["at"],
            "createdAt": e["at"],
            "editor": _actor(state, e["editor"], e["type"]),
            "diff": e.get("text") or e.get("before") or "",
        }
        for e in reversed(edits)
    ]
    return {"nodes": _page(nodes, first, last, "userContentEdits"), "totalCount": len(nodes)}


def _timeline(
    state: State, issue: Issue, first: int | None, last: int | None, types: list[str] | None
) -> Json:
    items: list[Json] = []
    if types is None or "RENAMED_TITLE_EVENT" in types:
        renames = [e for e in issue.edits if e["field"] == "title"]
        afters = [e["before"] for e in renames[1:]] + ([issue.title] if renames else [])
        for e, after in zip(renames, afters, strict=True):
            items.append(
                {
                    "__typename": "RenamedTitleEvent",
                    "actor": _actor(state, e["editor"], e["type"]),
                    "createdAt": e["at"],
                    "previousTitle": e["before"],
                    "currentTitle": after,
                }
            )
    if types is None or "LABELED_EVENT" in types:
        for e in issue.events:
            if e.get("event") == "labeled":
                items.append(
                    {
                        "__typename": "LabeledEvent",
                        "actor": _actor(state, e["actor"]["login"], e["actor"].get("type", "User")),
                        "createdAt": e["created_at"],
                    }
                )
    items.sort(key=lambda i: i["createdAt"])
    return {"nodes": _page(items, first, last, "timelineItems"), "totalCount": len(items)}
