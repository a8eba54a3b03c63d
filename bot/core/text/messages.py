"""What loopbot says on GitHub: the text of comments, in one place."""

from __future__ import annotations

from collections.abc import Sequence

from bot.core.record import LoopRecord, Status, Waiting
from bot.core.rules import budget
from bot.core.rules.pace import PLACES_SHOWN
from bot.core.text.defuse import code_block, code_span, safe_text

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
        f"turn {r.turn} of {r.max_turns}",
        f"cost {_cost(r)}",
    ]
    if r.reason:
        parts.append(f"reason `{r.reason}`")
    return " · ".join(parts)


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
            f"Last verify (turn {v.get('turn')}): {ok}, exit {v.get('exit_code')}, "
            f"{v.get('seconds', 0):.1f}s"
        )
    if r.detail:
        lines.append(f"> {safe_text(r.detail)}")
    return lines


def status_reply(r: LoopRecord | None) -> str:
    """The answer to ``/loop-status``."""
    if r is None:
        return "There is no loop for this issue."
    return "\n\n".join(_facts(r))


def cancelled(r: LoopRecord, actor: str, result: str) -> str:
    if result != "cancelled":
        return f"Nothing to cancel: the loop is {result.removeprefix('already ')}."
    return (
        f"⏹️ Cancelled by @{actor}. The branch `{r.branch}`, the conversation and the review "
        "findings are kept: `/loop-restart` resumes from here."
    )


def restarted(r: LoopRecord, actor: str, result: str) -> str:
    if result in ("restarted", "started"):
        return f"🔁 Restarted by @{actor}: same branch `{r.branch}`, turn count reset."
    return f"Not restarted: {result}."


TIMELINE_LIMIT = 12  # checklist lines in the status comment; older ones fold into one


def status_comment(r: LoopRecord, verify_tail: str = "", timeline_lines: Sequence[str] = ()) -> str:
    """The one status comment on the issue, edited as the loop goes: the state on top,
    then the checklist of what happened (``bot.core.text.sessionlog.timeline``), then
    the facts."""
    facts = _facts(r)
    lines = ["### loopbot", facts[0]]
    if timeline_lines:
        lines.append(_checklist(r, timeline_lines))
    lines += facts[1:]
    if verify_tail:
        lines.append(
            "<details><summary>verify output (tail)</summary>\n\n"
            + code_block(verify_tail[-3000:])
            + "\n</details>"
        )
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
        open_ = r.active and i == len(shown) - 1 and text.endswith("…")
        items.append(f"- [{' ' if open_ else 'x'}] {text}")
    return "\n".join(items)


def merge_message(r: LoopRecord, sha: str) -> str:
    """The squash commit's message: loopbot's own words only; ``merge_pull`` puts
    ``Closes #N`` in front."""
    return (
        f"Merged by loopbot after {r.turn} turn(s) and {r.critic_round} review round(s); "
        f"reviewed head {sha[:12]}; model cost ${r.cost_usd:.2f}."
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
