"""Which webhook means what: a pure function from (event, payload) to a command.

Payloads are parsed into small models holding only the fields used (the kodiak way);
everything else GitHub sends is ignored. No I/O here: permission checks happen in the
job, because the request must answer within milliseconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bot.core.commands import (
    ChecksCompleted,
    Command,
    ControlAction,
    ControlCommand,
    DefaultBranchPushed,
    DismissFinding,
    IssueEdited,
    IssueInactive,
    LabelAdded,
    MergeGroupChanged,
    PullFeedback,
    QueueChanged,
    ReviewChanged,
)
from bot.core.ids import issue_from_branch
from bot.core.repo_config import CONFIG_PATH

CONTROL_WORDS: dict[str, ControlAction] = {
    "/loop-cancel": "cancel",
    "/loop-restart": "restart",
    "/loop-status": "status",
    "/loop-plan": "plan",  # propose milestones for an issue that has none (jobs/intake/plan.py)
    "/loop-accept-spec": "accept-spec",  # take triage's proposed spec (jobs/intake/triage.py)
    "/loop-split": "split",  # create the sub-issues triage proposed (jobs/intake/triage.py)
}
FEEDBACK_WORD = "/loop"
DISMISS_WORD = "/loop-dismiss"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _User(_Model):
    login: str
    type: str = "User"


class _Installation(_Model):
    id: int


class _Repo(_Model):
    full_name: str


class _Label(_Model):
    name: str


class _Issue(_Model):
    number: int
    pull_request: dict[str, Any] | None = None
    title: str = ""
    body: str | None = ""


class _Comment(_Model):
    id: int
    body: str | None = ""


class _Ref(_Model):
    ref: str
    sha: str


class _Pull(_Model):
    number: int
    head: _Ref


class _Review(_Model):
    id: int
    state: str
    body: str | None = ""


class _App(_Model):
    id: int


class _Suite(_Model):
    head_branch: str | None = None
    head_sha: str
    conclusion: str | None = None
    app: _App | None = None


class _Envelope(_Model):
    action: str | None = None
    sender: _User
    installation: _Installation
    repository: _Repo


class _IssuesEvent(_Envelope):
    issue: _Issue
    label: _Label | None = None
    changes: dict[str, Any] | None = None


class _CommentEvent(_Envelope):
    issue: _Issue
    comment: _Comment


class _ReviewEvent(_Envelope):
    pull_request: _Pull
    review: _Review


class _SuiteEvent(_Envelope):
    check_suite: _Suite


class _CheckRun(_Model):
    check_suite: _Suite
    app: _App | None = None
    conclusion: str | None = None


class _RunEvent(_Envelope):
    check_run: _CheckRun


class _PullState(_Model):
    number: int
    head: _Ref
    merged: bool | None = None


class _PullEvent(_Envelope):
    pull_request: _PullState
    reason: str | None = None


class _Group(_Model):
    head_sha: str
    head_ref: str


class _GroupEvent(_Envelope):
    merge_group: _Group
    reason: str | None = None


class _PushRepo(_Repo):
    default_branch: str


class _PushCommit(_Model):
    added: list[str] = []
    modified: list[str] = []
    removed: list[str] = []


class _PushEvent(_Model):
    ref: str
    after: str = ""
    deleted: bool = False
    sender: _User
    installation: _Installation
    repository: _PushRepo
    commits: list[_PushCommit] = []


# GitHub's docs: a push's ``commits`` holds at most 20 commits in timeline events (and up
# to 2,048 in webhook deliveries). From 20 on, loop.yml is read again whatever the list
# says: a read too many costs one request, a change missed waits for the sweep.
PUSH_COMMITS_LISTED = 20

# A merge group's temporary branch: gh-readonly-queue/<base>/pr-<number>-<base sha>.
GROUP_REF = re.compile(r"^refs/heads/gh-readonly-queue/.+/pr-(\d+)-[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class Enqueue:
    command: Command


@dataclass(frozen=True)
class Ignore:
    reason: str


@dataclass(frozen=True)
class Malformed:
    """The event is one we act on, but its payload lacks what we need."""

    reason: str


Route = Enqueue | Ignore | Malformed


def route(event: str, payload: Any, *, app_id: int, delivery: str = "") -> Route:
    """Decide what a webhook delivery means for loopbot."""
    handler = _HANDLERS.get(event)
    if handler is None:
        return Ignore(f"event {event!r} is not used")
    if not isinstance(payload, dict):
        return Malformed("payload is not a JSON object")
    try:
        return handler(payload, app_id, delivery)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return Malformed(f"{event} payload: {where}: {first['msg']}")


def _is_bot(sender: _User) -> bool:
    # Bots (loopbot itself included) never trigger or command loops: "nothing happens
    # unless someone with write access asked", and a bot asking is nobody asking.
    return sender.type != "User"


def _issues(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    action = payload.get("action")
    if action not in ("labeled", "unlabeled", "closed", "edited"):
        return Ignore(f"issues.{action} is not used")
    ev = _IssuesEvent.model_validate(payload)
    if ev.issue.pull_request is not None:
        return Ignore(f"issues.{action} on a pull request")
    common = {
        "installation_id": ev.installation.id,
        "repo": ev.repository.full_name,
        "issue": ev.issue.number,
        "actor": ev.sender.login,
        "delivery": delivery,
    }
    if action == "edited":
        # Frozen intake: the job decides whether the editor may change what was approved.
        # Bots are routed too: an edit nobody with write access made must stop the loop.
        if not {"title", "body"} & set(ev.changes or {}):
            return Ignore("issues.edited changed neither title nor body")
        return Enqueue(
            IssueEdited(
                title=ev.issue.title,
                body=ev.issue.body or "",
                by_bot=_is_bot(ev.sender),
                **common,
            )
        )
    if action == "closed":
        # Closing stops a loop whoever closes it, bots included: stopping is always safe.
        return Enqueue(IssueInactive(reason="closed", **common))
    if ev.label is None:
        return Malformed(f"issues.{action} payload: label: missing")
    if action == "unlabeled":
        return Enqueue(IssueInactive(reason="unlabeled", label=ev.label.name, **common))
    if _is_bot(ev.sender):
        return Ignore(f"label added by {ev.sender.type} {ev.sender.login}")
    return Enqueue(LabelAdded(label=ev.label.name, **common))


def _first_word(body: str | None) -> str:
    words = (body or "").strip().split(maxsplit=1)
    return words[0] if words else ""


def _issue_comment(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    if payload.get("action") != "created":
        return Ignore(f"issue_comment.{payload.get('action')} is not used")
    ev = _CommentEvent.model_validate(payload)
    word = _first_word(ev.comment.body)
    if word not in CONTROL_WORDS and word not in (FEEDBACK_WORD, DISMISS_WORD):
        return Ignore("comment is not a loopbot command")
    if _is_bot(ev.sender):
        return Ignore(f"command from {ev.sender.type} {ev.sender.login}")
    common = {
        "installation_id": ev.installation.id,
        "repo": ev.repository.full_name,
        "actor": ev.sender.login,
        "delivery": delivery,
    }
    on_pull = ev.issue.pull_request is not None
    if word == DISMISS_WORD:
        return Enqueue(_dismiss(ev, on_pull, common))
    if word == FEEDBACK_WORD:
        if not on_pull:
            return Ignore("/loop is a pull request command")
        return Enqueue(
            PullFeedback(
                issue=0,
                pull=ev.issue.number,
                body=ev.comment.body or "",
                comment_id=ev.comment.id,
                **common,
            )
        )
    if on_pull:
        return Ignore(f"{word} belongs on the issue, not the pull request")
    return Enqueue(
        ControlCommand(
            action=CONTROL_WORDS[word],
            comment_id=ev.comment.id,
            issue=ev.issue.number,
            **common,
        )
    )


def _dismiss(ev: _CommentEvent, on_pull: bool, common: dict[str, Any]) -> DismissFinding:
    # "/loop-dismiss F3 the overflow cannot happen: n <= 10" -> ("F3", "the overflow ...").
    # Checked in the job, which answers a malformed command; here only cut to size.
    words = (ev.comment.body or "").strip().split(maxsplit=2)
    return DismissFinding(
        issue=0 if on_pull else ev.issue.number,
        pull=ev.issue.number if on_pull else 0,
        finding=(words[1] if len(words) > 1 else "")[:100],
        reason=(words[2].strip() if len(words) > 2 else "")[:2000],
        comment_id=ev.comment.id,
        **common,
    )


def _review(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    action = payload.get("action")
    if action not in ("submitted", "dismissed"):
        return Ignore(f"pull_request_review.{action} is not used")
    ev = _ReviewEvent.model_validate(payload)
    if _is_bot(ev.sender):
        return Ignore(f"review by {ev.sender.type} {ev.sender.login}")
    issue = issue_from_branch(ev.pull_request.head.ref)
    if issue is None:
        return Ignore("not a loopbot pull request")
    if action == "dismissed" or ev.review.state.lower() != "changes_requested":
        # An approval (or its dismissal, or a comment that may resolve a thread): a gate
        # waiting for people re-reads what the base branch asks. The job checks who.
        return Enqueue(
            ReviewChanged(
                installation_id=ev.installation.id,
                repo=ev.repository.full_name,
                issue=issue,
                actor=ev.sender.login,
                delivery=delivery,
                pull=ev.pull_request.number,
                state=ev.review.state.lower(),
            )
        )
    return Enqueue(
        PullFeedback(
            installation_id=ev.installation.id,
            repo=ev.repository.full_name,
            issue=issue,
            actor=ev.sender.login,
            delivery=delivery,
            pull=ev.pull_request.number,
            body=ev.review.body or "",
            review_id=ev.review.id,
        )
    )


def _checks(
    suite: _Suite, env: _Envelope, app_id: int, delivery: str, owner_app: _App | None
) -> Route:
    if owner_app is not None and owner_app.id == app_id:
        return Ignore("loopbot's own check")
    issue = issue_from_branch(suite.head_branch or "")
    if issue is None:
        return Ignore("not a loopbot branch")
    return Enqueue(
        ChecksCompleted(
            installation_id=env.installation.id,
            repo=env.repository.full_name,
            issue=issue,
            actor=env.sender.login,
            delivery=delivery,
            head_sha=suite.head_sha,
            conclusion=suite.conclusion,
        )
    )


def _check_suite(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    if payload.get("action") != "completed":
        return Ignore(f"check_suite.{payload.get('action')} is not used")
    ev = _SuiteEvent.model_validate(payload)
    return _checks(ev.check_suite, ev, app_id, delivery, ev.check_suite.app)


def _check_run(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    if payload.get("action") != "completed":
        return Ignore(f"check_run.{payload.get('action')} is not used")
    ev = _RunEvent.model_validate(payload)
    return _checks(ev.check_run.check_suite, ev, app_id, delivery, ev.check_run.app)


def _pull_request(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    """A loop's pull request entered or left its merge queue, or closed: the gate reads
    the queue again (whoever sent it: the gate trusts only what it reads)."""
    action = payload.get("action")
    if action not in ("enqueued", "dequeued", "closed"):
        return Ignore(f"pull_request.{action} is not used")
    ev = _PullEvent.model_validate(payload)
    issue = issue_from_branch(ev.pull_request.head.ref)
    if issue is None:
        return Ignore("not a loopbot pull request")
    return Enqueue(
        QueueChanged(
            installation_id=ev.installation.id,
            repo=ev.repository.full_name,
            issue=issue,
            actor=ev.sender.login,
            delivery=delivery,
            pull=ev.pull_request.number,
            action=action,
            reason=ev.reason or "",
        )
    )


def _merge_group(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    action = payload.get("action")
    if action not in ("checks_requested", "destroyed"):
        return Ignore(f"merge_group.{action} is not used")
    ev = _GroupEvent.model_validate(payload)
    found = GROUP_REF.match(ev.merge_group.head_ref)
    if found is None:
        return Malformed(f"merge_group head_ref {ev.merge_group.head_ref[:200]!r} names no pull")
    return Enqueue(
        MergeGroupChanged(
            installation_id=ev.installation.id,
            repo=ev.repository.full_name,
            actor=ev.sender.login,
            delivery=delivery,
            pull=int(found.group(1)),
            action=action,
            group_sha=ev.merge_group.head_sha,
            reason=ev.reason or "",
        )
    )


def _push(payload: dict[str, Any], app_id: int, delivery: str) -> Route:
    """A push to the default branch that changed ``loop.yml``: its schedules are read
    again (docs/repositories.md#scheduled-loops). Whoever pushed: reading the default
    branch is safe."""
    ev = _PushEvent.model_validate(payload)
    if ev.ref != f"refs/heads/{ev.repository.default_branch}":
        return Ignore("push to a branch other than the default")
    if ev.deleted:
        return Ignore("the default branch was deleted")
    touched = any(CONFIG_PATH in (*c.added, *c.modified, *c.removed) for c in ev.commits)
    if not touched and len(ev.commits) < PUSH_COMMITS_LISTED:
        return Ignore(f"{CONFIG_PATH} unchanged")
    return Enqueue(
        DefaultBranchPushed(
            installation_id=ev.installation.id,
            repo=ev.repository.full_name,
            actor=ev.sender.login,
            delivery=delivery,
            head_sha=ev.after,
        )
    )


_HANDLERS = {
    "issues": _issues,
    "issue_comment": _issue_comment,
    "pull_request_review": _review,
    "check_suite": _check_suite,
    "check_run": _check_run,
    "pull_request": _pull_request,
    "merge_group": _merge_group,
    "push": _push,
}
