"""The control-queue job: check who asked, then start, stop, restart or report a loop.

Every command is checked against the repository permission of its actor here, never
in the web request. An actor without write access gets no effect at all: no reaction,
no reply, nothing that tells them whether a loop exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

from bot.core import repo_config
from bot.core.commands import (
    ChecksCompleted,
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
    parse_command,
)
from bot.core.ids import LoopId, issue_from_branch
from bot.core.record import (
    AGENT_LABEL,
    LoopRecord,
    Reason,
    Status,
    approve,
    intake_hash,
)
from bot.core.rules import intake
from bot.core.rules.lifecycle import Create, Refused, Requeue, Restart, may_start
from bot.core.rules.loop import budget
from bot.core.rules.pull import findings as flog
from bot.core.rules.pull import review as review_rules
from bot.core.rules.pull.review import AfterDismissal, after_dismissal
from bot.core.text import messages
from bot.core.text import metric as metric_text
from bot.core.text.messages import code_span
from bot.io.github.client import Installation
from bot.io.github.failures import GitHubError
from bot.io.github.issues import IssueEdits, IssueInfo
from bot.io.logs import get_logger
from bot.io.pace import Pace
from bot.io.queues import enqueue_gate
from bot.io.schedules import Book
from jobs import lifecycle
from jobs.agents.agent import MAX_TOKENS
from jobs.intake import plan, triage
from jobs.review.gate import refuse_closed
from jobs.runtime import Runtime, current, instrumented

log = get_logger("loopbot.dispatch")


@instrumented("dispatch")
def handle_command(raw: str) -> str:
    """RQ entry point: one command, as JSON (see ``bot.core.commands``)."""
    rt = current()
    cmd = parse_command(raw)
    bound = log.bind(
        kind=cmd.kind, repo=cmd.repo, issue=cmd.issue, actor=cmd.actor, delivery=cmd.delivery
    )
    gh = rt.github.installation(cmd.installation_id)
    match cmd:
        case LabelAdded():
            result = _label_added(rt, gh, cmd)
        case ControlCommand():
            result = _control(rt, gh, cmd)
        case IssueInactive():
            result = _inactive(rt, gh, cmd)
        case IssueEdited():
            result = _edited(rt, gh, cmd)
        case PullFeedback():
            result = _feedback(rt, gh, cmd)
        case DismissFinding():
            result = _dismiss(rt, gh, cmd)
        case ChecksCompleted():
            result = _checks(rt, cmd)
        case ReviewChanged():
            result = _review_changed(rt, cmd)
        case QueueChanged():
            result = _queue_changed(rt, cmd)
        case MergeGroupChanged():
            result = _merge_group(rt, gh, cmd)
        case DefaultBranchPushed():
            result = _pushed(rt, gh, cmd)
        case _:
            assert_never(cmd)
    bound.info("dispatch.done", result=result)
    return result


# -- starting ---------------------------------------------------------------------------------


def _label_added(rt: Runtime, gh: Installation, cmd: LabelAdded) -> str:
    text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
    # The ready label starts a fix loop; the optimize label a metric loop (jobs/loop/metric.py).
    if cmd.label == repo_config.ready_label(text):
        kind = "code"
    elif cmd.label == repo_config.loop_label(text, "metric"):
        kind = "metric"
    else:
        return "not the ready label"
    if not gh.can_write(cmd.repo, cmd.actor):
        return f"{cmd.actor} cannot write to {cmd.repo}: ignored"
    try:
        config = rt.parse_config(text)
    except repo_config.ConfigError as exc:
        gh.upsert_comment(
            cmd.repo, cmd.issue, "config-error", messages.config_error(exc.problems, cmd.actor)
        )
        rt.store.event(cmd.loop, "config_invalid", problems=exc.problems)
        return "bad config: " + str(exc)
    if kind == "metric" and config.metric is None:  # say what to add; start nothing
        missing = metric_text.no_metric_section(cmd.actor, cmd.label)
        gh.upsert_comment(cmd.repo, cmd.issue, metric_text.MISSING_KEY, missing)
        return "no metric section in loop.yml"
    issue = gh.issue(cmd.repo, cmd.issue)  # the text this writer approves
    how = f"adding the `{cmd.label}` label again"
    held, issue = _unconfirmed(rt, gh, cmd.repo, issue, how, label=cmd.label)
    if held is not None:
        return held
    return start_loop(
        rt, cmd.repo, cmd.issue, cmd.installation_id, cmd.actor, config, approved=issue, kind=kind
    )


READS = 3  # tries at reading the issue's text twice alike (REST, then GraphQL)


def _unconfirmed(
    rt: Runtime, gh: Installation, repo: str, issue: IssueInfo, how: str, label: str = ""
) -> tuple[str | None, IssueInfo]:
    """Why the writer's approval of ``issue`` waits for a confirmation (None: go on), and
    the issue as approved.

    The latest edit of the body or title, when made by someone who cannot write, must be
    confirmed by a writer approving again (``intake.needs_confirmation``): the label is
    taken off so that labelling again is one step, and the comment says why. The editors
    come from GraphQL and the text from REST: both must read the same text, or the
    editors may belong to another version of it (read again, then asked)."""
    number = issue.number
    key = LoopId(repo, number).key
    for attempt in range(READS):
        edits = gh.latest_edits(repo, number)
        if intake.same_text((edits.title, edits.body), (issue.title, issue.body)):
            break
        time.sleep(attempt + 1)
        issue = gh.issue(repo, number)
    else:
        return _ask_confirmation(rt, gh, repo, issue, None, "", how, label), issue
    untrusted = _untrusted_editor(gh, repo, edits)
    sha = intake_hash(issue.title, issue.body)
    asked = rt.store.confirmation_asked(key)
    if not intake.needs_confirmation(untrusted, asked, sha, edits.stamp):
        if untrusted is not None:
            rt.store.event(key, "intake_confirmed", editor=untrusted)
        rt.store.clear_confirmation(key)
        return None, issue
    return _ask_confirmation(rt, gh, repo, issue, untrusted, edits.stamp, how, label), issue


def _untrusted_editor(gh: Installation, repo: str, edits: IssueEdits) -> str | None:
    """The latest editor of the body or title who cannot write ("" for an account since
    deleted), or None when every latest edit is a writer's or loopbot's own."""
    app = gh.app.slug()
    for editor in edits.editors:
        if editor.bot and editor.login == app:
            continue  # loopbot's own edits (the sections checklist)
        login = f"{editor.login}[bot]" if editor.bot else editor.login
        if not editor.login or not gh.can_write(repo, login):
            return login
    return None


def _ask_confirmation(
    rt: Runtime,
    gh: Installation,
    repo: str,
    issue: IssueInfo,
    editor: str | None,
    stamp: str,
    how: str,
    label: str,
) -> str:
    """Ask a writer to confirm the text as it reads now (bound to its edit ``stamp``)."""
    number = issue.number
    key = LoopId(repo, number).key
    rt.store.ask_confirmation(key, intake_hash(issue.title, issue.body), stamp)
    if label:
        gh.remove_label(repo, number, label)
    gh.upsert_comment(repo, number, intake.CONFIRM_KEY, intake.confirm_comment(editor, how))
    rt.store.event(key, "intake_unconfirmed", editor=editor if editor is not None else "?")
    if editor is None:
        return "the issue changed while it was read: a writer must confirm it"
    return f"the latest edit is by {editor or 'a deleted account'}: a writer must confirm it"


def start_loop(
    rt: Runtime,
    repo: str,
    issue: int,
    installation_id: int,
    actor: str,
    config: repo_config.RepoConfig,
    *,
    restart: bool = False,
    note: str = "",
    approved: IssueInfo | None = None,
    kind: str | None = None,
    scheduled: Scheduled | None = None,
) -> str:
    """Create or resume the loop record and enqueue its one job. Safe to call twice.

    The job waits for a slot when the repository's ``max_parallel`` or the operator's
    ``LOOPBOT_MAX_PARALLEL`` loops hold one already (``bot/core/rules/pace.py``): the
    loop is queued, in line, its place shown on the issue.

    ``note`` tells the agent why it continues (the first line of its next prompt).
    ``approved``: the issue as the writer ``actor`` approved it (frozen intake); None
    keeps the text approved before. ``kind``: "code" or "metric", as the label that
    starts it says; None keeps the record's (a new record: "code"). ``scheduled``: a
    schedule's run (jobs/schedules.py): the commit that approved ``approved``, its task.
    """
    if approved is not None and any(x.startswith(AGENT_LABEL) for x in approved.labels):
        approved = _writers_backend_labels(rt.github.installation(installation_id), repo, approved)
    store = rt.store
    loop = LoopId(repo, issue)
    gh = rt.github.installation(installation_id)
    with store.lock(loop.key):
        record = store.get(loop)
        if record is not None and record.active and Pace(rt.redis).waiter(loop.key):
            where = f" ({messages.place_words(record.waiting)})" if record.waiting else ""
            return f"this loop is waiting in line to start{where}"
        decision = may_start(
            record,
            restart=restart,
            lease_alive=record is not None and store.lease_holder(loop) is not None,
            out_of_budget=_out_of_budget(rt, record, config) if record is not None else "",
            job_pending=lifecycle.job_pending(rt.redis, loop.job_id),
        )
        match decision:
            case Refused(why=why):
                return why
            case Create():
                lifecycle.create(
                    store,
                    loop,
                    installation_id=installation_id,
                    actor=actor,
                    max_turns=config.max_turns,
                    approved=approved,
                    pacing=_pacing(rt, gh, loop, config, approved),
                    kind=kind or "code",
                    also=scheduled.stamp if scheduled is not None else None,
                )
                return "restarted" if restart else "started"
            case Restart():
                assert record is not None  # may_start restarts only a loop that exists
                if kind is not None and metric_text.switch_refused(record, kind):
                    # A worked loop of the other kind: its branch, conversation and table
                    # are that loop's, and would become this one's baseline and PR.
                    gh.upsert_comment(
                        repo, issue, metric_text.SWITCH_KEY, metric_text.switch_comment(record)
                    )
                    return f"the issue's loop is of kind {record.kind}: not switched to {kind}"
                lifecycle.requeue(
                    store,
                    loop,
                    Requeue.RESTART,
                    note=note,
                    by=actor,
                    also=_renew(installation_id, actor, config, approved, kind, scheduled),
                    pacing=_pacing(rt, gh, loop, config, approved),
                )
                return "restarted" if record.restarts or restart else "started"
            case _:
                assert_never(decision)


def _writers_backend_labels(gh: Installation, repo: str, issue: IssueInfo) -> IssueInfo:
    """``issue`` with only the ``loop:agent-<name>`` labels someone with write access
    added (the last to add each, from the issue's events): the backend is a writer's
    choice, and anyone with triage access may label an issue."""
    asked = [x for x in issue.labels if x.startswith(AGENT_LABEL)]
    kept = [x for x in issue.labels if not x.startswith(AGENT_LABEL)]
    for name in asked:
        try:
            who = gh.last_labeler(repo, issue.number, name)
            if who is not None and gh.can_write(repo, who):
                kept.append(name)
        except GitHubError as exc:  # not known to be a writer's: not taken
            log.warning("dispatch.labeler_unknown", repo=repo, label=name, error=str(exc)[:200])
    return issue.model_copy(update={"labels": tuple(kept)})


def _pacing(
    rt: Runtime,
    gh: Installation,
    loop: LoopId,
    config: repo_config.RepoConfig,
    approved: IssueInfo | None,
) -> lifecycle.Pacing:
    """What the line needs of this loop: its priority label (from the issue as approved,
    else as it is now), its repository's cap and the operator's."""
    label = config.labels.priority
    if approved is not None:
        priority = label in approved.labels
    else:
        try:
            priority = label in gh.issue(loop.repo, loop.issue).labels
        except GitHubError as exc:  # not worth failing a start for: it waits unprioritised
            log.warning("dispatch.priority_unknown", loop=loop.key, error=str(exc)[:200])
            priority = False
    return lifecycle.Pacing(
        priority=priority,
        max_parallel=config.max_parallel,
        operator_max=rt.settings.max_parallel,
        gh=gh,
    )


def _renew(
    installation_id: int,
    actor: str,
    config: repo_config.RepoConfig,
    approved: IssueInfo | None,
    kind: str | None = None,
    scheduled: Scheduled | None = None,
) -> Callable[[LoopRecord], None]:
    """What a restart takes from now: this repository's limits, the installation the
    command came through, the text the restarting writer approved (if any), and the
    kind of loop the label they added asks for (if any)."""

    def renew(r: LoopRecord) -> None:
        r.max_turns = config.max_turns
        r.spend_need_usd = 0.0  # a spend cap's refusal is judged again when it runs
        r.installation_id = installation_id
        if kind is not None:
            r.kind = kind
        if approved is not None:
            approve(r, approved.title, approved.body, actor, approved.labels)
        if scheduled is not None:
            scheduled.stamp(r)

    return renew


@dataclass(frozen=True)
class Scheduled:
    """A schedule's run: no person approved its text, the default branch's ``commit``
    that held the task file ``task`` did; ``settings``: the task's ``loop:`` settings."""

    task: str
    commit: str
    settings: dict[str, Any]

    def stamp(self, r: LoopRecord) -> None:
        r.approved_commit = self.commit
        r.schedule = self.task
        r.task_loop = dict(self.settings)


def _out_of_budget(rt: Runtime, record: LoopRecord, config: repo_config.RepoConfig) -> str:
    limits = budget.Budget.of(config, rt.ceilings)
    return budget.refusal(limits, record, budget.smallest_call(rt.settings.model, MAX_TOKENS))


# -- control ------------------------------------------------------------------------------------


def _control(rt: Runtime, gh: Installation, cmd: ControlCommand) -> str:
    if not gh.can_write(cmd.repo, cmd.actor):
        return f"{cmd.actor} cannot write to {cmd.repo}: ignored"
    gh.react(cmd.repo, cmd.comment_id, "eyes")
    key = cmd.loop.key
    record = rt.store.get(key)
    reply_key = f"reply:{cmd.comment_id}"
    if cmd.action == "status":
        gh.upsert_comment(cmd.repo, cmd.issue, reply_key, messages.status_reply(record))
        return "status"
    if cmd.action == "plan":  # milestones proposed for a writer to accept (jobs/intake/plan.py)
        return plan.command(rt, gh, cmd, record)
    if cmd.action in ("accept-spec", "split"):  # answers to triage (jobs/intake/triage.py)
        return triage.command(rt, gh, cmd, record, start=start_loop)  # restarts after accept
    if record is None:
        gh.upsert_comment(cmd.repo, cmd.issue, reply_key, messages.no_loop(cmd.action))
        return "no loop"
    if cmd.action == "cancel":
        result = lifecycle.cancel(rt.redis, key, Reason.CANCELLED, cmd.actor)
        gh.upsert_comment(
            cmd.repo, cmd.issue, reply_key, messages.cancelled(record, cmd.actor, result)
        )
        # A loop waiting in the gate (for people, checks, its turn) has no job of its own
        # to say it ended: the status comment and the head's check run say it here.
        waited = result == "cancelled" and record.status is Status.MERGING
        if waited and (ended := rt.store.get(key)) is not None:
            lifecycle.post_status(rt.store, gh, ended)
        return result
    if record.status in (Status.REVIEWING, Status.MERGING):
        # Its pull request is with the critic or the gate, not with a coding worker: a
        # restart would race that job. Said what is at work, or its lost job revived,
        # under the lock the reconciler revives with (never mid-merge), on the record as
        # it is then: a job that just finished has moved the loop on.
        with rt.store.lock(f"gate:{key}", timeout=120, renew=True):
            now = rt.store.get(key)
            stage = now is not None and now.status is record.status
            alive = not stage or lifecycle.stage_job_pending(rt.redis, record)
            if not alive:
                lifecycle.revive(rt.store, key)
        reply = messages.restart_at_stage(record, cmd.actor, job_alive=alive)
        gh.upsert_comment(cmd.repo, cmd.issue, reply_key, reply)
        return "refused: its stage job is at work" if alive else "stage job queued again"
    text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
    try:
        config = rt.parse_config(text)
    except repo_config.ConfigError as exc:
        gh.upsert_comment(
            cmd.repo, cmd.issue, reply_key, messages.config_error(exc.problems, cmd.actor)
        )
        return "bad config"
    issue = gh.issue(cmd.repo, cmd.issue)  # a writer's restart approves the text
    held, issue = _unconfirmed(rt, gh, cmd.repo, issue, "commenting `/loop-restart` again")
    if held is not None:
        return held
    result = start_loop(
        rt,
        cmd.repo,
        cmd.issue,
        cmd.installation_id,
        cmd.actor,
        config,
        restart=True,
        approved=issue,
    )
    gh.upsert_comment(cmd.repo, cmd.issue, reply_key, messages.restarted(record, cmd.actor, result))
    return result


def _inactive(rt: Runtime, gh: Installation, cmd: IssueInactive) -> str:
    record = rt.store.get(cmd.loop.key)
    if cmd.reason == "unlabeled":
        text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
        # The loop's own label: ready for a fix loop, optimize for a metric loop.
        if cmd.label != repo_config.loop_label(text, record.kind if record else "code"):
            return "not the ready label"
    if record is None or not record.active:
        return "no active loop"
    if cmd.reason == "closed" and record.pr_number is not None:
        # A pull request exists: stop whatever runs and refuse it, with a comment, unless
        # the close came from our own squash merge ("Closes #N").
        return refuse_closed(rt, gh, cmd.loop.key, cmd.actor)
    return lifecycle.cancel(rt.redis, cmd.loop.key, Reason.ISSUE_INACTIVE, cmd.actor)


def _edited(rt: Runtime, gh: Installation, cmd: IssueEdited) -> str:
    """Frozen intake: a writer's edit is the new approved text; anyone else's stops the loop."""
    key = cmd.loop.key
    record = rt.store.get(key)
    if record is None or record.status is Status.COMPLETED:
        return "no loop"
    if intake_hash(cmd.title, cmd.body) == record.approved_sha256:
        return "text unchanged"
    writer = not cmd.by_bot and gh.can_write(cmd.repo, cmd.actor)
    editor = cmd.actor
    if writer and (other := _unapproved_other_edit(gh, cmd, record)) is not None:
        # A writer edited one field; the other differs from the approved text by someone
        # else's edit (a retitle seconds before): this edit does not approve that one.
        writer, editor = False, other
    if writer:
        rt.store.update(key, lambda r: approve(r, cmd.title, cmd.body, cmd.actor))
        rt.store.event(key, "intake_approved", actor=cmd.actor, by="edit")
        # The agent read the old text in its first prompt: its next turn gets the new one.
        edit = {"kind": "intake", "from": cmd.actor, "title": cmd.title, "body": cmd.body}
        rt.store.push_feedback(key, edit)
        if record.active or record.reason != Reason.ISSUE_EDITED:
            return "edit approved"
        # The loop stopped for this very edit before this job ran (its turn-time check
        # came first): resume it, if the issue still reads as this writer left it.
        now = gh.issue(cmd.repo, cmd.issue)
        if intake_hash(now.title, now.body) != intake_hash(cmd.title, cmd.body):
            return "edit approved; the issue changed again since"
        config = rt.config(gh, cmd.repo)
        comment = intake.reapproved_comment(cmd.actor)
        gh.upsert_comment(cmd.repo, cmd.issue, intake.COMMENT_KEY, comment)
        return "edit approved; " + start_loop(
            rt, cmd.repo, cmd.issue, cmd.installation_id, cmd.actor, config, restart=True
        )
    if not record.active:
        return "edit by a non-writer; no active loop"
    # The stopped comment asks a writer to approve this text by labelling again: that
    # label is the confirmation this edit needs (``_unconfirmed``), bound to it.
    edits = gh.latest_edits(cmd.repo, cmd.issue)
    if intake.same_text((edits.title, edits.body), (cmd.title, cmd.body)):
        rt.store.ask_confirmation(key, intake_hash(cmd.title, cmd.body), edits.stamp)
    rt.store.event(key, "intake_edited", actor=editor)
    result = lifecycle.cancel(rt.redis, key, Reason.ISSUE_EDITED, editor)
    label = repo_config.loop_label(gh.file(cmd.repo, repo_config.CONFIG_PATH), record.kind)
    gh.upsert_comment(
        cmd.repo, cmd.issue, intake.COMMENT_KEY, intake.stopped_comment(editor, label)
    )
    return result


def _unapproved_other_edit(gh: Installation, cmd: IssueEdited, record: LoopRecord) -> str | None:
    """Who (cannot write) last changed a field of the issue that now differs from the
    approved text, other than through ``cmd``'s writer; None when every differing field's
    latest editor can write. A writer's body edit must not approve a title someone else
    changed (nor the other way round)."""
    edits = gh.latest_edits(cmd.repo, cmd.issue)
    now = {"title": cmd.title, "body": cmd.body}
    approved = {"title": record.approved_title, "body": record.approved_body}
    for editor in edits.editors:
        if intake.same_text((now[editor.what], ""), (approved[editor.what], "")):
            continue  # this field reads as approved: nobody's edit of it is at stake
        untrusted = _untrusted_editor(gh, cmd.repo, IssueEdits("", "", (editor,)))
        if untrusted is not None:
            return untrusted
    return None


# -- pull request feedback and checks ---------------------------------------------------------


def _feedback(rt: Runtime, gh: Installation, cmd: PullFeedback) -> str:
    issue = cmd.issue
    if issue == 0:
        pull = gh.pull(cmd.repo, cmd.pull)
        found = issue_from_branch(pull.head_ref)
        if found is None:
            return "not a loopbot pull request"
        issue = found
    if not gh.can_write(cmd.repo, cmd.actor):
        return f"{cmd.actor} cannot write to {cmd.repo}: ignored"
    if cmd.comment_id:
        gh.react(cmd.repo, cmd.comment_id, "eyes")
    key = LoopId(cmd.repo, issue).key
    record = rt.store.get(key)
    if record is None or record.status is Status.COMPLETED:
        return "no loop to continue"
    feedback = {"from": cmd.actor, "body": cmd.body, "pull": cmd.pull}
    rt.store.push_feedback(key, feedback)
    rt.store.event(key, "human_feedback", actor=cmd.actor, pull=cmd.pull)
    if record.active and rt.store.lease_holder(key):
        return "queued for the running loop"
    cfg = rt.config(gh, cmd.repo)
    return start_loop(
        rt,
        cmd.repo,
        issue,
        cmd.installation_id,
        cmd.actor,
        cfg,
        restart=True,
        note=f"@{cmd.actor} asked for changes on pull request #{cmd.pull}.",
    )


def _dismiss(rt: Runtime, gh: Installation, cmd: DismissFinding) -> str:
    """``/loop-dismiss F3 <reason>``: a writer marks a review finding as not applying.

    Recorded on the finding (who, why, when, on which head) with an event and a reply.
    A sev1 that was all that held a stopped loop back lets it go on to the merge gate.
    Anything wrong (no such open finding, no reason) is answered and changes nothing.
    """
    issue = cmd.issue
    if issue == 0:
        found = issue_from_branch(gh.pull(cmd.repo, cmd.pull).head_ref)
        if found is None:
            return "not a loopbot pull request"
        issue = found
    if not gh.can_write(cmd.repo, cmd.actor):
        return f"{cmd.actor} cannot write to {cmd.repo}: ignored"
    gh.react(cmd.repo, cmd.comment_id, "eyes")
    key = LoopId(cmd.repo, issue).key
    fid = cmd.finding.upper()

    def reply(text: str) -> None:
        gh.upsert_comment(cmd.repo, cmd.issue or cmd.pull, f"reply:{cmd.comment_id}", text)

    record = rt.store.get(key)
    problem = ""
    if record is None:
        problem = "there is no loop for this issue"
    elif record.status is Status.COMPLETED:
        problem = "this loop completed; its findings are history"
    elif not flog.is_id(fid):
        problem = "name a finding by its id, as in `/loop-dismiss F3 <why it does not apply>`"
    if record is None or problem:
        reply(f"⚠️ @{cmd.actor}: nothing was dismissed: {problem}.")
        return "dismiss refused: " + problem
    # The head the finding is dismissed on: the pull request's, or before there is one
    # (a section audit's finding) the last head loopbot pushed.
    head = gh.pull(cmd.repo, record.pr_number).head_sha if record.pr_number else record.head_sha
    config = rt.config(gh, cmd.repo)

    def apply(r: LoopRecord) -> None:
        r.finding_log = flog.dismiss(
            r.finding_log, fid, by=cmd.actor, reason=cmd.reason, sha=head, at=time.time()
        )
        # loopbot's held-out finding: the dismissal is of this evidence (these tests as
        # this head has them), not of every later test change (bot/core/rules/pull/review.py).
        review_rules.bind_dismissal(r.finding_log, fid, r.test_evidence)
        # The last review's findings, as the loop's next prompt and the gate read them.
        r.findings = [x for x in r.findings if x.get("id") != fid]

    with rt.store.lock(key):  # the decision to go to the gate, against a concurrent start
        try:
            updated = rt.store.update(key, apply)
        except ValueError as exc:
            reply(f"⚠️ @{cmd.actor}: nothing was dismissed: {exc}.")
            return f"dismiss refused: {exc}"
        entry = next(e for e in updated.finding_log if e["id"] == fid)
        then = after_dismissal(
            status=updated.status,
            reason=updated.reason,
            severity=str(entry["severity"]),
            log=updated.finding_log,
            head=head,
            reviewed_sha=updated.reviewed_sha,
            reviewed_whole=updated.reviewed_whole,
            verdicts=updated.verdicts,
            section=entry.get("section"),
            pull=updated.pr_number is not None,
        )
        if then is AfterDismissal.GATE and not config.merge.enabled:
            then = AfterDismissal.NOTHING
        if then is AfterDismissal.REVIEW and not config.critic.enabled:
            then = AfterDismissal.GATE if config.merge.enabled else AfterDismissal.NOTHING
        rt.store.event(
            key,
            "finding_dismissed",
            id=fid,
            severity=entry["severity"],
            actor=cmd.actor,
            reason=cmd.reason,
            sha=head,
            unblocked=then is not AfterDismissal.NOTHING,
            then=then.value,
        )
        if then is AfterDismissal.RESUME:
            # The section audit's sev1 that stopped the loop no longer stands: the loop
            # goes on, and passes the section (its audit judged this head) or audits it
            # again before coding. It holds a slot again at once: a person asked.
            Pace(rt.redis).adopt(key, updated.repo)
            note = (
                f"@{cmd.actor} dismissed {fid} ({entry['title']}): {cmd.reason}. The "
                "dismissed finding no longer applies; carry on with the section."
            )
            if lifecycle.requeue(rt.store, key, Requeue.DISMISSED, note=note, by=cmd.actor) is None:
                lifecycle.release(rt.store, key)
                then = AfterDismissal.NOTHING
        elif then is not AfterDismissal.NOTHING:
            # To the gate: the critic's verdict on this head stays as it was; the gate
            # reads the dismissal from the finding log and its receipt names the writer who
            # overrode the critic. It still re-reads the issue, the checks and mergeability.
            # A new round first: the critic reviews the head as it is, whole, with the
            # dismissal standing (a dismissed finding is never raised again).
            # The ended loop gave its slot back: an active one holds one again, counted
            # before its job can run (and end it), so the line admits no loop on top of
            # it, nor of the fix turns it may be sent back to (the reconciler would count
            # it too, a pass later; never stopped for the cap: a person asked).
            Pace(rt.redis).adopt(key, updated.repo)
            stage = Status.MERGING if then is AfterDismissal.GATE else Status.REVIEWING
            moved = lifecycle.advance(
                rt.store,
                key,
                stage,
                came_from=frozenset({Status.REFUSED, Status.FAILED}),
                reason="",
                detail="",
            )
            if moved is None:
                lifecycle.release(rt.store, key)  # it did not become active after all
                then = AfterDismissal.NOTHING
    standing = [str(e["id"]) for e in flog.blocking(updated.finding_log)]
    if then is AfterDismissal.RESUME:
        after = (
            "No sev1 finding of this section stands: the loop goes on (the section passes "
            "if its last audit judged this head, else it is audited again first)."
        )
    elif then is AfterDismissal.GATE:
        after = "No sev1 finding stands on this head: loopbot goes on to the merge gate."
    elif then is AfterDismissal.REVIEW:
        after = (
            "No sev1 finding stands, but the last review did not read this head's whole "
            "diff: the critic judges it once more (the dismissal stands) before the gate."
        )
    elif standing:
        after = f"Still blocking the merge: {', '.join(standing)}."
    else:
        after = "It no longer counts, and later reviews keep it dismissed."
    reply(
        f"@{cmd.actor} dismissed **{fid}** ({entry['severity']}, {entry['title']}) on "
        f"{code_span(head[:10] or 'no head')}: {cmd.reason}\n\n{after}"
    )
    queued = {
        AfterDismissal.GATE: "; merge gate queued",
        AfterDismissal.REVIEW: "; review queued",
        AfterDismissal.RESUME: "; loop resumed",
    }
    return f"dismissed {fid}" + queued.get(then, "")


def _checks(rt: Runtime, cmd: ChecksCompleted) -> str:
    record = rt.store.get(cmd.loop.key)
    if record is None or record.status != Status.MERGING:
        return "no loop waiting for checks"
    if record.head_sha and record.head_sha != cmd.head_sha:
        return "checks for another head"
    enqueue_gate(rt.redis, record.repo, record.issue)
    return "gate woken"


def _review_changed(rt: Runtime, cmd: ReviewChanged) -> str:
    """A person's review changed on the loop's pull request: a gate waiting for people
    reads the base branch's rules again at once (GitHub decides whose review counts)."""
    record = rt.store.get(cmd.loop.key)
    if record is None or record.status != Status.MERGING or record.pr_number != cmd.pull:
        return "no loop waiting for this pull request's reviews"
    enqueue_gate(rt.redis, record.repo, record.issue)
    return "gate woken by a review"


def _queue_changed(rt: Runtime, cmd: QueueChanged) -> str:
    """The loop's pull request entered or left the merge queue, or closed: the gate reads
    the queue (and the pull request) again at once; GitHub's answer, not the webhook's
    words, decides."""
    record = rt.store.get(cmd.loop.key)
    if record is None or record.status != Status.MERGING or record.pr_number != cmd.pull:
        return "no loop at the gate for this pull request"
    rt.store.event(cmd.loop.key, "merge_queue", action=cmd.action, reason=cmd.reason)
    enqueue_gate(rt.redis, record.repo, record.issue)
    return f"gate woken: pull request {cmd.action}"


def _merge_group(rt: Runtime, gh: Installation, cmd: MergeGroupChanged) -> str:
    """A merge group of the loop's pull request: its commit is where the queue runs the
    required checks (what failed, should the queue let go of it); the gate is woken."""
    pull = gh.pull(cmd.repo, cmd.pull)
    issue = issue_from_branch(pull.head_ref)
    if issue is None:
        return "not a loopbot pull request"
    key = LoopId(cmd.repo, issue).key
    record = rt.store.get(key)
    if record is None or record.status != Status.MERGING or record.pr_number != cmd.pull:
        return "no loop at the gate for this pull request"
    if cmd.action == "checks_requested":
        rt.store.set_fields(key, queue_group=cmd.group_sha)
    rt.store.event(key, "merge_group", action=cmd.action, group=cmd.group_sha, reason=cmd.reason)
    enqueue_gate(rt.redis, record.repo, record.issue)
    return f"gate woken: merge group {cmd.action}"


# -- schedules ----------------------------------------------------------------------------------


def _pushed(rt: Runtime, gh: Installation, cmd: DefaultBranchPushed) -> str:
    """The default branch's ``loop.yml`` changed: its schedules as it says now (a new or
    removed schedule takes effect at the reconciler's next pass, not the next sweep)."""
    text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
    table = Book(rt.redis).read(cmd.repo, cmd.installation_id, text, time.time())
    if table.error:
        return f"schedules not read: {table.error}"
    return f"{len(table.schedules)} schedule(s) read"
