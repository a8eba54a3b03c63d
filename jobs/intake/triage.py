"""Readiness triage (I/O): one small structured call before the first turn, and the two
commands that answer it, ``/loop-accept-spec`` and ``/loop-split``.

The rules (schema, parsing, verdicts, what a command may do) are in
``bot/core/rules/triage.py``. Triage never blocks a loop by accident: when the call fails
for good, or its answer does not validate (it is not asked again), the loop codes as if
triage were off (fail open) and records a ``triage_failed`` event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic

from bot.core import repo_config
from bot.core.commands import ControlCommand
from bot.core.record import LoopRecord, Reason, Usage, approve, intake_hash
from bot.core.rules import intake
from bot.core.rules import triage as rules
from bot.core.text import messages
from bot.io.attachments import Attachments
from bot.io.github.client import Installation
from bot.io.github.issues import IssueInfo
from bot.io.logs import get_logger
from bot.io.store import Store
from jobs import precall
from jobs.intake import structured
from jobs.models import UnknownModel
from jobs.runtime import Runtime

log = get_logger("loopbot.triage")

COMMENT_KEY = "triage"  # the proposal on the issue, edited in place when triaged again
SPEC_KEY = "spec"  # the marker of the criteria /loop-accept-spec appends to the issue
SPLIT_KEY = "split"  # the checklist of the sub-issues /loop-split created
# One call, never asked again (``judge``): structured outputs hold the answer to the
# schema, so one that breaks it comes from a model (or a stand-in) not following the
# format, and a second call would cost more for advice the loop goes on without.
MAX_TOKENS = 2048  # of the answer: a verdict and a short proposal


# The restart that follows an accepted spec: ``jobs.dispatch.start_loop``, passed in by
# dispatch (which imports this module, so this module cannot import it).
Starter = Callable[..., str]


@dataclass(frozen=True)
class Judged:
    """What the triage call gave: a result, or None and why (``error``)."""

    result: rules.Triage | None
    model: str
    cost_usd: float
    error: str = ""


@dataclass(frozen=True)
class Stop:
    """Triage says: do not code. The loop ends refused for ``reason``."""

    reason: Reason
    detail: str


# -- before the first turn ----------------------------------------------------------------------


def before_coding(
    rt: Runtime,
    gh: Installation,
    store: Store,
    record: LoopRecord,
    config: repo_config.RepoConfig,
    spend: precall.Gate | None = None,
) -> Stop | None:
    """Triage the approved text when it is due (``rules.due``); None: go on and code.

    Not ready: the proposal is commented on the issue, the ``needs_spec`` label added,
    and the loop stops. The same approved text is never asked about twice: a restart
    with it stands by the verdict already given (without a call), until a writer edits
    the issue or accepts the proposal."""
    if not config.triage.enabled or record.total_turns > 0:
        return None
    issue = gh.issue(record.repo, record.issue)
    title, body = intake.approved_text(record, issue.title, issue.body)
    sha = record.approved_sha256 or intake_hash(title, body)
    key = record.key
    if not rules.due(record.triage, sha, enabled=True, turns=record.total_turns):
        known = rules.loaded(record.triage)
        if known is None or known.ready or record.triage.get("accepted_by"):
            return None
        if made := rules.created(record.triage):
            # Split already: its sub-issues carry the work. The proposal and the label
            # are not put back on the parent.
            links = ", ".join(str(c.get("url") or f"#{c.get('number')}") for c in made.values())
            store.event(key, "triage", verdict=known.verdict, cost_usd=0.0, again=True, split=True)
            return Stop(
                Reason.TOO_LARGE,
                f"this issue was split into {len(made)} sub-issues ({links}); "
                "add the ready label to those",
            )
        store.event(key, "triage", verdict=known.verdict, cost_usd=0.0, again=True)
        return _not_ready(gh, record, config, issue, known, float(record.triage["cost_usd"]))
    earlier = rules.loaded(record.triage)  # a proposal on the issue this triage replaces
    store.set_fields(key, phase="triage")  # the dashboard and `loopbot status` say so
    judged = judge(rt, store, record, config, title, body, spend=spend)
    if judged.result is None:
        log.warning("triage.failed", loop=key, error=judged.error)
        store.set_fields(key, triage=rules.failed(sha, judged.error, cost_usd=judged.cost_usd))
        store.event(key, "triage_failed", error=judged.error, cost_usd=round(judged.cost_usd, 6))
        _superseded(gh, record, config, issue, earlier, judged.cost_usd, failed=True)
        return None
    result = judged.result
    store.set_fields(
        key, triage=rules.stored(result, sha, model=judged.model, cost_usd=judged.cost_usd)
    )
    store.event(
        key,
        "triage",
        verdict=result.verdict,
        model=judged.model,
        cost_usd=round(judged.cost_usd, 6),
        criteria=len(result.criteria),
        sub_issues=len(result.sub_issues),
    )
    if result.ready:
        _superseded(gh, record, config, issue, earlier, judged.cost_usd, failed=False)
        return None
    return _not_ready(gh, record, config, issue, result, judged.cost_usd)


def _superseded(
    gh: Installation,
    record: LoopRecord,
    config: repo_config.RepoConfig,
    issue: IssueInfo,
    earlier: rules.Triage | None,
    cost_usd: float,
    *,
    failed: bool,
) -> None:
    """The loop codes a text an earlier triage found not ready: that proposal's label and
    its "did not start coding" comment no longer hold."""
    if config.labels.needs_spec in issue.labels:  # an earlier text needed one; not now
        gh.remove_label(record.repo, record.issue, config.labels.needs_spec)
    if earlier is not None and not earlier.ready:
        text = messages.triage_superseded(cost_usd, failed=failed)
        gh.upsert_comment(record.repo, record.issue, COMMENT_KEY, text)


def _not_ready(
    gh: Installation,
    record: LoopRecord,
    config: repo_config.RepoConfig,
    issue: IssueInfo,
    result: rules.Triage,
    cost_usd: float,
) -> Stop:
    comment = messages.triage_comment(
        result.verdict,
        result.reasons,
        result.criteria,
        [(s.title, s.body) for s in result.sub_issues],
        cost_usd=cost_usd,
        ready_label=config.labels.ready,
        needs_spec_label=config.labels.needs_spec,
    )
    gh.upsert_comment(record.repo, record.issue, COMMENT_KEY, comment)
    if config.labels.needs_spec not in issue.labels:
        gh.add_labels(record.repo, record.issue, [config.labels.needs_spec])
    if result.verdict == "too_large":
        return Stop(
            Reason.TOO_LARGE,
            f"readiness triage: the issue bundles {len(result.sub_issues)} changes; "
            "see the proposed sub-issues (`/loop-split` creates them)",
        )
    return Stop(
        Reason.NEEDS_SPEC,
        "readiness triage: the issue states no checkable outcome; see the proposed "
        "acceptance criteria (`/loop-accept-spec` takes them)",
    )


def judge(
    rt: Runtime,
    store: Store,
    record: LoopRecord,
    config: repo_config.RepoConfig,
    title: str,
    body: str,
    spend: precall.Gate | None = None,
) -> Judged:
    """The one small structured call. Its usage is recorded under the role ``triage``
    and counts against the issue's budget, which is checked before the call. Never
    raises for the model: a failure, or an answer that does not validate (never asked
    again: see the note on top), is a ``Judged`` without a result."""
    model = config.critic_model(rt.ceilings)
    try:
        spec = rt.models.spec(model)
    except UnknownModel as exc:
        return Judged(None, model, 0.0, f"unknown model: {exc}"[:300])

    def invalid(attempt: int, problem: str) -> None:
        store.event(record.key, "triage_invalid", attempt=attempt, problem=problem)

    # The approved issue's attachments: a screenshot may be the whole statement of it.
    files = Attachments(rt.settings.data_dir, rt.settings.api_url)
    blocks, attached = files.for_prompt(record.key, files.approved(record))
    prompt = rules.prompt(record.repo, record.issue, title, body)
    try:
        answer = structured.ask(
            rt,
            model=model,
            max_tokens=min(MAX_TOKENS, spec.max_output),
            system=rules.SYSTEM,
            prompt=f"{prompt}\n\n{attached}" if attached else prompt,
            blocks=blocks,
            schema=rules.output_schema(),
            parse=rules.parse,
            record=lambda: store.get(record.key),
            charge=_charger(store, record.key),
            on_invalid=invalid,  # one attempt: never asked again (see the note on top)
            spend=spend,
        )
    except precall.OverBudget as exc:
        return Judged(None, model, 0.0, f"not asked: {exc}"[:300])
    except anthropic.APIError as exc:  # retried already, where a retry could help
        return Judged(None, model, 0.0, f"{type(exc).__name__}: {exc}"[:300])
    if answer.value is None:
        why = f"the answer did not validate: {answer.problem}"
        return Judged(None, answer.model, answer.cost, why)
    return Judged(answer.value, answer.model, answer.cost)


def _charger(store: Store, key: str) -> precall.Charge:
    def charge(name: str, used: Usage) -> None:
        store.update(key, _add_usage(name, used))

    return charge


def _add_usage(model: str, used: Usage) -> Callable[[LoopRecord], None]:
    def apply(r: LoopRecord) -> None:
        r.record_usage(model, "triage", used)

    return apply


# -- the writers' answers -----------------------------------------------------------------------


def command(
    rt: Runtime,
    gh: Installation,
    cmd: ControlCommand,
    record: LoopRecord | None,
    *,
    start: Starter,
) -> str:
    """``/loop-accept-spec`` or ``/loop-split`` by a writer (``jobs.dispatch._control``
    checked write access and reacted). Anything that cannot be done is answered in a
    reply that says why, and changes nothing."""
    word = f"/loop-{cmd.action}"

    def refuse(why: str) -> str:
        reply = messages.triage_refused(cmd.actor, word, why)
        gh.upsert_comment(cmd.repo, cmd.issue, f"reply:{cmd.comment_id}", reply)
        return f"{cmd.action} refused: {why}"

    if record is None:
        return refuse("there is no loop for this issue")
    try:
        config = rt.config(gh, cmd.repo)
    except repo_config.ConfigError as exc:
        reply = messages.config_error(exc.problems, cmd.actor)
        gh.upsert_comment(cmd.repo, cmd.issue, f"reply:{cmd.comment_id}", reply)
        return "bad config"
    if cmd.action == "accept-spec":
        return _accept(rt, gh, cmd, config, refuse, start)
    return _split(rt, gh, cmd, config, refuse)


def _accept(
    rt: Runtime,
    gh: Installation,
    cmd: ControlCommand,
    config: repo_config.RepoConfig,
    refuse: Callable[[str], str],
    start: Starter,
) -> str:
    """Append the proposed criteria to the issue under the writer's name, approve that
    text as theirs, mark the triage accepted (it is not asked again), drop the
    ``needs_spec`` label and start the loop again."""
    key, store = cmd.loop.key, rt.store
    with store.lock(key):
        record = store.get(key)
        assert record is not None  # records are never deleted
        decision = rules.may_accept(record.triage, record.approved_sha256, record.active)
        if isinstance(decision, rules.Refusal):
            return refuse(decision.why)
        issue = gh.issue(cmd.repo, cmd.issue)
        if intake.edited(record, issue.title, issue.body):
            return refuse(
                "the issue was edited since it was approved; remove and add the "
                f"`{config.labels.ready}` label again to have the new text triaged"
            )
        whole = decision.verdict == "too_large"  # worked as one, as it is: nothing added
        section = messages.spec_section(decision.criteria, cmd.actor)
        # The marker names the text triaged: one the author planted in the body (hidden on
        # GitHub) or left by an earlier acceptance cannot stand for this one, which would
        # append nothing and code the vague text. The addition goes after the body just
        # checked (``base``), and the title approved is the one checked: an edit landing
        # meanwhile is not approved as the writer's (it stops the loop as any edit does).
        spec_key = f"{SPEC_KEY}:{record.approved_sha256[:16]}"
        if whole:
            now = issue
        else:
            written = gh.append_to_issue(cmd.repo, cmd.issue, spec_key, section, base=issue)
            now = written.model_copy(update={"title": issue.title})

        def accept(r: LoopRecord) -> None:
            # The text with the criteria is the writer's approved text from now on; the
            # triage covers it, so the restart below does not ask again.
            approve(r, now.title, now.body, cmd.actor)
            r.triage = {
                **r.triage,
                "sha256": r.approved_sha256,
                "accepted_by": cmd.actor,
                "accepted_at": time.time(),
            }

        store.update(key, accept)
        store.event(
            key,
            "spec_accepted",
            actor=cmd.actor,
            criteria=0 if whole else len(decision.criteria),
            whole=whole,
        )
    gh.remove_label(cmd.repo, cmd.issue, config.labels.needs_spec)
    result = start(
        rt,
        cmd.repo,
        cmd.issue,
        cmd.installation_id,
        cmd.actor,
        config,
        restart=True,
        approved=now,
        note=(
            f"@{cmd.actor} asked for this issue to be worked as one."
            if whole
            else f"@{cmd.actor} accepted acceptance criteria; they are at the end of the issue."
        ),
    )
    reply = messages.spec_accepted(cmd.actor, len(decision.criteria), result, whole=whole)
    gh.upsert_comment(cmd.repo, cmd.issue, f"reply:{cmd.comment_id}", reply)
    return f"spec accepted; {result}"


def _split(
    rt: Runtime,
    gh: Installation,
    cmd: ControlCommand,
    config: repo_config.RepoConfig,
    refuse: Callable[[str], str],
) -> str:
    """Create the proposed sub-issues (each once: the record keeps those created, one by
    one, and a retried create finds its marker), comment the checklist linking them, and
    end the issue's loop: its ready and ``needs_spec`` labels come off."""
    key, store = cmd.loop.key, rt.store
    with store.lock(key, timeout=120):  # one split at a time: a second waits, then sees it
        record = store.get(key)
        assert record is not None
        decision = rules.may_split(record.triage, record.approved_sha256)
        if isinstance(decision, rules.Refusal):
            return refuse(decision.why)
        if record.active:
            return refuse("a loop is running on this issue")
        done = rules.created(record.triage)
        again = len(done) >= len(decision.sub_issues)
        # A split that began before and was cut short (its worker killed after GitHub made
        # an issue, before the record kept it) may have left sub-issues the record does not
        # know: those are looked for by their marker before any is made again.
        resumed = bool(record.triage.get("split_started"))
        if not again and not resumed:
            store.update(key, _split_started)
        parent = gh.issue(cmd.repo, cmd.issue).html_url
        text_sha = str(record.triage.get("sha256") or "")
        for i, sub in enumerate(decision.sub_issues):
            if i in done:
                continue
            tag = rules.split_marker(cmd.issue, i, text_sha)
            made = (gh.find_issue(cmd.repo, tag) if resumed else None) or gh.create_issue(
                cmd.repo, tag, sub.title, messages.sub_issue_body(sub.body, parent, cmd.actor)
            )
            entry = {"index": i, "number": made.number, "url": made.html_url, "title": made.title}
            store.update(key, _created(entry))
            done[i] = entry
        links = [(str(done[i]["title"]), str(done[i]["url"])) for i in sorted(done)]
        reported = bool(record.triage.get("split_reported"))
        if not reported:
            store.event(key, "split", actor=cmd.actor, issues=[done[i]["number"] for i in done])
            detail = f"split into {len(links)} sub-issues by {cmd.actor} (`/loop-split`)"
            store.update(key, _split_reported(detail))
    # The ending is written on every run, each step safe to repeat: a retried job, or a
    # writer's second /loop-split, finishes what a run that failed half-way left undone.
    gh.upsert_comment(
        cmd.repo, cmd.issue, SPLIT_KEY, messages.split_done(cmd.actor, links, again=False)
    )
    gh.remove_label(cmd.repo, cmd.issue, config.labels.needs_spec)
    gh.remove_label(cmd.repo, cmd.issue, config.labels.ready)
    if again and reported:
        reply = messages.split_done(cmd.actor, links, again=True)
        gh.upsert_comment(cmd.repo, cmd.issue, f"reply:{cmd.comment_id}", reply)
        return "already split"
    return f"split into {len(links)} sub-issues"


def _split_reported(detail: str) -> Callable[[LoopRecord], None]:
    def apply(r: LoopRecord) -> None:
        r.triage = {**r.triage, "split_reported": True}
        r.detail = detail

    return apply


def _split_started(r: LoopRecord) -> None:
    r.triage = {**r.triage, "split_started": True}


def _created(entry: dict[str, Any]) -> Callable[[LoopRecord], None]:
    def apply(r: LoopRecord) -> None:
        r.triage = {**r.triage, "created": [*r.triage.get("created", []), entry]}

    return apply
