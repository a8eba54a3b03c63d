"""What loopbot says on GitHub: the text of comments, in one place."""

from __future__ import annotations

import re

from bot.loopstate import LoopRecord, Status

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


def _facts(r: LoopRecord) -> list[str]:
    """The status line and what a reader needs next to it: branch, PR, last verify."""
    lines = [status_line(r)]
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


def status_comment(r: LoopRecord, verify_tail: str = "") -> str:
    """The one status comment on the issue, edited as the loop goes."""
    lines = ["### loopbot", *_facts(r)]
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


def code_block(text: str) -> str:
    """``text`` fenced so that nothing in it can close the fence early (test output, a
    diff, or an agent, may contain backticks): the fence is longer than any run inside."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


# GitHub closes the issues that a merged pull request's body or a default-branch commit
# message names after one of these words: ``#N``, ``owner/repo#N`` or an issue's URL.
_CLOSING = re.compile(
    r"(?i)\b(close[sd]?|fix(?:e[sd])?|resolve[sd]?)(\s*:?\s+)"
    r"((?:[\w.-]+/[\w.-]+)?#\d+|https?://[^\s/]+/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+\b)"
)


def defuse_references(text: str) -> str:
    """Text the agent wrote, safe to publish: "fixes #12" would close issue 12 when the
    pull request merges, so the reference goes into a code span, which GitHub does not
    link or act on."""
    return _CLOSING.sub(lambda m: f"{m.group(1)}{m.group(2)}`{m.group(3)}`", text)


def merge_message(r: LoopRecord, sha: str) -> str:
    """The squash commit's message: loopbot's own words only (see ``merge_pull``)."""
    return (
        f"Closes #{r.issue}.\n\n"
        f"Merged by loopbot after {r.turn} turn(s) and {r.critic_round} review round(s); "
        f"reviewed head {sha[:12]}; model cost ${r.cost_usd:.2f}."
    )


# @user and @org/team notify people; a word character before the @ (an e-mail address)
# makes it no mention. Inside a code span nothing is a mention or a reference.
_MENTION = re.compile(r"(?<!\w)@([A-Za-z0-9][A-Za-z0-9-]{0,38}(?:/[\w.-]+)?)")
_TICKS = re.compile(r"(?<!\\)`+")


def _code_spans(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is_code, piece): a run of N backticks opens a code span only if
    a later run of exactly N closes it (CommonMark); an unclosed backtick is plain text."""
    pieces: list[tuple[bool, str]] = []
    start = search = 0
    while (opening := _TICKS.search(text, search)) is not None:
        width = len(opening.group())
        closing = next(
            (c for c in _TICKS.finditer(text, opening.end()) if len(c.group()) == width), None
        )
        if closing is None:
            search = opening.end()
            continue
        pieces.append((False, text[start : opening.start()]))
        pieces.append((True, text[opening.start() : closing.end()]))
        start = search = closing.end()
    pieces.append((False, text[start:]))
    return pieces


def _defuse_plain(text: str) -> str:
    # A stray backtick is escaped first, so it cannot pair with the code spans added here
    # and turn the text between them back into live text.
    text = re.sub(r"(?<!\\)`", r"\`", text)
    return _MENTION.sub(lambda m: f"`@{m.group(1)}`", defuse_references(text))


def safe_text(text: str) -> str:
    """Model-written text (the agent's summary, the critic's findings), an issue title, a
    file name, made safe to post: it neither closes issues nor pings people, whatever an
    issue talked the model into. Code spans are kept as they are."""
    return "".join(piece if code else _defuse_plain(piece) for code, piece in _code_spans(text))


def code_span(text: str) -> str:
    """``text`` shown literally in one code span, whatever backticks it holds (a file
    name such as ``.github/`@acme/team`.md``): nothing in it links, closes or pings."""
    text = " ".join(text.splitlines())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def squash_title(title: str, pr_number: int) -> str:
    """The squash commit's title: loopbot's words around the issue title, defused."""
    return f"loop: {safe_text(' '.join(title.split()))} (#{pr_number})"


def gave_up(what: str, error: str, attempts: int) -> str:
    """The detail of a loop that ended because a job kept failing: what to do now."""
    return (
        f"the {what} failed {attempts} time(s) and loopbot stopped trying: {error}. "
        "Nothing was merged. Comment `/loop-restart` to try again once this is fixed, "
        "or review and merge the pull request yourself"
    )
