"""The schedules in Redis: what each repository's ``loop.yml`` asks for, where each
schedule stands, and the one claim per slot that makes a run happen once.

Keys (all under ``loopbot:``):
  schedules                     hash: repo -> JSON ``Table`` (its schedules as last read)
  schedule:{repo}:{task}        hash: one schedule's state (``Standing``)
  schedule-slot:{repo}:{task}:{slot}  the claim on one slot (SET NX): the worker that
                                sets it starts the run; nobody else does, ever
  schedule-log:{repo}:{task}    list: the schedule's last outcomes, newest first (capped)

The table is written when the default branch's ``loop.yml`` is read (a push to the
default branch, the reconciler's sweep); the state and the claims by the reconciler's
schedules step (``jobs/schedules.py``). The decisions are in ``bot/core/schedules``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis import Redis

from bot.core import repo_config
from bot.core.repo_config import ScheduleConfig
from bot.core.schedules import slots
from bot.io.store import SUMMARIES

P = "loopbot:"
TABLE = P + "schedules"
LOG_KEEP = 20
# A claim not yet marked done lapses after this: a worker that died between taking a slot
# and starting its run leaves it to the next pass (the start is idempotent: the issue is
# found by its marker, and a loop already started is not started twice).
CLAIM_SECONDS = 300
DONE_MIN_SECONDS = 3600  # a done claim is kept at least this long (and two intervals)


@dataclass(frozen=True)
class Table:
    """One repository's schedules as its default branch's ``loop.yml`` said when read;
    ``error``: why it says none (the file is not valid)."""

    repo: str
    installation_id: int
    schedules: tuple[ScheduleConfig, ...] = ()
    error: str = ""
    read_at: float = 0.0

    def dumps(self) -> str:
        return json.dumps(
            {
                "repo": self.repo,
                "installation_id": self.installation_id,
                "schedules": [s.model_dump() for s in self.schedules],
                "error": self.error,
                "read_at": self.read_at,
            }
        )

    @classmethod
    def loads(cls, raw: str | bytes) -> Table:
        d = json.loads(raw)
        return cls(
            repo=str(d["repo"]),
            installation_id=int(d["installation_id"]),
            schedules=tuple(ScheduleConfig.model_validate(s) for s in d.get("schedules", [])),
            error=str(d.get("error", "")),
            read_at=float(d.get("read_at", 0.0)),
        )


@dataclass
class Standing:
    """Where one schedule stands. ``since``: when it was first seen with this ``cron``
    (slots before are not run); ``last_slot``: the slot of its last run (or skip);
    ``outcome``: what that slot came to (``started``, ``skipped``, ``refused``,
    ``task_invalid``...), with ``detail``; ``issue`` and ``loop``: its last run's."""

    cron: str = ""
    since: float = 0.0
    last_slot: float | None = None
    last_at: float = 0.0
    outcome: str = ""
    detail: str = ""
    issue: int = 0
    loop: str = ""
    commit: str = ""
    runs: int = 0
    skips: int = 0


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Book:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    # -- the tables ---------------------------------------------------------------------

    def put(self, table: Table) -> None:
        self.redis.hset(TABLE, table.repo, table.dumps())

    def read(self, repo: str, installation_id: int, text: str | None, now: float) -> Table:
        """Book the schedules of ``repo``'s ``loop.yml`` as read now (``text``; None: the
        file is gone, and with it every schedule). A file that is not valid books none,
        with the problems as its error: a broken file starts nothing, as for a label."""
        try:
            config = repo_config.parse(text) if text is not None else None
            table = Table(repo, installation_id, config.schedules if config else (), "", now)
        except repo_config.ConfigError as exc:
            table = Table(repo, installation_id, (), "; ".join(exc.problems)[:1000], now)
        self.put(table)
        return table

    def drop(self, repo: str) -> None:
        """``repo`` has no schedules any more (no loop.yml, no installation reaches it)."""
        self.redis.hdel(TABLE, repo)
        for task in self.tasks(repo):
            self.forget(repo, task)

    def tables(self) -> dict[str, Table]:
        out = {}
        for repo, raw in self.redis.hgetall(TABLE).items():
            try:
                out[_s(repo)] = Table.loads(raw)
            except (ValueError, KeyError, TypeError):
                continue  # a table from another release: read again at the next sweep
        return out

    # -- one schedule's state ----------------------------------------------------------------

    @staticmethod
    def _key(repo: str, task: str) -> str:
        return f"{P}schedule:{repo}:{task}"

    def standing(self, repo: str, task: str) -> Standing:
        raw = {_s(k): _s(v) for k, v in self.redis.hgetall(self._key(repo, task)).items()}
        last = raw.get("last_slot")
        return Standing(
            cron=raw.get("cron", ""),
            since=float(raw.get("since", 0) or 0),
            last_slot=float(last) if last else None,
            last_at=float(raw.get("last_at", 0) or 0),
            outcome=raw.get("outcome", ""),
            detail=raw.get("detail", ""),
            issue=int(raw.get("issue", 0) or 0),
            loop=raw.get("loop", ""),
            commit=raw.get("commit", ""),
            runs=int(raw.get("runs", 0) or 0),
            skips=int(raw.get("skips", 0) or 0),
        )

    def seen(self, repo: str, task: str, cron: str, now: float) -> Standing:
        """The schedule's state, first seen at ``now`` if it is new or its cron changed
        (a changed cron is a new schedule: its slots count from now)."""
        key = self._key(repo, task)
        if _s(self.redis.hget(key, "cron") or b"") != cron:
            self.redis.hset(key, mapping={"cron": cron, "since": repr(now)})
        return self.standing(repo, task)

    def settle(
        self,
        repo: str,
        task: str,
        slot: float,
        outcome: str,
        *,
        now: float,
        detail: str = "",
        issue: int = 0,
        loop: str = "",
        commit: str = "",
    ) -> None:
        """Record what ``slot`` came to: the schedule's last run, and one line of its log."""
        key = self._key(repo, task)
        fields: dict[Any, Any] = {
            "last_slot": repr(slot),
            "last_at": repr(now),
            "outcome": outcome,
            "detail": detail[:500],
        }
        if issue:
            fields |= {"issue": str(issue), "loop": loop}
        if commit:
            fields["commit"] = commit
        line = json.dumps({"slot": slot, "at": now, "outcome": outcome, "detail": detail[:500]})
        log = f"{P}schedule-log:{repo}:{task}"
        with self.redis.pipeline() as pipe:
            pipe.hset(key, mapping=fields)
            pipe.hincrby(key, "skips" if outcome == "skipped" else "runs", 1)
            pipe.lpush(log, line)
            pipe.ltrim(log, 0, LOG_KEEP - 1)
            pipe.execute()

    def history(self, repo: str, task: str) -> list[dict[str, Any]]:
        """The schedule's last outcomes, newest first."""
        return [json.loads(x) for x in self.redis.lrange(f"{P}schedule-log:{repo}:{task}", 0, -1)]

    def forget(self, repo: str, task: str) -> None:
        """A schedule no longer in ``loop.yml``: its state goes (its claims lapse)."""
        self.redis.delete(self._key(repo, task), f"{P}schedule-log:{repo}:{task}")

    def tasks(self, repo: str) -> list[str]:
        """The tasks that have a state in the book for ``repo``."""
        prefix = f"{P}schedule:{repo}:"
        return sorted(_s(k)[len(prefix) :] for k in self.redis.scan_iter(match=prefix + "*"))

    # -- the claim on a slot ------------------------------------------------------------------

    @staticmethod
    def _slot(repo: str, task: str, slot: float) -> str:
        return f"{P}schedule-slot:{repo}:{task}:{int(slot)}"

    def claim(self, repo: str, task: str, slot: float, owner: str) -> bool:
        """Take ``slot`` of the schedule for ``owner``: True for exactly one caller, across
        workers, processes and machines (SET NX), until the claim lapses unmarked."""
        return bool(
            self.redis.set(
                self._slot(repo, task, slot), f"claimed:{owner}", nx=True, ex=CLAIM_SECONDS
            )
        )

    def claimed_by(self, repo: str, task: str, slot: float) -> str | None:
        raw = self.redis.get(self._slot(repo, task, slot))
        return _s(raw) if raw is not None else None

    def done(self, repo: str, task: str, slot: float, interval: float) -> None:
        """The slot's run was decided: its claim stays (no later pass takes it again) for
        two of the schedule's intervals, by when a later slot has superseded it."""
        ttl = int(max(DONE_MIN_SECONDS, 2 * interval))
        self.redis.set(self._slot(repo, task, slot), "done", ex=ttl)


def overview(redis: Redis, now: float) -> list[dict[str, Any]]:
    """Every booked schedule as ``loopbot schedules``, the dashboard and ``/metrics`` show
    it: its repository, task and cron; its last slot, what it came to, and its loop's
    status now (the last run's outcome); its next slot; a repository whose loop.yml is
    not valid shows its error with no schedule."""
    book = Book(redis)
    rows: list[dict[str, Any]] = []
    for repo, table in sorted(book.tables().items()):
        if table.error:
            rows.append({"repo": repo, "task": "", "cron": "", "error": table.error})
        for s in table.schedules:
            st = book.standing(repo, s.task)
            loop = _summary(redis, st.loop) if st.loop else {}
            rows.append(
                {
                    "repo": repo,
                    "task": s.task,
                    "cron": s.cron,
                    "next": slots.following(s.cron, now),
                    "last_slot": st.last_slot,
                    "outcome": st.outcome,
                    "detail": st.detail,
                    "issue": st.issue or None,
                    "commit": st.commit,
                    "loop_status": loop.get("status", ""),
                    "loop_reason": loop.get("reason", ""),
                    "runs": st.runs,
                    "skips": st.skips,
                    "error": "",
                }
            )
    return rows


def _summary(redis: Redis, key: str) -> dict[str, Any]:
    raw = redis.hget(SUMMARIES, key)
    return dict(json.loads(raw)) if raw is not None else {}
