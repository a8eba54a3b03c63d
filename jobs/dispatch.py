"""The control-queue job: check who asked, then start, stop, restart or report a loop.

Every command is checked against the repository permission of its actor here, never
in the web request. An actor without write access gets no effect at all: no reaction,
no reply, nothing that tells them whether a loop exists.
"""

from __future__ import annotations

import contextlib
import time

from redis import Redis
from rq import Retry, get_current_job
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import JobStatus

from bot.core import repo_config
from bot.core.commands import (
    ChecksCompleted,
    ControlCommand,
    DismissFinding,
    IssueEdited,
    IssueInactive,
    LabelAdded,
    PullFeedback,
    parse_command,
)
from bot.core.ids import LoopId, issue_from_branch
from bot.core.record import (
    ACTIVE,
    LoopRecord,
    Reason,
    Status,
    approve,
    can_restart,
    intake_hash,
    should_start,
)
from bot.core.rules import budget, intake
from bot.core.rules import findings as flog
from bot.core.rules.review import gate_after_dismissal
from bot.core.text import messages
from bot.core.text.messages import code_span
from bot.io.github.client import Installation, IssueInfo
from bot.io.logs import get_logger
from bot.io.queues import LOOP_JOB, enqueue_gate, fetch_job, loop_queue
from bot.io.store import Store
from jobs.agent import MAX_TOKENS
from jobs.runtime import Runtime, current, instrumented

log = get_logger("loopbot.dispatch")

MAX_JOB_RETRIES = 3
PENDING = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED)


@instrumented("dispatch")
def handle_command(raw: str) -> str:
    """RQ entry point: one command, as JSON (see ``bot.core.commands``)."""
    rt = current()
    cmd = parse_command(raw)
    bound = log.bind(
        kind=cmd.kind, repo=cmd.repo, issue=cmd.issue, actor=cmd.actor, delivery=cmd.delivery
    )
    gh = rt.github.installation(cmd.installation_id)
    if isinstance(cmd, LabelAdded):
        result = _label_added(rt, gh, cmd)
    elif isinstance(cmd, ControlCommand):
        result = _control(rt, gh, cmd)
    elif isinstance(cmd, IssueInactive):
        result = _inactive(rt, gh, cmd)
    elif isinstance(cmd, IssueEdited):
        result = _edited(rt, gh, cmd)
    elif isinstance(cmd, PullFeedback):
        result = _feedback(rt, gh, cmd)
    elif isinstance(cmd, DismissFinding):
        result = _dismiss(rt, gh, cmd)
    else:
        assert isinstance(cmd, ChecksCompleted)
        result = _checks(rt, cmd)
    bound.info("dispatch.done", result=result)
    return result


# -- starting ---------------------------------------------------------------------------------


def _label_added(rt: Runtime, gh: Installation, cmd: LabelAdded) -> str:
    text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
    if cmd.label != repo_config.ready_label(text):
        return "not the ready label"
    if not gh.can_write(cmd.repo, cmd.actor):
        return f"{cmd.actor} cannot write to {cmd.repo}: ignored"
    try:
        config = repo_config.parse(text, repo_config.Ceilings.of(rt.settings))
    except repo_config.ConfigError as exc:
        gh.upsert_comment(
            cmd.repo, cmd.issue, "config-error", messages.config_error(exc.problems, cmd.actor)
        )
        rt.store.event(cmd.loop, "config_invalid", problems=exc.problems)
        return "bad config: " + str(exc)
    issue = gh.issue(cmd.repo, cmd.issue)  # the text this writer approves
    return start_loop(
        rt, cmd.repo, cmd.issue, cmd.installation_id, cmd.actor, config, approved=issue
    )


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
) -> str:
    """Create or resume the loop record and enqueue its one job. Safe to call twice.

    ``note`` tells the agent why it continues (the first line of its next prompt).
    ``approved``: the issue as the writer ``actor`` approved it (frozen intake); None
    keeps the text approved before.
    """
    store = rt.store
    key = LoopId(repo, issue).key
    with store.lock(key):
        record = store.get(key)
        if restart and record is not None:
            alive = store.lease_holder(key) is not None
            ok, why = can_restart(record, alive)
        else:
            ok, why = should_start(record)
        if ok and record is not None and (why := _out_of_budget(rt, record, config)):
            return why  # a restart never refills the issue's budget: say which one is out
        if not ok:
            return why
        if _job_pending(rt, LoopId(repo, issue).job_id):
            return "a loop job is already queued"
        if record is None:
            record = LoopRecord(
                repo=repo,
                issue=issue,
                installation_id=installation_id,
                branch=LoopId(repo, issue).branch,
                started_by=actor,
                max_turns=config.max_turns,
            )
            if approved is not None:
                approve(record, approved.title, approved.body, actor)
            store.put(record)
            store.event(key, "loop_created", actor=actor)
        else:
            # Same identity, branch, conversation and findings; fresh turn, error and review budget.
            def resume(r: LoopRecord) -> None:
                r.status = Status.QUEUED
                r.phase = "queued"
                r.turn = 0
                r.error_count = 0
                r.idle_turns = 0  # a stop for no_changes must not recur at the first idle turn
                # A person asked for another go: fresh review rounds too, or a loop stopped
                # for critic_rounds_exhausted would stop again at its first sev1.
                r.critic_round = 0
                r.sev1_rounds = {}
                r.reason = ""
                r.detail = ""
                r.max_turns = config.max_turns
                r.installation_id = installation_id
                r.restarts += 1
                r.resume_note = (
                    note
                    or r.resume_note
                    or f"@{actor} restarted this loop; continue from the last commit."
                )
                if approved is not None:
                    approve(r, approved.title, approved.body, actor)

            store.update(key, resume)
            store.event(key, "loop_restarted", actor=actor)
        store.clear_cancel(key)
        enqueue_loop(rt, repo, issue)
    return "restarted" if record.restarts or restart else "started"


def _out_of_budget(rt: Runtime, record: LoopRecord, config: repo_config.RepoConfig) -> str:
    limits = budget.Budget.of(config, repo_config.Ceilings.of(rt.settings))
    return budget.refusal(limits, record, budget.smallest_call(rt.settings.model, MAX_TOKENS))


def enqueue_loop(rt: Runtime, repo: str, issue: int, *, replace: bool = False) -> None:
    """Enqueue the loop's one job. ``replace``: the old job's worker is known dead."""
    job_id = LoopId(repo, issue).job_id
    if not replace and _job_pending(rt, job_id):
        return
    _delete_finished(rt, job_id)
    loop_queue(rt.redis).enqueue(
        LOOP_JOB,
        repo,
        issue,
        job_id=job_id,
        job_timeout=6 * 3600,
        result_ttl=7 * 24 * 3600,
        failure_ttl=7 * 24 * 3600,
        description=f"loop {repo}#{issue}",
        # Transient failures (GitHub down, a git timeout) retry the job; the loop's own
        # error budget (jobs.loop.MAX_ERRORS) decides when to give up.
        retry=Retry(max=MAX_JOB_RETRIES, interval=[15, 60, 180]),
    )


def _job_pending(rt: Runtime, job_id: str) -> bool:
    try:
        job = fetch_job(job_id, rt.redis)
    except NoSuchJobError:
        return False
    this = get_current_job()
    if this is not None and this.id == job_id:
        return False
    return job.get_status(refresh=True) in PENDING


def _delete_finished(rt: Runtime, job_id: str) -> None:
    with contextlib.suppress(NoSuchJobError):
        fetch_job(job_id, rt.redis).delete()


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
    if record is None:
        gh.upsert_comment(cmd.repo, cmd.issue, reply_key, messages.no_loop(cmd.action))
        return "no loop"
    if cmd.action == "cancel":
        result = cancel_loop(rt.redis, key, Reason.CANCELLED, cmd.actor)
        gh.upsert_comment(
            cmd.repo, cmd.issue, reply_key, messages.cancelled(record, cmd.actor, result)
        )
        return result
    text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
    try:
        config = repo_config.parse(text, repo_config.Ceilings.of(rt.settings))
    except repo_config.ConfigError as exc:
        gh.upsert_comment(
            cmd.repo, cmd.issue, reply_key, messages.config_error(exc.problems, cmd.actor)
        )
        return "bad config"
    result = start_loop(
        rt,
        cmd.repo,
        cmd.issue,
        cmd.installation_id,
        cmd.actor,
        config,
        restart=True,
        approved=gh.issue(cmd.repo, cmd.issue),  # a writer's restart approves the text
    )
    gh.upsert_comment(cmd.repo, cmd.issue, reply_key, messages.restarted(record, cmd.actor, result))
    return result


def cancel_loop(redis: Redis, key: str, reason: Reason, actor: str) -> str:
    """Stop a loop within seconds: flag it, stop its job, drop it from the queue.

    The branch, worktree, conversation and findings are kept for ``/loop-restart``.
    Needs only Redis, so ``loopbot cancel`` works without GitHub credentials.
    """
    store = Store(redis)
    record = store.get(key)
    if record is None:
        return "no loop"
    if not record.active:
        return f"already {record.status.value}"
    store.request_cancel(key, reason.value)

    def mark(r: LoopRecord) -> None:
        if r.status in ACTIVE:
            r.status = Status.CANCELLED
            r.reason = reason.value
            r.detail = f"by {actor}"
            r.phase = "cancelled"

    store.update(key, mark)
    store.event(key, "loop_cancelled", reason=reason.value, actor=actor)
    job_id = record.id.job_id
    try:
        job = fetch_job(job_id, redis)
        status = job.get_status(refresh=True)
        if status == JobStatus.STARTED:
            send_stop_job_command(redis, job_id)
            # The stopped work horse cannot release its lease; a restart must not wait
            # for it to lapse. A holder that is somehow still alive sees the cancel flag.
            store.force_release_lease(key)
        elif status in PENDING:
            job.cancel()
    except (NoSuchJobError, InvalidJobOperation):
        pass
    return "cancelled"


def _inactive(rt: Runtime, gh: Installation, cmd: IssueInactive) -> str:
    if cmd.reason == "unlabeled":
        text = gh.file(cmd.repo, repo_config.CONFIG_PATH)
        if cmd.label != repo_config.ready_label(text):
            return "not the ready label"
    record = rt.store.get(cmd.loop.key)
    if record is None or not record.active:
        return "no active loop"
    if cmd.reason == "closed" and record.pr_number is not None:
        # A pull request exists: stop whatever runs and refuse it, with a comment, unless
        # the close came from our own squash merge ("Closes #N").
        from jobs.merge_gate import refuse_closed

        return refuse_closed(rt, gh, cmd.loop.key, cmd.actor)
    return cancel_loop(rt.redis, cmd.loop.key, Reason.ISSUE_INACTIVE, cmd.actor)


def _edited(rt: Runtime, gh: Installation, cmd: IssueEdited) -> str:
    """Frozen intake: a writer's edit is the new approved text; anyone else's stops the loop."""
    key = cmd.loop.key
    record = rt.store.get(key)
    if record is None or record.status == Status.COMPLETED:
        return "no loop"
    if intake_hash(cmd.title, cmd.body) == record.approved_sha256:
        return "text unchanged"
    if not cmd.by_bot and gh.can_write(cmd.repo, cmd.actor):
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
        config = repo_config.parse(
            gh.file(cmd.repo, repo_config.CONFIG_PATH), repo_config.Ceilings.of(rt.settings)
        )
        comment = intake.reapproved_comment(cmd.actor)
        gh.upsert_comment(cmd.repo, cmd.issue, intake.COMMENT_KEY, comment)
        return "edit approved; " + start_loop(
            rt, cmd.repo, cmd.issue, cmd.installation_id, cmd.actor, config, restart=True
        )
    if not record.active:
        return "edit by a non-writer; no active loop"
    rt.store.event(key, "intake_edited", actor=cmd.actor)
    result = cancel_loop(rt.redis, key, Reason.ISSUE_EDITED, cmd.actor)
    label = repo_config.ready_label(gh.file(cmd.repo, repo_config.CONFIG_PATH))
    gh.upsert_comment(
        cmd.repo, cmd.issue, intake.COMMENT_KEY, intake.stopped_comment(cmd.actor, label)
    )
    return result


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
    if record is None or record.status == Status.COMPLETED:
        return "no loop to continue"
    feedback = {"from": cmd.actor, "body": cmd.body, "pull": cmd.pull}
    rt.store.push_feedback(key, feedback)
    rt.store.event(key, "human_feedback", actor=cmd.actor, pull=cmd.pull)
    if record.active and rt.store.lease_holder(key):
        return "queued for the running loop"
    cfg = repo_config.parse(
        gh.file(cmd.repo, repo_config.CONFIG_PATH), repo_config.Ceilings.of(rt.settings)
    )
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
    elif record.status == Status.COMPLETED:
        problem = "this loop completed; its findings are history"
    elif not flog.is_id(fid):
        problem = "name a finding by its id, as in `/loop-dismiss F3 <why it does not apply>`"
    if record is None or problem:
        reply(f"⚠️ @{cmd.actor}: nothing was dismissed: {problem}.")
        return "dismiss refused: " + problem
    head = gh.pull(cmd.repo, record.pr_number).head_sha if record.pr_number else ""
    config = repo_config.parse(
        gh.file(cmd.repo, repo_config.CONFIG_PATH), repo_config.Ceilings.of(rt.settings)
    )

    def apply(r: LoopRecord) -> None:
        r.finding_log = flog.dismiss(
            r.finding_log, fid, by=cmd.actor, reason=cmd.reason, sha=head, at=time.time()
        )
        # The last review's findings, as the loop's next prompt and the gate read them.
        r.findings = [x for x in r.findings if x.get("id") != fid]

    with rt.store.lock(key):  # the decision to go to the gate, against a concurrent start
        try:
            updated = rt.store.update(key, apply)
        except ValueError as exc:
            reply(f"⚠️ @{cmd.actor}: nothing was dismissed: {exc}.")
            return f"dismiss refused: {exc}"
        entry = next(e for e in updated.finding_log if e["id"] == fid)
        go = config.merge.enabled and gate_after_dismissal(
            status=updated.status,
            reason=updated.reason,
            severity=str(entry["severity"]),
            log=updated.finding_log,
            head=head,
            reviewed_sha=updated.reviewed_sha,
            verdicts=updated.verdicts,
        )
        rt.store.event(
            key,
            "finding_dismissed",
            id=fid,
            severity=entry["severity"],
            actor=cmd.actor,
            reason=cmd.reason,
            sha=head,
            unblocked=go,
        )
        if go:
            rt.store.update(key, lambda r: _to_gate(r, head))
            enqueue_gate(rt.redis, cmd.repo, issue)
    standing = [str(e["id"]) for e in flog.blocking(updated.finding_log)]
    then = (
        "No sev1 finding stands on this head: loopbot goes on to the merge gate."
        if go
        else f"Still blocking the merge: {', '.join(standing)}."
        if standing
        else "It no longer counts, and later reviews keep it dismissed."
    )
    reply(
        f"@{cmd.actor} dismissed **{fid}** ({entry['severity']}, {entry['title']}) on "
        f"{code_span(head[:10] or 'no head')}: {cmd.reason}\n\n{then}"
    )
    return f"dismissed {fid}" + ("; merge gate queued" if go else "")


def _to_gate(r: LoopRecord, head: str) -> None:
    # The critic's verdict on this head stays as it was: the gate reads the dismissal
    # from the finding log and its receipt names the writer who overrode the critic. It
    # still re-reads the issue, the checks and mergeability before merging.
    r.status, r.phase, r.reason, r.detail = Status.MERGING, "merging", "", ""


def _checks(rt: Runtime, cmd: ChecksCompleted) -> str:
    record = rt.store.get(cmd.loop.key)
    if record is None or record.status != Status.MERGING:
        return "no loop waiting for checks"
    if record.head_sha and record.head_sha != cmd.head_sha:
        return "checks for another head"
    enqueue_gate(rt.redis, record.repo, record.issue)
    return "gate woken"
