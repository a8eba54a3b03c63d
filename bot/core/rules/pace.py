"""How many loops run at once, and which waiting loop starts next: pure rules, no I/O.

Fifty labelled issues must not start fifty loops that then conflict as they merge. A
repository's ``loop.yml`` sets ``max_parallel`` (default 3), and the operator sets
``LOOPBOT_MAX_PARALLEL`` (default 20) across every repository; a repository's value above
the operator's is lowered to it (``bot.core.repo_config.clamp``).

- A loop **holds a slot** from its admission until it ends: queued with its job,
  running, reviewing, merging. A loop beyond either cap is created as usual but its job is
  not enqueued: it **waits in line**, ``queued``, with its place shown.
- The line is ordered by the priority label (``labels.priority``, ``loop:priority-high``)
  first, then by when the loop asked to start (the ready label, a restart), oldest first.
- When a loop ends, the first waiters whose repository and the operator both have room
  are admitted (``decide``); across repositories the same order holds.

``bot/io/pace.py`` keeps the slots and the line in Redis and asks ``decide`` inside one
transaction, so two loops ending at once never admit more than the caps allow;
``jobs/lifecycle.py`` acts on the decision (the admitted loops' jobs, the status comments).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bot.core.record import Waiting

DEFAULT_MAX_PARALLEL = 3  # loop.yml's default; also the cap of a repository never seen
DEFAULT_OPERATOR_MAX = 20  # LOOPBOT_MAX_PARALLEL's default
# Places up to this are shown exactly; later ones say "more than": a loop ending then
# edits at most this many waiting loops' comments, however long the line.
PLACES_SHOWN = 10


class Scope(StrEnum):
    """Which cap holds a waiting loop back."""

    REPOSITORY = "repository"  # its repository's max_parallel
    OPERATOR = "operator"  # LOOPBOT_MAX_PARALLEL, across every repository


@dataclass(frozen=True)
class Waiter:
    """A loop in line: its key, repository, priority label, and when it asked to start."""

    key: str
    repo: str
    priority: bool
    since: float


def order(w: Waiter) -> tuple[bool, float, str]:
    """The line's order: priority first, then the oldest; the key breaks a tie."""
    return (not w.priority, w.since, w.key)


@dataclass(frozen=True)
class Place:
    """Where a waiting loop stands, and what holds it back."""

    place: int  # 1-based, in its repository's line
    running: int  # loops holding a slot in ``scope``
    cap: int  # ``scope``'s limit
    scope: Scope
    priority: bool = False


@dataclass(frozen=True)
class Decision:
    admit: tuple[Waiter, ...]  # in the order they are admitted
    places: Mapping[str, Place] = field(default_factory=dict)  # every loop left in line


def cap_of(repo: str, caps: Mapping[str, int], operator: int) -> int:
    """``repo``'s cap: its ``max_parallel`` (the default for one never seen), never above
    the operator's, never below one."""
    return max(1, min(caps.get(repo, DEFAULT_MAX_PARALLEL), operator))


def decide(
    slots: Mapping[str, str],
    line: Iterable[Waiter],
    caps: Mapping[str, int],
    operator: int,
) -> Decision:
    """Who in ``line`` may start now, and each other waiter's place.

    ``slots``: the loops holding a slot (key -> repository); ``caps``: each repository's
    ``max_parallel``; ``operator``: ``LOOPBOT_MAX_PARALLEL``. Waiters are taken in
    ``order``; one whose repository is full is passed over (a later waiter of another
    repository may start), and none starts once the operator's cap is reached.
    """
    operator = max(1, operator)
    per_repo = Counter(slots.values())
    total = len(slots)
    admitted: list[Waiter] = []
    left: list[Waiter] = []
    for w in sorted(line, key=order):
        if total < operator and per_repo[w.repo] < cap_of(w.repo, caps, operator):
            admitted.append(w)
            per_repo[w.repo] += 1
            total += 1
        else:
            left.append(w)
    places: dict[str, Place] = {}
    seen: Counter[str] = Counter()
    for w in left:
        seen[w.repo] += 1
        cap = cap_of(w.repo, caps, operator)
        if per_repo[w.repo] >= cap:
            place = Place(seen[w.repo], per_repo[w.repo], cap, Scope.REPOSITORY, w.priority)
        else:
            place = Place(seen[w.repo], total, operator, Scope.OPERATOR, w.priority)
        places[w.key] = place
    return Decision(tuple(admitted), places)


# -- what the record says ---------------------------------------------------------------------


def shown(place: Place) -> Waiting:
    """What the record (and so the status comment and the dashboard) says of ``place``;
    a place past ``PLACES_SHOWN`` is shown as ``PLACES_SHOWN + 1``, "more than"."""
    return Waiting(
        place=min(place.place, PLACES_SHOWN + 1),
        running=place.running,
        cap=place.cap,
        scope=place.scope.value,
        priority=place.priority,
    )


def same(a: Waiting | None, b: Waiting) -> bool:
    """Whether ``a`` says what ``b`` says (whether it was posted aside)."""
    return a is not None and a.model_copy(update={"posted": b.posted}) == b


def phase(w: Waiting) -> str:
    """The phase of a waiting loop, as the dashboard and ``loopbot status`` list it."""
    if w.place > PLACES_SHOWN:
        return f"waiting (place {PLACES_SHOWN + 1}+)"
    return f"waiting (place {w.place})"


def waiting(place: Place, *, posted: bool = False) -> dict[str, Any]:
    """The changes that put a queued loop in line at ``place``."""
    w = shown(place).model_copy(update={"posted": posted})
    return {"waiting": w, "phase": phase(w)}


def admitted() -> dict[str, Any]:
    """The changes of a loop leaving the line for a slot: its job is enqueued with them."""
    return {"waiting": None, "phase": "queued"}
