"""Frozen intake: the issue text a writer approved is the only issue text a prompt sees.

The ready label (or ``/loop-restart``) by a writer records the title and body it approved
(``LoopRecord.approved_*``). An edit by anyone else stops the loop; a writer's edit is the
new approved text. The decisions are here and in ``bot.core.rules.loop.turns``; the I/O is in
``jobs.dispatch`` (the ``issues.edited`` webhook) and ``jobs.loop.job`` (the check before a turn).
"""

from __future__ import annotations

from bot.core.record import LoopRecord, intake_hash
from bot.core.text.visible import Visible, visible, without_invisible

COMMENT_KEY = "issue-edited"
CONFIRM_KEY = "confirm-text"


def approved_text(record: LoopRecord, title: str, body: str | None) -> tuple[str, str]:
    """The approved title and body as GitHub's page showed them to the writer who
    approved them (``bot.core.text.visible``: HTML comments, invisible characters and
    the like out); a record from before frozen intake has none, and falls back to the
    text given (the issue as read now). Every prompt takes the issue's text from here."""
    shown_title, shown_body = approved_shown(record, title, body)
    return shown_title, shown_body.text


def approved_shown(record: LoopRecord, title: str, body: str | None) -> tuple[str, Visible]:
    """``approved_text`` with what was taken out of it counted (a title is plain text
    on GitHub's page: only its invisible characters go)."""
    if record.approved_sha256:
        title, body = record.approved_title, record.approved_body
    shown_title, chars = without_invisible(title)
    shown = visible(body or "")
    return shown_title, Visible(shown.text, shown.comments, shown.chars + chars)


def edited(record: LoopRecord, title: str, body: str | None) -> bool:
    """Whether the issue's text differs from what a writer approved."""
    return bool(record.approved_sha256) and intake_hash(title, body) != record.approved_sha256


def stopped_comment(actor: str, label: str) -> str:
    who = f"@{actor}" if actor else "someone without write access"
    return (
        f"**loopbot stopped:** the issue's title or body was edited by {who} after a "
        "maintainer approved it, and only text approved by someone with write access goes "
        "to the agent and the reviewer.\n\n"
        f"A maintainer who has read the new text can approve it by removing and re-adding "
        f"the `{label}` label, or by commenting `/loop-restart`."
    )


def reapproved_comment(actor: str) -> str:
    return (
        f"@{actor} (write access) edited the issue: loopbot took the edited title and body "
        "as the approved text and continues from it."
    )


# -- the edit before the label ---------------------------------------------------------------
#
# The label approves the text as it reads when loopbot looks, seconds later. An edit by
# someone without write access just before (or just after) the label would be approved
# with it; GitHub's GraphQL API says who made the latest edit of the body and the title.
# When either is not a writer's, a writer confirms the text as it reads now by labelling
# (or restarting) again: that second approval is of the text the first one asked about.


def same_text(a: tuple[str, str | None], b: tuple[str, str | None]) -> bool:
    """Whether two reads of an issue's (title, body) say the same, line endings aside."""

    def norm(t: tuple[str, str | None]) -> tuple[str, str]:
        return t[0].replace("\r\n", "\n"), (t[1] or "").replace("\r\n", "\n")

    return norm(a) == norm(b)


def needs_confirmation(
    untrusted_editor: str | None, asked: tuple[str, str] | None, sha256: str, stamp: str
) -> bool:
    """Whether to ask a writer to confirm instead of starting: the latest edit is by
    someone who cannot write (``untrusted_editor``), and no writer has been asked about
    exactly this text at exactly this edit (``asked``: the hash and edit stamp a writer
    was asked about). The stamp binds the question to the edit: text put back after a
    writer rewrote it is a new edit, asked about again."""
    return untrusted_editor is not None and asked != (sha256, stamp)


def confirm_comment(editor: str | None, how: str) -> str:
    """``editor``: who made the edit (``""`` an account since deleted; None: the issue
    changed while loopbot read it, so its latest editor is not known)."""
    if editor is None:
        why = "the issue changed while loopbot read it, so who made its latest edit is not known"
    else:
        who = f"@{editor}" if editor else "an account since deleted"
        why = f"the issue's latest edit was made by {who}, who has no write access"
    return (
        f"**loopbot did not start:** {why}, and a label approves the text as it reads now. "
        "A maintainer who has read the title and body as they are now can confirm them by "
        f"{how}; an edit after that asks again."
    )
