"""Small typed commands: what the web process enqueues instead of payloads.

Jobs fetch fresh state from GitHub; a command only says who asked for what, where.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from bot.core.ids import LoopId

REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class _Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    installation_id: int
    repo: str = Field(pattern=REPO_RE.pattern)
    issue: int = Field(gt=0)
    actor: str
    delivery: str = ""

    @property
    def loop(self) -> LoopId:
        return LoopId(self.repo, self.issue)


class LabelAdded(_Command):
    """A label was put on an issue; the job decides whether it is the ready label."""

    kind: Literal["label_added"] = "label_added"
    label: str


ControlAction = Literal["cancel", "restart", "status", "plan", "accept-spec", "split"]


class ControlCommand(_Command):
    """``/loop-cancel``, ``/loop-restart``, ``/loop-status``, ``/loop-plan``,
    ``/loop-accept-spec`` or ``/loop-split`` in an issue comment."""

    kind: Literal["control"] = "control"
    action: ControlAction
    comment_id: int


class IssueInactive(_Command):
    """The issue was closed or lost a label; a running loop must stop at its next check."""

    kind: Literal["issue_inactive"] = "issue_inactive"
    reason: Literal["closed", "unlabeled"]
    label: str = ""


class IssueEdited(_Command):
    """The issue's title or body changed. ``title`` and ``body`` are the text after this
    edit (from the payload, not re-read: a later edit by someone else is its own event)."""

    kind: Literal["issue_edited"] = "issue_edited"
    title: str
    body: str = ""
    by_bot: bool = False


class PullFeedback(_Command):
    """A human asked loopbot's PR for changes (a review, or ``/loop`` on the PR).

    ``issue`` is the loop's issue when the payload names the PR's head branch
    (``loop/issue-N``); an ``issue_comment`` payload does not, so there it is 0 and the
    job reads the PR to find it.
    """

    kind: Literal["pull_feedback"] = "pull_feedback"
    issue: int = Field(ge=0)
    pull: int = Field(gt=0)
    body: str = ""
    review_id: int | None = None
    comment_id: int | None = None


class DismissFinding(_Command):
    """``/loop-dismiss F3 <reason>``: a writer says a review finding does not apply.

    Accepted on the issue and on loopbot's pull request, where the reviews are; on the
    pull request ``issue`` is 0 and ``pull`` its number, and the job reads the pull
    request's branch to find the loop. ``finding`` and ``reason`` are as written: the
    job checks them, so a malformed command still gets an answer saying what is wrong.
    """

    kind: Literal["dismiss"] = "dismiss"
    issue: int = Field(ge=0)
    pull: int = Field(0, ge=0)
    finding: str = Field("", max_length=100)
    reason: str = Field("", max_length=2000)
    comment_id: int


class ChecksCompleted(_Command):
    """A check suite finished on loopbot's branch head: the merge gate may open."""

    kind: Literal["checks_completed"] = "checks_completed"
    head_sha: str
    conclusion: str | None = None


class ReviewChanged(_Command):
    """A person approved, commented on or dismissed a review of loopbot's pull request:
    a gate waiting for people (an approval, a code owner, a resolved thread) may open."""

    kind: Literal["review_changed"] = "review_changed"
    pull: int = Field(gt=0)
    state: str = ""


class QueueChanged(_Command):
    """The loop's pull request entered or left its base's merge queue, or closed (merged
    by the queue, or by a person): the gate reads the queue again."""

    kind: Literal["queue_changed"] = "queue_changed"
    pull: int = Field(gt=0)
    action: str
    reason: str = ""  # pull_request.dequeued's reason (CI_FAILURE, MANUAL...)


class MergeGroupChanged(_Command):
    """A merge queue built a merge group for pull request ``pull`` (checks requested) or
    destroyed it. The webhook names the pull request only by its temporary branch, not
    the issue: the job finds the loop from the pull request's head branch."""

    kind: Literal["merge_group"] = "merge_group"
    issue: int = Field(default=0, ge=0)  # unknown to the router: the job reads it
    pull: int = Field(gt=0)
    action: str
    group_sha: str
    reason: str = ""


class DefaultBranchPushed(_Command):
    """A push to the repository's default branch changed ``.github/loop.yml`` (or may
    have: a payload lists 20 commits at most): its ``schedules:`` are read again."""

    kind: Literal["default_pushed"] = "default_pushed"
    issue: int = Field(default=0, ge=0)  # no issue: the repository's schedules
    head_sha: str = ""


Command = Annotated[
    LabelAdded
    | ControlCommand
    | IssueInactive
    | IssueEdited
    | PullFeedback
    | DismissFinding
    | ChecksCompleted
    | ReviewChanged
    | QueueChanged
    | MergeGroupChanged
    | DefaultBranchPushed,
    Field(discriminator="kind"),
]
COMMAND_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)


def parse_command(data: str | bytes) -> Command:
    return COMMAND_ADAPTER.validate_json(data)
