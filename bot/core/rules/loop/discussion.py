"""Which of the issue's comments reach the agent: pure rules, no I/O.

The discussion under an issue is where maintainers clarify it. Comments by people with
write access go to the agent (those written before the first turn in its first prompt,
later ones at its next turn); nobody else's ever do, as with the issue text itself (frozen
intake, ``bot.core.rules.intake``): "nothing happens unless someone with write access
asked". Bots (loopbot included, whose status comments carry hidden markers) and
loopbot commands (``/loop-cancel`` and the like, which are for the harness) never do.

Each comment goes once, by id: an edit after it was delivered is not delivered again.
``jobs.loop.job`` lists the comments, asks GitHub who may write (only for the authors of
comments that pass ``candidates``), and records what it delivered.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from bot.core.rules.routing import FEEDBACK_WORD


class CommentLike(Protocol):
    """What the rules read of a comment (``bot.io.github.issues.CommentInfo`` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def body(self) -> str: ...
    @property
    def author(self) -> str: ...
    @property
    def author_type(self) -> str: ...


C = TypeVar("C", bound=CommentLike)

COMMENT_CHARS = 4_000  # one comment's share of a prompt
PROMPT_CHARS = 12_000  # all the comments in one prompt


def is_command(body: str) -> bool:
    """``/loop`` or ``/loop-anything`` as the first word: said to the harness, not to
    the agent (unknown ``/loop-`` words too: they were meant for loopbot)."""
    words = (body or "").strip().split(maxsplit=1)
    first = words[0].lower() if words else ""
    return first == FEEDBACK_WORD or first.startswith(FEEDBACK_WORD + "-")


def candidates(comments: Iterable[C], delivered: Collection[int]) -> list[C]:
    """The comments that go to the agent if their author may write, oldest first: not
    delivered already, written by a person (GitHub's user type ``User``: bots, loopbot
    among them, never), not a command, not blank."""
    return [
        c
        for c in comments
        if c.id not in delivered
        and c.author_type == "User"
        and c.author
        and c.body.strip()
        and not is_command(c.body)
    ]


def authors(comments: Iterable[CommentLike]) -> list[str]:
    """Whose permission to ask, each once, in the order they first appear."""
    return list(dict.fromkeys(c.author for c in comments))


def by_writers(comments: Iterable[C], can_write: Mapping[str, bool]) -> list[C]:
    """The comments whose author may write; an author not in ``can_write`` may not."""
    return [c for c in comments if can_write.get(c.author, False)]


@dataclass(frozen=True)
class Shown:
    """One comment as a prompt shows it."""

    id: int
    author: str
    body: str  # capped at ``COMMENT_CHARS``, with a note where cut


@dataclass(frozen=True)
class Selection:
    """The comments one prompt shows, oldest first, and the ids left out for room
    (the oldest, so the latest word stands)."""

    shown: tuple[Shown, ...]
    dropped: tuple[int, ...]

    @property
    def ids(self) -> list[int]:
        """Every id this selection settles: shown or left out, it is not offered again."""
        return sorted([s.id for s in self.shown] + list(self.dropped))


def fit(
    comments: Iterable[CommentLike],
    *,
    each: int = COMMENT_CHARS,
    total: int = PROMPT_CHARS,
) -> Selection:
    """Cap each comment at ``each`` characters and all of them at ``total``, dropping the
    oldest whole comments first when they do not fit."""
    capped = [Shown(c.id, c.author, cap(c.body.strip(), each)) for c in comments]
    room = total
    kept: list[Shown] = []
    for shown in reversed(capped):  # newest first: the latest word matters most
        if len(shown.body) > room:
            break
        kept.append(shown)
        room -= len(shown.body)
    kept.reverse()
    dropped = tuple(s.id for s in capped[: len(capped) - len(kept)])
    return Selection(tuple(kept), dropped)


def cap(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, a note saying where it was cut among them."""
    if len(text) <= limit:
        return text
    note = f"\n[... cut here: {len(text):,} characters in all]"
    return text[: max(0, limit - len(note))] + note
