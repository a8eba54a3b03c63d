"""The loop record and its statuses: plain data and pure rules, no I/O."""

from __future__ import annotations

import hashlib
import json
import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bot.core.ids import LoopId


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    REVIEWING = "reviewing"
    MERGING = "merging"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALLED = "stalled"
    REFUSED = "refused"


ACTIVE = frozenset({Status.QUEUED, Status.RUNNING, Status.REVIEWING, Status.MERGING})
RESTARTABLE = frozenset({Status.FAILED, Status.CANCELLED, Status.STALLED, Status.REFUSED})
TERMINAL = RESTARTABLE | {Status.COMPLETED}


class Reason(StrEnum):
    MAX_TURNS = "max_turns_reached"
    ISSUE_INACTIVE = "issue_inactive"
    CANCELLED = "cancelled"
    STALL_TIMEOUT = "stall_timeout"
    BUDGET = "budget_exhausted"
    ERRORS = "error_max_retries"
    CRITIC_ROUNDS = "critic_rounds_exhausted"
    CRITIC_ERROR = "critic_error"
    GATE_ERROR = "gate_error"
    CHECKS_FAILED = "checks_failed"
    CHECKS_TIMEOUT = "checks_timeout"
    NOT_MERGEABLE = "not_mergeable"
    ISSUE_CLOSED = "issue_closed"
    PULL_CLOSED = "pull_closed"
    BAD_CONFIG = "bad_config"
    NEEDS_HUMAN = "needs_human"
    MERGED = "merged"
    PR_OPENED = "pr_opened"
    NO_CHANGES = "no_changes"
    PUSH_REJECTED = "push_rejected"
    # GitHub refused a push (a ruleset, push protection or a large file twice, the App's
    # permissions): its words on the issue, with what the maintainer can do.
    PUSH_REFUSED = "push_refused"
    RESOURCE_LIMIT = "resource_limit"
    ISSUE_EDITED = "issue_edited"  # title or body changed after a writer approved it
    MODEL_REFUSED = "model_refused"  # the model declined (stop_reason refusal)
    # Metric loops (jobs/loop/metric.py): phase 0 failed on the base; discards in a row
    # reached max_consecutive_discards with nothing kept; max_iterations ran with nothing
    # kept; verify fails on the kept changes, so no pull request.
    METRIC_PRECONDITIONS = "metric_preconditions"
    METRIC_STUCK = "metric_stuck"
    NO_IMPROVEMENT = "no_improvement"
    METRIC_VERIFY = "metric_verify_failed"
    # Readiness triage (bot/core/rules/triage.py) found no checkable outcome, or an issue
    # that should be several: a proposal is on the issue, nothing was coded.
    NEEDS_SPEC = "needs_spec"
    TOO_LARGE = "too_large"


class Usage(BaseModel):
    """Tokens and cost for one (model, role) pair."""

    model_config = ConfigDict(extra="ignore")

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    messages: int = 0
    cost_usd: float = 0.0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.messages += other.messages
        self.cost_usd += other.cost_usd


class Waiting(BaseModel):
    """A loop in line for a slot (``bot/core/rules/pace.py``): what its status comment
    and the dashboard show, as the last admission pass placed it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    place: int  # 1-based in its repository's line; above PLACES_SHOWN it says "more than"
    running: int  # the loops holding a slot in the scope that holds it back
    cap: int  # that scope's limit: the repository's max_parallel or the operator's
    scope: str  # "repository" or "operator"
    priority: bool = False  # it carries the priority label
    posted: bool = False  # the issue's status comment says so already


class LoopRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    repo: str
    issue: int
    installation_id: int
    # The record format (bot/core/formats.py); release 0.1.0 wrote none, which is 1.
    format: int = 1
    status: Status = Status.QUEUED
    phase: str = "queued"
    # Queued by a worker that shut down cleanly (jobs/drain.py): any live worker resumes
    # it at once, and it does not count as a lost worker.
    handed_over: bool = False
    turn: int = 0
    max_turns: int = 20
    branch: str = ""
    pr_number: int | None = None
    pr_url: str = ""
    head_sha: str = ""
    reviewed_sha: str = ""
    # Whether the critic's latest round on ``reviewed_sha`` read its whole diff (not cut
    # at the critic's limit). False until known: a dismissal then asks a new round.
    reviewed_whole: bool = False
    critic_round: int = 0
    sev1_rounds: dict[str, int] = Field(default_factory=dict)  # finding fingerprint -> rounds
    verdict: str = ""
    findings: list[dict[str, Any]] = Field(default_factory=list)
    last_verify: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, Usage] = Field(default_factory=dict)  # "model/role" -> usage
    cost_usd: float = 0.0
    reason: str = ""
    detail: str = ""
    started_by: str = ""
    status_comment_id: int | None = None
    job_id: str = ""
    error_count: int = 0
    auto_resumes: int = 0
    restarts: int = 0
    check_fixes: int = 0  # continuation turns spent on failing checks and conflicts
    sync_base: bool = False  # merge the default branch in before the next turn
    # GitHub's push refusals so far, by kind (bot/core/rules/push_refusal.py).
    push_refusals: dict[str, int] = Field(default_factory=dict)
    # The agent's changes under .github/workflows/ the App may not push: path -> patch,
    # shown in the pull request for a person to apply.
    workflow_patches: dict[str, str] = Field(default_factory=dict)
    gate_since: float = 0.0  # when the merge gate first waited for checks
    # When the gate first waited for people (approvals, code owners, threads) and whom
    # it asked to review: asked once, not at every wake-up.
    review_since: float = 0.0
    review_asked: list[str] = Field(default_factory=list)
    # The wait for people the head's check run shows, as "<head sha> <text>" ("" when it
    # shows none): written when it changes, so a wait is shown once and taken back once.
    wait_shown: str = ""
    # A base that requires a merge queue (``merge_queue``: known from its rules, or from
    # the merge endpoint's refusal): the head loopbot enqueued, how many removals from
    # the queue GitHub's timeline counted then (a later one is the queue letting go of
    # it), and the last merge group's commit (``merge_group`` webhook) whose checks say
    # what failed.
    merge_queue: bool = False
    queue_head: str = ""
    queue_removals: int = 0
    queue_group: str = ""
    # The head that wait is about: a push (a fix, the base merged in) asks people about a
    # new head, and the waiting limit counts from then.
    review_head: str = ""
    merge_sha: str = ""
    # The head that merged: the branch is deleted only while it is still there (a push
    # after the merge is someone's work). "" on records from before it was kept.
    merged_head: str = ""
    # The merged branch's deletion was tried (deleted, gone, or kept and said why): a
    # retry of the gate's tidy-up does not do it, nor say it, twice.
    branch_tidied: bool = False
    resume_note: str = ""  # why the loop continues: critic findings, a human review, checks
    verify_command: str = ""
    # Frozen intake: the issue text a writer approved (by the ready label, /loop-restart
    # or their own edit). The agent and the critic read this, never the live issue.
    approved_title: str = ""
    approved_body: str = ""
    approved_sha256: str = ""  # intake_hash(approved_title, approved_body); "" = none yet
    approved_by: str = ""
    # The approved text's attachments (bot/core/attachments.py ``Fetched``): what each
    # file's bytes hash to, what was sent and what was skipped, and which approval it is of.
    attachments: dict[str, Any] = Field(default_factory=dict)
    # The agent backend a ``loop:agent-<name>`` label picked when a writer approved the
    # issue (bot/core/repo_config.py, ``label_backend``); "" = loop.yml's.
    approved_backend: str = ""
    # A scheduled loop's approval (docs/repositories.md#scheduled-loops): no person
    # approved its text, the default branch's commit that held the task file did. Its task
    # file's path, and its ``loop:`` settings (repo_config.TaskSettings, those set), in place
    # of loop.yml's.
    approved_commit: str = ""
    schedule: str = ""
    task_loop: dict[str, Any] = Field(default_factory=dict)
    # Evidence from the base: verify on the base commit before any change (sha, passed,
    # exit_code, tail, seconds, cached); turns in a row that changed nothing; the test
    # files the pull request adds or changes.
    base_sha: str = ""
    base_verify: dict[str, Any] = Field(default_factory=dict)
    idle_turns: int = 0
    tests_changed: list[str] = Field(default_factory=list)
    # Held-out verify on the last verified head (bot/core/evidence/held_out.py): whether
    # the change made verify pass by changing the tests; and the turns the agent was given
    # to fix the code instead (one, then a person decides).
    test_evidence: dict[str, Any] = Field(default_factory=dict)
    tamper_turns: int = 0
    # Findings that persist across review rounds (bot/core/rules/pull/findings.py), and the verdict
    # on each reviewed head: a sha in ``verdicts`` is never reviewed again.
    finding_log: list[dict[str, Any]] = Field(default_factory=list)
    next_finding: int = 1
    verdicts: dict[str, str] = Field(default_factory=dict)
    # The change each reviewed head makes (bot/core/rules/pull/same_change.py): a head whose
    # change is one already approved (the default branch merged in) is not asked again.
    patches: dict[str, str] = Field(default_factory=dict)
    # One budget over the issue's whole life (bot/core/rules/loop/budget.py): never reset
    # by a restart.
    total_turns: int = 0
    active_seconds: float = 0.0  # banked by the store at each write of an active record
    budget_limits: dict[str, float] = Field(default_factory=dict)  # name -> limit in force
    receipt_comment_id: int | None = None  # the merge gate's receipt on the pull request
    # The receipt of a merge under way, posted once with its merge commit (one write, not
    # two); kept here first, so a gate run that finds the merge done still posts it.
    receipt_text: str = ""
    # The receipt of the merge, shown in the status comment's last edit (not a comment of
    # its own: the two said the same thing, issue 43). A merge queue's receipt is on the
    # pull request already (``receipt_comment_id``) and is completed there instead.
    merge_receipt: str = ""
    # The harness merged the default branch in without conflicts: verify runs on the
    # merged head before any turn, and the pull request moves on if it passes.
    base_clean: bool = False
    # The last such catch-up that verify passed on with no turn: {"from": the head it
    # merged the base into, "to": the merged head}. Only that head's change can be the
    # reviewed one's (bot/core/rules/pull/same_change.py): a diff's text does not show every
    # change (a binary file's bytes), so no other head is ever taken for one reviewed.
    catch_up: dict[str, str] = Field(default_factory=dict)
    # Such a catch-up's own check run ("loopbot": verify passed on the merged head), not
    # written by the loop when no rule requires it by name: the critic writes it if it
    # reviews that head again; when the approval carries, the critic's one check run
    # there says verify passed on it (issue 43: one write where two said the same).
    # {"sha", "title", "summary"}; empty when none waits.
    loop_check_waiting: dict[str, str] = Field(default_factory=dict)
    # What the agent's conversation has been given, each once (bot/core/rules/loop/discussion.py,
    # bot/core/rules/loop/nested_guidance.py): the ids of the issue's comments (maintainers'
    # comments shown, or left out for room) and the nested AGENTS.md paths.
    comments_delivered: list[int] = Field(default_factory=list)
    guidance_delivered: list[str] = Field(default_factory=list)
    # The model that last wrote to the stored conversation: thinking blocks are tied to it,
    # so a turn on another model (a restart after loop.yml changed) drops them first.
    conversation_model: str = ""
    # In line for a slot (max_parallel, LOOPBOT_MAX_PARALLEL): queued, its job not yet
    # enqueued; None once admitted (or never held back).
    waiting: Waiting | None = None
    # -- metric loops (label labels.optimize; jobs/loop/metric.py, bot/core/rules/loop/metric.py) --
    kind: str = "code"  # "code": a fix loop (labels.ready); "metric": a metric loop
    # The agent backend its last run coded with (loop.yml's, or a writer's label): the
    # report and the metrics file the agent's usage under it (bot/core/spend/report.py).
    backend: str = ""
    # The worst case of the call a spend cap last refused (jobs/spend.py), when a cap held
    # the loop back or stopped it; 0 otherwise. With LOOPBOT_SPEND_RESUME_ON_ROLLOVER the
    # reconciler restarts the loop once every cap has that much room again.
    spend_need_usd: float = 0.0
    metric_results: list[dict[str, Any]] = Field(default_factory=list)  # metric.Row dicts
    metric_head: str = ""  # the branch head after the last decided iteration (or the base)
    metric_since: int = 0  # the iteration after which the current allowance began
    metric_restarts: int = 0  # ``restarts`` as the metric loop last saw it
    metric_max_iterations: int = 0  # as loop.yml set it when the allowance began
    metric_command: str = ""  # loop.yml's metric.command and direction as measured
    metric_direction: str = ""
    metric_done: bool = False  # iterations over and a pull request opened: fix turns follow
    # -- end of metric loop fields --
    # -- triage ---------------------------------------------------------------------------
    # Readiness triage of the approved text (bot/core/rules/triage.py, jobs/intake/triage.py):
    # its verdict and proposal, the ``approved_sha256`` it judged, a writer's acceptance,
    # the sub-issues /loop-split created. {} = not triaged.
    triage: dict[str, Any] = Field(default_factory=dict)
    # -- end triage -----------------------------------------------------------------------
    # -- milestones (bot/core/rules/loop/sections.py, jobs/loop/job.py) ---------------------------
    # The approved issue's sections, each {title, text, done, preticked, audit_rounds,
    # start_sha, and once audited audited_sha (the head its last audit judged),
    # dirty_sha (the head whose blocking findings stand), dirty_sev1 (they were sev1s)
    # and round_base (audit_rounds at a person's restart)}; [] for a loop worked as one
    # piece. ``section_index`` is the section being worked (a restart resumes there);
    # ``sections_sha`` the approved text they were read from (a writer's edit re-reads
    # them). A section audit's findings are in ``finding_log``, with their ``section``
    # (0-based); ``section_findings`` is where releases before that kept them (read once
    # into the log, then emptied).
    sections: list[dict[str, Any]] = Field(default_factory=list)
    section_index: int = 0
    sections_sha: str = ""
    sections_source: str = ""  # "issue" or "planner" (milestones: auto)
    section_findings: list[dict[str, Any]] = Field(default_factory=list)
    # post_action (loop.yml): one best-effort turn after a clean final audit, run once:
    # {status: pending|kept|dropped|none|failed, base: the reviewed sha it ran on, sha: its
    # commit (kept), summary, why (dropped)}. The gate accepts exactly that commit on top
    # of the reviewed sha (bot/core/rules/pull/merge.py).
    post_action: dict[str, Any] = Field(default_factory=dict)
    # -- end milestones ------------------------------------------------------------------
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)

    @property
    def id(self) -> LoopId:
        return LoopId(self.repo, self.issue)

    @property
    def key(self) -> str:
        return self.id.key

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def record_usage(self, model: str, role: str, usage: Usage) -> None:
        slot = self.usage.setdefault(f"{model}/{role}", Usage())
        slot.add(usage)
        self.cost_usd = round(sum(u.cost_usd for u in self.usage.values()), 6)
        self.usage = dict(self.usage)  # re-validate on assignment


AGENT_LABEL = "loop:agent-"  # loop:agent-claude-code, loop:agent-opencode, loop:agent-builtin


def label_backend(labels: tuple[str, ...]) -> str:
    """The backend an issue's ``loop:agent-<name>`` label asks for ("" when none; with
    several, all of them, comma-separated, for the loop to refuse by name)."""
    asked = sorted({x[len(AGENT_LABEL) :] for x in labels if x.startswith(AGENT_LABEL)})
    return ",".join(asked)


def intake_hash(title: str, body: str | None) -> str:
    """The hash of an issue's title and body, as approved or as read now."""
    data = json.dumps([title, body or ""], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def approve(
    record: LoopRecord,
    title: str,
    body: str | None,
    actor: str,
    labels: tuple[str, ...] | None = None,
) -> None:
    """Take ``title`` and ``body`` as the text a writer (``actor``) approved, and, when
    the issue's ``labels`` are known (a label or a restart, not an edit), the agent
    backend one of them picks."""
    record.approved_title = title
    record.approved_body = body or ""
    record.approved_sha256 = intake_hash(title, body)
    record.approved_by = actor
    record.approved_commit = ""  # a person's approval; a schedule's sets its commit after
    if labels is not None:
        record.approved_backend = label_backend(labels)


def can_restart(record: LoopRecord, lease_alive: bool) -> tuple[bool, str]:
    """Whether ``/loop-restart`` may resume ``record``, and why not. (Its budget is
    ``bot.core.rules.lifecycle.may_start``'s to check: a restart never refills it.)"""
    if record.status == Status.COMPLETED:
        return False, "this loop completed; it is history and cannot be restarted"
    if record.status not in RESTARTABLE and lease_alive:
        return False, f"this loop is {record.status.value} and its worker is alive"
    # Active with nobody holding the lease is a dead worker: restartable too.
    return True, ""


def should_start(record: LoopRecord | None) -> tuple[bool, str]:
    """Whether the ready label may start a loop, given what the store holds."""
    if record is None:
        return True, ""
    if record.active:
        return False, f"a loop is already {record.status.value} for this issue"
    if record.status == Status.COMPLETED:
        return False, "this issue's loop already completed"
    return True, "restarting"  # re-adding the label resumes it


# The fields a list of loops shows (dashboard, `loopbot status`, metrics): a few hundred
# bytes, where a whole record carries findings and verify output and runs to kilobytes.
SUMMARY_FIELDS = (
    "repo",
    "issue",
    "status",
    "phase",
    "turn",
    "max_turns",
    "cost_usd",
    "pr_number",
    "pr_url",
    "reason",
    "updated_at",
    "branch",
    "critic_round",
    "verdict",
)


# The gate's waits (jobs/review/gate.py), each with what it waits for in ``detail``: the
# status comment, ``/loop-status``, ``loopbot status``, the dashboard and, for people,
# the check run on the head all show the same words.
PEOPLE_PHASE = "awaiting_approval"
WAIT_PHASES = frozenset({PEOPLE_PHASE, "waiting_for_checks", "waiting_to_merge"})
# A loop held back by a spend cap (bot/core/rules/lifecycle.py): queued, its detail says
# which cap.
SPEND_PHASE = "spend_cap"


def waiting_for(record: LoopRecord) -> str:
    """What the loop waits for ("waiting for 1 approving review by a writer"), or ""."""
    if record.active and (record.phase in WAIT_PHASES or record.phase == SPEND_PHASE):
        return record.detail
    return ""


def people_wait(record: LoopRecord) -> str:
    """What the loop waits for from people (approvals, code owners, threads), or ""."""
    return waiting_for(record) if record.phase == PEOPLE_PHASE else ""


def tidy_pending(record: LoopRecord) -> bool:
    """Merged (the loop completed on it), and the gate's tidy-up after the merge not
    finished: its receipt still held on the record (the post failed), or the branch's
    deletion not yet tried (a merge recorded with its head; a merge queue's, whose
    receipt was posted before). The gate's retry, or the reconciler, finishes it."""
    if record.status is not Status.COMPLETED or record.reason != Reason.MERGED:
        return False
    if record.pr_number is None:
        return False
    held = bool(record.receipt_text and record.merge_sha)
    return held or bool(record.merged_head and not record.branch_tidied)


def summarize(record: LoopRecord) -> dict[str, Any]:
    """The record's list view, with token totals per ``model/role`` for the metrics."""
    data = record.model_dump(mode="json", include=set(SUMMARY_FIELDS))
    data["key"] = record.key
    data["waiting_for"] = waiting_for(record)
    # Merged, and the gate's tidy-up after it (the branch, the receipt, the last status)
    # not finished: the reconciler sends the gate again (``jobs.reconciler``).
    data["tidy_pending"] = tidy_pending(record)
    data["tokens"] = {
        slot: [u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens]
        for slot, u in record.usage.items()
    }
    return data
