"""The slots and the line of ``bot/core/rules/pace.py``, in Redis, changed atomically.

Keys (under ``loopbot:pace:``):
  slots   hash: loop key -> repository, every loop admitted that has not ended
  line    hash: loop key -> JSON {repo, priority, since}, every loop waiting for a slot
  caps    hash: repository -> its max_parallel, as its loop.yml said when a loop last
          asked to start there
  limit   the operator's LOOPBOT_MAX_PARALLEL, as the last process that knew it wrote it

Every change (a loop asks to start, a loop ends, a pass of the reconciler) reads all four
under WATCH, asks ``pace.decide`` and writes the admissions in one MULTI: a concurrent
change makes it start over. So two loops that end at the same moment, on two workers,
cannot both hand their slot to two waiters each.

This module moves keys between the slots and the line and returns who was admitted; it
writes no loop record and enqueues no job: ``jobs/lifecycle.py`` does that with the
outcome.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import WatchError

from bot.core.rules import pace as rules
from bot.core.rules.pace import Decision, Place, Waiter

P = "loopbot:pace:"
SLOTS = P + "slots"
LINE = P + "line"
CAPS = P + "caps"
LIMIT = P + "limit"


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class State:
    """Everything ``decide`` reads; a change edits it before the decision."""

    slots: dict[str, str]
    line: dict[str, Waiter]
    caps: dict[str, int]
    operator: int


@dataclass(frozen=True)
class Outcome:
    """What one change did: the loops admitted (to enqueue), the place of every loop
    still in line, and, for ``enter``, whether the loop held a slot already."""

    admitted: tuple[Waiter, ...] = ()
    places: dict[str, Place] = field(default_factory=dict)
    held: bool = False
    slots: dict[str, str] = field(default_factory=dict)  # after the change


def _waiter(key: str, raw: bytes | str) -> Waiter:
    data = json.loads(raw)
    return Waiter(key, str(data["repo"]), bool(data.get("priority")), float(data["since"]))


def _dump(w: Waiter) -> str:
    return json.dumps({"repo": w.repo, "priority": w.priority, "since": w.since})


class Pace:
    def __init__(self, redis: Redis) -> None:
        # Synchronous client with bytes responses, used untyped as in bot.io.store.
        self.redis: Any = redis

    # -- reading -----------------------------------------------------------------------------

    def _read(self, pipe: Any) -> State:
        slots = {_s(k): _s(v) for k, v in pipe.hgetall(SLOTS).items()}
        line = {_s(k): _waiter(_s(k), v) for k, v in pipe.hgetall(LINE).items()}
        caps = {_s(k): int(v) for k, v in pipe.hgetall(CAPS).items()}
        limit = pipe.get(LIMIT)
        operator = int(limit) if limit is not None else rules.DEFAULT_OPERATOR_MAX
        return State(slots, line, caps, operator)

    def state(self) -> State:
        """The slots, the line and the caps as they are now (not for a decision: see
        ``admit``)."""
        return self._read(self.redis)

    def waiter(self, key: str) -> Waiter | None:
        """``key``'s entry in the line, or None when it is not waiting."""
        raw = self.redis.hget(LINE, key)
        return None if raw is None else _waiter(key, raw)

    def holds_slot(self, key: str) -> bool:
        return bool(self.redis.hexists(SLOTS, key))

    # -- changing ----------------------------------------------------------------------------

    def _change(self, edit: Callable[[State], bool]) -> Outcome:
        """Apply ``edit`` to the state (it returns whether the loop it concerns held a
        slot already), admit whoever may start now, and write it all in one transaction."""
        while True:
            with self.redis.pipeline() as pipe:
                try:
                    pipe.watch(SLOTS, LINE, CAPS, LIMIT)
                    before = self._read(pipe)
                    after = State(
                        dict(before.slots), dict(before.line), dict(before.caps), before.operator
                    )
                    held = edit(after)
                    decision = rules.decide(
                        after.slots, after.line.values(), after.caps, after.operator
                    )
                    for w in decision.admit:
                        del after.line[w.key]
                        after.slots[w.key] = w.repo
                    pipe.multi()
                    _write(pipe, before, after)
                    pipe.execute()
                    return _outcome(decision, held, after)
                except WatchError:
                    continue

    def enter(
        self,
        key: str,
        repo: str,
        *,
        priority: bool,
        since: float,
        max_parallel: int | None = None,
        operator: int | None = None,
    ) -> Outcome:
        """``key`` asks to start: into the line, then whoever may start is admitted
        (``key`` itself, when the line allows). A loop that holds a slot already keeps it
        (``held``); one already in line keeps its place.

        ``max_parallel``: the repository's, from its loop.yml now (None: as last known);
        ``operator``: ``LOOPBOT_MAX_PARALLEL`` (None: as last written).
        """

        def edit(state: State) -> bool:
            if max_parallel is not None:
                state.caps[repo] = max_parallel
            if operator is not None:
                state.operator = operator
            if key in state.slots:
                return True
            state.line.setdefault(key, Waiter(key, repo, priority, since))
            return False

        return self._change(edit)

    def release(self, key: str, *, operator: int | None = None) -> Outcome:
        """``key`` ended (or left the line): its slot, or its place, goes to the next."""

        def edit(state: State) -> bool:
            if operator is not None:
                state.operator = operator
            state.line.pop(key, None)
            return state.slots.pop(key, None) is not None

        return self._change(edit)

    def admit(self, *, operator: int | None = None) -> Outcome:
        """Admit whoever may start now, and say where the others stand."""

        def edit(state: State) -> bool:
            if operator is not None:
                state.operator = operator
            return False

        return self._change(edit)

    def adopt(self, key: str, repo: str) -> None:
        """Count ``key`` as holding a slot, whatever the caps: a loop that runs already
        (it started before loopbot had a pace) is not stopped, it is counted."""
        self._change(lambda state: _adopt(state, key, repo))

    def reprioritize(self, key: str, priority: bool) -> bool:
        """Give a waiting loop the priority label (or take it away); False when it is
        not waiting or had it so already."""
        changed = False

        def edit(state: State) -> bool:
            nonlocal changed
            w = state.line.get(key)
            changed = w is not None and w.priority != priority
            if w is not None and changed:
                state.line[key] = Waiter(w.key, w.repo, priority, w.since)
            return False

        self._change(edit)
        return changed


def _adopt(state: State, key: str, repo: str) -> bool:
    state.line.pop(key, None)
    state.slots[key] = repo
    return False


def _write(pipe: Any, before: State, after: State) -> None:
    gone_slots = before.slots.keys() - after.slots.keys()
    if gone_slots:
        pipe.hdel(SLOTS, *gone_slots)
    new_slots = {k: v for k, v in after.slots.items() if before.slots.get(k) != v}
    if new_slots:
        pipe.hset(SLOTS, mapping=new_slots)
    gone_line = before.line.keys() - after.line.keys()
    if gone_line:
        pipe.hdel(LINE, *gone_line)
    new_line = {k: _dump(w) for k, w in after.line.items() if before.line.get(k) != w}
    if new_line:
        pipe.hset(LINE, mapping=new_line)
    new_caps = {k: v for k, v in after.caps.items() if before.caps.get(k) != v}
    if new_caps:
        pipe.hset(CAPS, mapping=new_caps)
    if after.operator != before.operator:
        pipe.set(LIMIT, after.operator)


def _outcome(decision: Decision, held: bool, after: State) -> Outcome:
    return Outcome(decision.admit, dict(decision.places), held, dict(after.slots))
