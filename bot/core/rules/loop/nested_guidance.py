"""Which nested AGENTS.md files reach the agent: pure rules, no I/O.

By the AGENTS.md convention, the instructions for a file are in the nearest AGENTS.md
among its parent directories. The root one is in the system prompt already
(``bot.core.text.prompts.guidance``); these rules find, for the files the loop has
changed, the nearest one below the root. ``jobs.loop.job`` reads which exist, and their text,
from the default branch in the bare mirror (never from the worktree, where the agent
writes), and records which it delivered: each file goes to the agent once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

NAME = "AGENTS.md"
FILE_CHARS = 8_000  # one file's share of a prompt
PROMPT_CHARS = 16_000  # all of them in one prompt; the rest wait for the next turn
MAX_CHANGED = 5_000  # changed files looked at: past that, a loop has other problems


def directories(path: str) -> list[str]:
    """The directories above ``path``, nearest first, the repository's root left out:
    ``a/b/c.py`` -> ``["a/b", "a"]``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def candidates(changed: Iterable[str]) -> list[str]:
    """Every ``<dir>/AGENTS.md`` that could be the nearest one for a changed file."""
    found: dict[str, None] = {}
    for i, path in enumerate(changed):
        if i >= MAX_CHANGED:
            break
        for directory in directories(path):
            found[f"{directory}/{NAME}"] = None
    return sorted(found)


def nearest(changed: Iterable[str], present: Collection[str]) -> list[str]:
    """For each changed file, the nearest ``<dir>/AGENTS.md`` among ``present`` (those
    the default branch has), each once, sorted."""
    found: set[str] = set()
    for i, path in enumerate(changed):
        if i >= MAX_CHANGED:
            break
        for directory in directories(path):
            if (candidate := f"{directory}/{NAME}") in present:
                found.add(candidate)
                break
    return sorted(found)


@dataclass(frozen=True)
class Guidance:
    """One nested AGENTS.md as a prompt shows it."""

    path: str  # ``<dir>/AGENTS.md``
    text: str  # capped at ``FILE_CHARS``, a note saying where it was cut

    @property
    def directory(self) -> str:
        return self.path.rpartition("/")[0]


def fit(
    texts: Mapping[str, str], *, each: int = FILE_CHARS, total: int = PROMPT_CHARS
) -> list[Guidance]:
    """The files one prompt shows, in path order: each capped at ``each`` characters; a
    file that would take the prompt past ``total`` waits (it is not delivered, so the
    next turn offers it again). Blank files are shown too: they are settled all the same."""
    shown: list[Guidance] = []
    room = total
    for path in sorted(texts):
        text = texts[path].strip()
        if len(text) > each:
            text = text[:each] + f"\n[... {path} cut at {each:,} characters]"
        if len(text) > room and shown:
            break
        shown.append(Guidance(path, text))
        room -= len(text)
    return shown
