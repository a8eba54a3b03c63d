"""What loopbot says on GitHub: the text of comments, in one place."""

from __future__ import annotations

import re
from collections.abc import Sequence

from bot.core.record import TERMINAL, LoopRecord, Status, Waiting
from bot.core.rules.loop import budget
from bot.core.rules.loop import metric as metric_rules
from bot.core.rules.pace import PLACES_SHOWN
from bot.core.spend import lines as spend_lines
from bot.core.text import metric as metric_text
from bot.core.text.defuse import JOINER, code_block, code_span, safe_text
from bot.core.text.numbers import duration, plural

__all__ = ["code_block", "code_span", "safe_text"]

_ICONS = {
    Status.QUEUED: "⏳",
    Status.RUNNING: "🔁",
    Status.REVIEWING: "🔎",
    Status.MERGING: "🔀",
    Status.COMPLETED: "✅",
    Status.FAILED: "❌",
    Status.CANCELLED: "⏹️",
    Status.STALLED: "⚠️",
    Status.REFUSED: "🛑",
}


def config_error(problems: list[str], actor: str) -> str:
    items = "\n".join(f"- {p}" for p in problems)
    return (
        f"@{actor} loopbot did not start: `.github/loop.yml` on the default branch "
        "is not valid.\n\n"
        f"{items}\n\nFix the file and add the ready label again."
    )


def no_loop(action: str) -> str:
    return f"There is no loop for this issue, so there is nothing to {action}."


def _cost(r: LoopRecord) -> str:
    return f"${r.cost_usd:.2f}"


def status_line(r: LoopRecord) -> str:
    icon = _ICONS.get(r.status, "")
    parts = [
        f"{icon} **{r.status.value}**",
        f"phase `{r.phase}`",
        _progress(r),
        f"cost {_cost(r)}",
    ]
    if r.reason:
        parts.append(f"reason `{r.reason}`")
    if (where := section_where(r)) and r.active:
        parts.insert(2, where)
    return " · ".join(parts)


def _progress(r: LoopRecord) -> str:
    """How far the loop is: turns, or for a metric loop still iterating, iterations (its
    turns are one per iteration; its fix turns after the pull request count as turns)."""
    if r.kind == "metric" and not r.metric_done and r.metric_max_iterations:
        done = metric_rules.last_iteration(metric_rules.rows_of(r.metric_results))
        return f"iteration {done - r.metric_since} of {r.metric_max_iterations}"
    # Turns are counted over the issue's life, as the timeline counts them; the cap of
    # this run (turns since the loop last went back to coding) is said beside it.
    total = max(r.total_turns, r.turn)
    if total == r.turn:
        return f"turn {total} of {r.max_turns}"
    return f"turn {total} ({r.turn} of {r.max_turns} this round)"


# -- milestones (bot/core/rules/loop/sections.py) --------------------------------------------------


def section_where(r: LoopRecord) -> str:
    """``section 2/3``, or ``final audit`` once every section passed, or ""."""
    if not r.sections:
        return ""
    index = next((i for i, s in enumerate(r.sections) if not s.get("done")), None)
    return "all sections done" if index is None else f"section {index + 1}/{len(r.sections)}"


def section_checklist(r: LoopRecord) -> str:
    """The milestones as a task list: done ones ticked, the current one in bold."""
    if not r.sections:
        return ""
    current = next((i for i, s in enumerate(r.sections) if not s.get("done")), None)
    rows = [f"**Milestones** ({section_where(r)})"]
    for i, s in enumerate(r.sections):
        title = safe_text(" ".join(str(s.get("title", "")).split()))
        mark = "x" if s.get("done") else " "
        note = ""
        if s.get("preticked"):
            note = " (ticked in the issue)"
        elif s.get("done") and s.get("unaudited"):
            note = " — done (not audited: the critic is off)"
        elif s.get("done"):
            rounds = int(s.get("audit_rounds") or 0)
            note = f" — audited ({rounds} round{'s' if rounds != 1 else ''})"
        text = f"{i + 1}. {title}{note}"
        if i == current:
            text = f"**{text}** ← now"
        rows.append(f"- [{mark}] {text}")
    return "\n".join(rows)


# -- end milestones -----------------------------------------------------------------------------


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def place_words(w: Waiting) -> str:
    """Where a waiting loop stands: "2nd in line"."""
    if w.place > PLACES_SHOWN:
        return f"more than {PLACES_SHOWN} loops are ahead of it in line"
    return f"{ordinal(w.place)} in line"


def waiting_line(w: Waiting) -> str:
    """Why a queued loop has not started, and where it stands in line."""
    where = place_words(w)
    loops = "1 loop" if w.running == 1 else f"{w.running} loops"
    if w.scope == "repository":
        held = (
            f"{loops} of this repository {'is' if w.running == 1 else 'are'} running "
            f"(`max_parallel` {w.cap})"
        )
    else:
        held = (
            f"{loops} {'is' if w.running == 1 else 'are'} running across all repositories "
            f"(the operator's `LOOPBOT_MAX_PARALLEL` {w.cap})"
        )
    first = " Priority label: it goes before loops without it." if w.priority else ""
    return f"⏳ Waiting to start: {where}; {held}. It starts when one of them ends.{first}"


def _facts(r: LoopRecord) -> list[str]:
    """The status line and what a reader needs next to it: the place in line of a loop
    that waits, the issue's budget, branch, PR, last verify."""
    lines = [status_line(r)]
    if r.waiting is not None and r.status is Status.QUEUED:
        lines.append(waiting_line(r.waiting))
    if spent := budget.line(r):
        lines.append(spent)
    if r.branch:
        lines.append(f"Branch: `{r.branch}`")
    if r.pr_url:
        lines.append(f"Pull request: {r.pr_url}")
    if r.last_verify:
        v = r.last_verify
        ok = "✅ passed" if v.get("passed") else "❌ failed"
        lines.append(
            f"Latest verify (turn {v.get('total') or v.get('turn')}): {ok}, exit "
            f"{v.get('exit_code')}, {duration(float(v.get('seconds') or 0))}"
        )
    if r.detail:
        # Every line quoted: a detail may hold a code block (GitHub's words on a refused
        # push), which a quote's first line alone would leave outside it.
        lines.append("\n".join(f"> {line}" for line in safe_text(r.detail).split("\n")))
    if section := metric_text.record_section(r):  # a metric loop's results table
        lines.append(section)
    return lines


def status_reply(r: LoopRecord | None) -> str:
    """The answer to ``/loop-status``."""
    if r is None:
        return "There is no loop for this issue."
    milestones = section_checklist(r)
    return "\n\n".join(_facts(r) + ([milestones] if milestones else []))


def cancelled(r: LoopRecord, actor: str, result: str) -> str:
    if result != "cancelled":
        return f"Nothing to cancel: the loop is {result.removeprefix('already ')}."
    return (
        f"⏹️ Cancelled by @{actor}. The branch `{r.branch}`, the conversation and the review "
        "findings are kept: `/loop-restart` resumes from here."
    )


def restart_at_stage(r: LoopRecord, actor: str, *, job_alive: bool) -> str:
    """The answer to ``/loop-restart`` on a loop whose pull request is being reviewed or
    checked for merging: what is at work, or that its lost job was queued again."""
    reviewing = r.status is Status.REVIEWING
    pr = f"[#{r.pr_number}]({r.pr_url})" if r.pr_number and r.pr_url else "its pull request"
    if job_alive:
        who = "the critic is reviewing" if reviewing else "the merge gate is checking"
        return (
            f"Not restarted: {who} pull request {pr} now. `/loop-cancel` stops it; "
            "`/loop-restart` after that starts a new coding round on the same branch."
        )
    job = "critic's review" if reviewing else "merge gate's check"
    return (
        f"🔁 @{actor}: the {job} of pull request {pr} had been lost (its worker stopped); "
        f"it is queued again, and the loop stays {r.status.value}."
    )


def restarted(r: LoopRecord, actor: str, result: str) -> str:
    if result in ("restarted", "started"):
        return f"🔁 Restarted by @{actor}: same branch `{r.branch}`, turn count reset."
    return f"Not restarted: {result}."


TIMELINE_LIMIT = 12  # checklist lines in the status comment; older ones fold into one


def status_comment(r: LoopRecord, verify_tail: str = "", timeline_lines: Sequence[str] = ()) -> str:
    """The one status comment on the issue, edited as the loop goes: the state on top,
    then the checklist of what happened (``bot.core.text.timeline.timeline``), then
    the facts."""
    facts = _facts(r)
    lines = ["### loopbot", facts[0]]
    if milestones := section_checklist(r):
        lines.append(milestones)
    if timeline_lines:
        lines.append(_checklist(r, timeline_lines))
    lines += facts[1:]
    if verify_tail:
        lines.append(
            "<details><summary>verify output (tail)</summary>\n\n"
            + code_block(verify_tail[-3000:])
            + "\n</details>"
        )
    if r.status is Status.COMPLETED and r.merge_receipt:  # the gate's, with its commit
        lines.append(r.merge_receipt)
    elif r.status in TERMINAL:  # the last word on what the loop cost, every call of it
        lines.append(f"**{spend_lines.total(r)}**")
    lines.append(
        "<sub>`/loop-cancel` stops · `/loop-restart` resumes · `/loop-status` reports</sub>"
    )
    return "\n\n".join(lines)


def _checklist(r: LoopRecord, timeline_lines: Sequence[str]) -> str:
    """A Markdown task list, bounded: a step still under way (its line ends with "…")
    stays unticked while the loop is active."""
    shown = list(timeline_lines)
    if len(shown) > TIMELINE_LIMIT:  # the caller's timeline is bounded already; this too
        shown = [f"… {len(shown) - TIMELINE_LIMIT + 1} earlier steps", *shown[1 - TIMELINE_LIMIT :]]
    items = []
    for i, line in enumerate(shown):
        text = safe_text(" ".join(line.split()))
        # loopbot's own pull request stays a link (text from others is defused above).
        own = f"PR #{JOINER}{r.pr_number}"
        if r.pr_number and r.pr_url and own in text:
            text = text.replace(own, f"[PR #{r.pr_number}]({r.pr_url})")
        open_ = r.active and i == len(shown) - 1 and text.endswith("…")
        items.append(f"- [{' ' if open_ else 'x'}] {text}")
    return "\n".join(items)


def merge_message(r: LoopRecord, sha: str) -> str:
    """The squash commit's message: loopbot's own words only; ``merge_pull`` puts
    ``Closes #N`` in front."""
    turns = max(r.total_turns, r.turn)
    return (
        f"Merged by loopbot after {plural(turns, 'turn')} and "
        f"{plural(r.critic_round, 'review round')}; reviewed head {sha[:12]}; "
        f"model cost ${r.cost_usd:.2f}."
    )


def squash_title(title: str) -> str:
    """The squash commit's title: loopbot's word before the issue title (``merge_pull``
    defuses it and adds the pull request's number)."""
    return f"loop: {title}"


def gave_up(what: str, error: str, attempts: int) -> str:
    """The detail of a loop that ended because a job kept failing: what to do now."""
    return (
        f"the {what} failed {attempts} time(s) and loopbot stopped trying: {error}. "
        "Nothing was merged. Comment `/loop-restart` to try again once this is fixed, "
        "or review and merge the pull request yourself"
    )


def audit_gave_up(section: int, error: str, attempts: int) -> str:
    """The detail of a loop whose section audit kept failing (no pull request yet)."""
    return (
        f"the audit of section {section} failed {attempts} time(s) and loopbot stopped "
        f"trying: {error}. Nothing was pushed past it. Comment `/loop-restart` to try "
        "again once this is fixed: the loop audits the section before it codes on"
    )


# -- readiness triage (bot/core/rules/triage.py, jobs/intake/triage.py) ---------------------
# Every text the model proposed (reasons, criteria, sub-issues) goes through ``safe_text``.

SPEC_HEADING = "## Acceptance criteria"


def _proposed(text: str) -> str:
    """A text the model proposed (steerable by the issue's author), as loopbot may post
    it: defused, and with every ``<`` that could start HTML made inert by a joiner, so it
    can neither close loopbot's own markup (``</details>``), hide what follows (``<!--``),
    nor carry a hidden loopbot marker that ``find_comment`` would take for another
    comment. A reader sees the same text."""
    return re.sub(r"<(?=[!/?A-Za-z])", "<" + JOINER, safe_text(text))


def _bullets(lines: Sequence[str], box: bool = False) -> str:
    # A line that starts with "[ ]" or "[x]" would make "- [x] ..." a task-list item, which
    # milestones read as a (pre-ticked) section of the issue: escaped, it reads the same.
    mark = "- [ ] " if box else "- "
    one = (" ".join(line.split()) for line in lines)
    return "\n".join(mark + _proposed("\\" + x if x.startswith("[") else x) for x in one)


def triage_comment(
    verdict: str,
    reasons: Sequence[str],
    criteria: Sequence[str],
    sub_issues: Sequence[tuple[str, str]],
    *,
    cost_usd: float,
    ready_label: str,
    needs_spec_label: str,
) -> str:
    """The comment on an issue triage found not ready to code: why, the proposal, what a
    writer can do, and what the triage call cost."""
    why = _bullets(reasons) or "- (no reason given)"
    relabel = f"remove and add the `{ready_label}` label again"
    if verdict == "too_large":
        items = "\n".join(
            f"- [ ] **{_proposed(title)}**"
            + (
                # The body as a code block: an unclosed fence in it cannot swallow the
                # closing tag and the rest of the comment.
                "\n  <details><summary>body</summary>\n\n"
                + "\n".join("  " + line for line in code_block(_proposed(body)).splitlines())
                + "\n\n  </details>"
                if body.strip()
                else ""
            )
            for title, body in sub_issues
        )
        head = (
            "### loopbot: this issue looks like several\n\n"
            "loopbot did not start coding: the issue bundles changes that would each be a "
            f"pull request of their own. It is labelled `{needs_spec_label}`.\n\n"
            f"**Why**\n\n{why}\n\n**Proposed sub-issues**\n\n{items}\n\n"
            "**What you can do** (with write access)\n\n"
            "- comment `/loop-split`: loopbot creates these sub-issues and links them here "
            "(then add the ready label to each one you want worked);\n"
            "- or comment `/loop-accept-spec`: loopbot works the issue as one, as it is;\n"
            f"- or narrow the issue by editing it, then {relabel}."
        )
    else:
        head = (
            "### loopbot: this issue needs a checkable outcome\n\n"
            "loopbot did not start coding: the issue does not say how to tell that it is "
            "done, and a loop cannot prove a matter of taste. It is labelled "
            f"`{needs_spec_label}`.\n\n"
            f"**Why**\n\n{why}\n\n"
            "**Proposed acceptance criteria** (what loopbot would test)\n\n"
            f"{_bullets(criteria, box=True)}\n\n"
            "**What you can do** (with write access)\n\n"
            "- comment `/loop-accept-spec`: loopbot adds these criteria to the issue under "
            "your name and starts the loop;\n"
            f"- or edit the issue to state the outcome you want checked, then {relabel}."
        )
    return f"{head}\n\n<sub>Readiness triage: one model call, ${cost_usd:.4f}.</sub>"


def spec_section(criteria: Sequence[str], actor: str) -> str:
    """What ``/loop-accept-spec`` appends to the issue body: plain bullets, not a task
    list, which milestones would read as the issue's plan (bot/core/rules/loop/sections.py)."""
    return (
        f"{SPEC_HEADING}\n\n"
        f"_Proposed by loopbot's readiness triage; accepted by @{actor}._\n\n"
        f"{_bullets(criteria)}"
    )


def spec_accepted(actor: str, count: int, result: str, *, whole: bool = False) -> str:
    """The reply to ``/loop-accept-spec``; ``whole``: it overrode a "too large" verdict."""
    started = result in ("started", "restarted")
    then = (
        "The loop starts from the issue as it now reads." if started else f"Not started: {result}."
    )
    if whole:
        return (
            f"@{actor} asked loopbot to work this issue as one, although triage found it "
            f"large. {then}"
        )
    return (
        f"@{actor} accepted the proposed specification: {count} acceptance "
        f"criteri{'on' if count == 1 else 'a'} added to the issue. {then}"
    )


def sub_issue_body(body: str, parent_url: str, actor: str) -> str:
    """A sub-issue ``/loop-split`` creates: the proposal's body and where it came from."""
    return (
        f"{_proposed(body.strip()) or '(no description)'}\n\n---\n"
        f"<sub>Split by loopbot from {parent_url} at @{actor}'s request "
        "(`/loop-split`).</sub>"
    )


def split_done(actor: str, created: Sequence[tuple[str, str]], *, again: bool) -> str:
    """The checklist of the sub-issues ``/loop-split`` created, linked by their URL."""
    items = "\n".join(f"- [ ] {url} {_proposed(title)}" for title, url in created)
    if again:
        lead = "This issue was already split into these sub-issues:"
    else:
        lead = f"@{actor} split this issue into {len(created)} sub-issues:"
    return (
        f"{lead}\n\n{items}\n\n"
        "Its loop has ended. Add the ready label to each sub-issue you want loopbot to work."
    )


def triage_superseded(cost_usd: float, *, failed: bool = False) -> str:
    """The triage comment once a later text of the issue was judged ready (or could not
    be judged: triage fails open): the earlier proposal no longer holds, the loop codes."""
    verdict = (
        "the triage call failed, so the loop codes it anyway"
        if failed
        else "it states a checkable outcome, so the loop is coding"
    )
    return (
        "### loopbot: readiness triage\n\n"
        f"The issue's approved text changed and was triaged again: {verdict}. The earlier "
        "proposal no longer applies.\n\n"
        f"<sub>Readiness triage: ${cost_usd:.4f}.</sub>"
    )


def triage_refused(actor: str, command: str, why: str) -> str:
    return f"@{actor}: `{command}` did nothing: {why}."


# -- end readiness triage ---------------------------------------------------------------------


MAX_PATCH_SHOWN = 20_000  # characters of the workflow patch a comment or body shows


def workflow_patch(patches: dict[str, str]) -> str:
    """The agent's workflow changes as one patch (``git apply`` reads it), fenced."""
    text = "".join(patches[p] for p in sorted(patches))
    if len(text) > MAX_PATCH_SHOWN:
        text = text[:MAX_PATCH_SHOWN] + "\n… (cut: the rest is in the loop's event log)\n"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}diff\n{text.rstrip(chr(10))}\n{fence}"


def workflows_left_out(patches: dict[str, str]) -> str:
    """The issue's comment (and the pull request's part) on workflow changes left out."""
    names = ", ".join(code_span(p) for p in sorted(patches))
    return (
        f"**Workflow changes left out.** The agent changed {names}. loopbot's GitHub App "
        "does not have the `workflows` permission, so GitHub refuses any push that changes "
        "`.github/workflows/`: loopbot kept these changes out of its commits. A person "
        "can apply them (`git apply`) on the branch or after the merge:\n\n"
        + workflow_patch(patches)
    )
