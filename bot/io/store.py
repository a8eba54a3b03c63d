"""Loop state in Redis: one record per loop, an event stream per loop and one global.

Keys (all under ``loopbot:``):
  loop:{repo}#{n}       JSON LoopRecord
  loops                 set of loop keys
  summaries             hash: loop key -> JSON summary (the list view; see summarize)
  recent                sorted set: loop key scored by updated_at (newest first paging)
  conv:{repo}#{n}       JSON conversation (the agent's messages), large, kept apart
  events:{repo}#{n}     Redis Stream of this loop's events
  events                Redis Stream of all events (capped)
  event-budget:{repo}#{n}  bytes of the agent's events this loop's stream took
  lease:{repo}#{n}      the worker holding the loop, with a TTL
  cancel:{repo}#{n}     set when a cancel was asked; the running loop polls it
  archive               hash: loop key -> JSON of an ended loop's cost summary, once its
                        record passed LOOPBOT_RETENTION_DAYS (bot/core/spend/retention.py)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from redis import Redis
from redis.exceptions import LockError, LockNotOwnedError, WatchError

from bot.core.formats import RECORD_FORMAT, check_record_format
from bot.core.ids import LoopId
from bot.core.record import ACTIVE, LoopRecord, Status, summarize
from bot.core.rules import event_size
from bot.core.rules.loop.budget import alive_until
from bot.core.spend import retention
from bot.io.logs import get_logger

log = get_logger("loopbot.store")
P = "loopbot:"
GLOBAL_EVENTS_MAXLEN = 50_000
LOOP_EVENTS_MAXLEN = 5_000
SUMMARIES = P + "summaries"
RECENT = P + "recent"
ARCHIVE = P + "archive"


# Store methods take a LoopId or its key (``owner/name#12``); both name the same loop.
LoopKey = LoopId | str


def _k(kind: str, key: LoopKey) -> str:
    return f"{P}{kind}:{key}"


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _index(pipe: Any, record: LoopRecord) -> None:
    """Keep the list view in step with the record, in the same transaction."""
    pipe.hset(SUMMARIES, record.key, json.dumps(summarize(record)))
    pipe.zadd(RECENT, {record.key: record.updated_at})


class LeaseLost(Exception):
    """This worker no longer holds the loop's lease: it must stop writing at once."""


class Store:
    def __init__(self, redis: Redis) -> None:
        # redis-py's return types are unions of bytes, str and awaitables; the client here
        # is synchronous with bytes responses, so it is used untyped and decoded below.
        self.redis: Any = redis

    # -- records ---------------------------------------------------------------------------

    def get(self, key: LoopKey) -> LoopRecord | None:
        raw = self.redis.get(_k("loop", key))
        return None if raw is None else LoopRecord.model_validate_json(raw)

    def put(self, record: LoopRecord, *, touch: bool = True) -> LoopRecord:
        """Write ``record`` whole; ``touch=False`` keeps its ``updated_at`` (restores, tests)."""
        if touch:
            record.updated_at = time.time()
        record.format = RECORD_FORMAT
        pipe = self.redis.pipeline()
        pipe.set(_k("loop", record.key), record.model_dump_json())
        pipe.sadd(P + "loops", record.key)
        _index(pipe, record)
        pipe.execute()
        return record

    def update(self, key: LoopKey, fn: Callable[[LoopRecord], None]) -> LoopRecord:
        """Read-modify-write under WATCH, so two processes never lose each other's changes."""
        return self._update(key, fn, None)

    def _update(
        self, key: LoopKey, fn: Callable[[LoopRecord], None], owner: str | None
    ) -> LoopRecord:
        """``update``; with ``owner``, also fenced: the write lands only while ``owner``
        holds the loop's lease (the lease key is WATCHed in the same transaction)."""
        rkey = _k("loop", key)
        lkey = _k("lease", key)
        while True:
            with self.redis.pipeline() as pipe:
                try:
                    if owner is None:
                        pipe.watch(rkey)
                    else:
                        pipe.watch(rkey, lkey)
                        holder = pipe.get(lkey)
                        if holder is None or _s(holder) != owner:
                            raise LeaseLost(f"{key}: the lease is held by {holder!r}")
                    raw = pipe.get(rkey)
                    beat = pipe.get(_k("beat", key))
                    if raw is None:
                        raise KeyError(key)
                    record = LoopRecord.model_validate_json(raw)
                    # A newer release's record: rewriting it here would drop what this
                    # release cannot read (bot/core/formats.py).
                    check_record_format(record.format)
                    # Queued is waiting for a worker, not working: a backlog must not
                    # spend a loop's hours.
                    was_active = record.status in ACTIVE and record.status != Status.QUEUED
                    running = record.status == Status.RUNNING  # a lease-holding worker's
                    last = record.updated_at
                    fn(record)
                    now = time.time()
                    if was_active:
                        # The hours budget (bot/core/rules/loop/budget.py): the time
                        # between two writes of a working loop was spent; time it sat failed
                        # is not, nor time a running loop's worker was gone (its heartbeats
                        # had stopped).
                        end = alive_until(_s(beat), last, now) if running and beat else now
                        record.active_seconds += max(0.0, end - last)
                    record.updated_at = now
                    pipe.multi()
                    pipe.set(rkey, record.model_dump_json())
                    _index(pipe, record)
                    pipe.execute()
                    return record
                except WatchError:
                    continue

    def set_fields(self, key: LoopKey, **fields: Any) -> LoopRecord:
        """Set fields of the record (validated on assignment), atomically."""

        def apply(r: LoopRecord) -> None:
            for name, value in fields.items():
                setattr(r, name, value)

        return self.update(key, apply)

    def summaries(self) -> list[dict[str, Any]]:
        """Every loop's summary: what lists and metrics need, without whole records."""
        self._backfill()
        return [json.loads(raw) for raw in self.redis.hvals(SUMMARIES)]

    def recent(
        self, limit: int, offset: int = 0, status: str | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of summaries, newest first, and how many there are in all."""
        self._backfill()
        if status is None:
            keys = self.redis.zrevrange(RECENT, offset, offset + limit - 1)
            total = int(self.redis.zcard(RECENT))
            raws = self.redis.hmget(SUMMARIES, keys) if keys else []
            return [json.loads(r) for r in raws if r is not None], total
        rows = [s for s in self.summaries() if s["status"] == status]
        rows.sort(key=lambda s: -s["updated_at"])
        return rows[offset : offset + limit], len(rows)

    def _backfill(self) -> None:
        """Index records that have no summary (written before the index existed).

        Written with HSETNX and ZADD NX, so a record updated meanwhile keeps its newer
        summary.
        """
        if self.redis.hlen(SUMMARIES) >= self.redis.scard(P + "loops"):
            return
        indexed = {_s(k) for k in self.redis.hkeys(SUMMARIES)}
        missing = sorted(_s(k) for k in self.redis.smembers(P + "loops") if _s(k) not in indexed)
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            raws = self.redis.mget([_k("loop", k) for k in chunk])
            pipe = self.redis.pipeline(transaction=False)
            for raw in raws:
                if raw is None:
                    continue
                record = LoopRecord.model_validate_json(raw)
                pipe.hsetnx(SUMMARIES, record.key, json.dumps(summarize(record)))
                pipe.zadd(RECENT, {record.key: record.updated_at}, nx=True)
            pipe.execute()

    def all(self) -> list[LoopRecord]:
        keys = sorted(
            k.decode() if isinstance(k, bytes) else k for k in self.redis.smembers(P + "loops")
        )
        if not keys:
            return []
        raws = self.redis.mget([_k("loop", k) for k in keys])
        return [LoopRecord.model_validate_json(r) for r in raws if r is not None]

    # -- retention ------------------------------------------------------------------------

    def archive(self, record: LoopRecord) -> None:
        """Keep only ``record``'s cost summary (``retention.compact``) and remove the rest
        of the loop, in one transaction."""
        key = record.key
        pipe = self.redis.pipeline()
        pipe.hset(ARCHIVE, key, json.dumps(retention.compact(record)))
        pipe.delete(
            _k("loop", key),
            _k("conv", key),
            _k("agent-session", key),
            _k("events", key),
            _k("event-budget", key),
        )
        pipe.srem(P + "loops", key)
        pipe.hdel(SUMMARIES, key)
        pipe.zrem(RECENT, key)
        pipe.execute()

    def archived(self) -> list[LoopRecord]:
        """The archived loops' cost summaries, as records with only those fields."""
        return [LoopRecord.model_validate_json(v) for v in self.redis.hvals(ARCHIVE)]

    def is_archived(self, key: LoopKey) -> bool:
        return bool(self.redis.hexists(ARCHIVE, str(key)))

    # -- conversation ----------------------------------------------------------------------

    def save_conversation(self, key: LoopKey, messages: list[dict[str, Any]]) -> None:
        # Kept as the loop's events are (the agent's words are in it): for
        # EVENTS_TTL_SECONDS after the last save, never for ever.
        self.redis.set(_k("conv", key), json.dumps(messages), ex=event_size.EVENTS_TTL_SECONDS)

    def conversation(self, key: LoopKey) -> list[dict[str, Any]]:
        raw = self.redis.get(_k("conv", key))
        return [] if raw is None else list(json.loads(raw))

    def save_agent_session(
        self, key: LoopKey, session: str, files: bytes, backend: str = "claude-code"
    ) -> None:
        """An agent backend's own session (Claude Code's transcript, opencode's database,
        compressed): saved after each turn, so the next turn resumes it on any worker."""
        # The agent writes these files (to MAX_SESSION, incompressible if it likes): kept
        # for EVENTS_TTL_SECONDS after the last save, as the loop's events, so finished
        # loops' sessions do not pile up in Redis for ever (issue 37, item 1).
        skey = _k("agent-session", key)
        pipe = self.redis.pipeline()
        pipe.hset(skey, mapping={"id": session, "files": files, "backend": backend})
        pipe.expire(skey, event_size.EVENTS_TTL_SECONDS)
        pipe.execute()

    def agent_session(self, key: LoopKey, backend: str = "claude-code") -> tuple[str, bytes] | None:
        """The saved session of ``backend`` (None: none, or another backend's: a writer
        switched the issue's backend, and one backend cannot resume another's session)."""
        found = self.redis.hgetall(_k("agent-session", key))
        if not found or b"id" not in found:
            return None
        if found.get(b"backend", b"claude-code").decode() != backend:
            return None
        return found[b"id"].decode(), found.get(b"files", b"")

    # -- counters ---------------------------------------------------------------------------

    def count(self, name: str, by: int = 1) -> None:
        """A deployment-wide counter that only rises (restarts reset a loop's turn count)."""
        self.redis.incrby(f"{P}counter:{name}", by)

    def counter(self, name: str) -> int:
        return int(self.redis.get(f"{P}counter:{name}") or 0)

    # -- events -------------------------------------------------------------------------------

    def event(self, key: LoopKey, kind: str, **fields: Any) -> None:
        """Append an event to the loop's stream and the global one. Every event is cut to
        a bounded size first (``bot.core.rules.event_size``: its fields may come from the
        agent, or from a process in its sandbox); the agent's own kinds also count against
        the loop's budget, past which they are dropped and one ``events_capped`` says so."""
        data = event_size.bound(fields, event_size.FIELD_CHARS, event_size.EVENT_BYTES)
        if kind in event_size.BUDGETED and not self._charge(key, event_size.cost(data)):
            return
        self._append(key, kind, data, fields)

    def _charge(self, key: LoopKey, cost: int) -> bool:
        """Whether the loop's budget holds ``cost`` more bytes of the agent's events. The
        count only rises (a dropped event is counted too): the one event that crosses the
        budget is the only one to find the count below it before, so one notice is written
        whichever worker is running the loop."""
        used = int(self.redis.hincrby(_k("event-budget", key), "bytes", cost))
        if used <= event_size.LOOP_BUDGET_BYTES:
            return True
        if used - cost <= event_size.LOOP_BUDGET_BYTES:
            notice = {
                "budget_bytes": event_size.LOOP_BUDGET_BYTES,
                "kinds": sorted(event_size.BUDGETED),
                "why": "the agent's events of this loop reached their budget; later ones "
                "are not kept (the harness's still are)",
            }
            self._append(key, "events_capped", json.dumps(notice), notice)
        return False

    def _append(self, key: LoopKey, kind: str, data: str, fields: dict[str, Any]) -> None:
        entry = {"loop": str(key), "kind": kind, "at": f"{time.time():.3f}", "data": data}
        short = event_size.bound(
            fields, event_size.GLOBAL_FIELD_CHARS, event_size.GLOBAL_EVENT_BYTES
        )
        stream, ttl = _k("events", key), event_size.EVENTS_TTL_SECONDS
        pipe = self.redis.pipeline()
        pipe.xadd(stream, entry, maxlen=LOOP_EVENTS_MAXLEN, approximate=True)
        # Kept while the loop writes, and for EVENTS_TTL_SECONDS after its last event.
        pipe.expire(stream, ttl)
        pipe.expire(_k("event-budget", key), ttl)
        pipe.xadd(
            P + "events",
            {**entry, "data": short},
            maxlen=GLOBAL_EVENTS_MAXLEN,
            approximate=True,
        )
        pipe.execute()

    def events(
        self, key: LoopKey | None = None, *, after: str = "-", count: int = 1000
    ) -> list[dict[str, Any]]:
        stream = _k("events", key) if key else P + "events"
        start = after if after == "-" else f"({after}"
        out = []
        for entry_id, fields in self.redis.xrange(stream, min=start, count=count):
            out.append(_decode_event(entry_id, fields))
        return out

    # -- an edit a writer must confirm (bot/core/rules/intake.py) -----------------------

    def ask_confirmation(self, key: LoopKey, sha256: str, stamp: str) -> None:
        """A writer was asked to confirm the issue's text as it reads now: its hash, and
        when its body and title were last edited (a later edit is not confirmed by it)."""
        value = json.dumps({"sha256": sha256, "stamp": stamp})
        self.redis.set(_k("confirm", key), value, ex=30 * 86400)

    def confirmation_asked(self, key: LoopKey) -> tuple[str, str] | None:
        raw = self.redis.get(_k("confirm", key))
        try:
            asked = json.loads(raw) if raw is not None else None
            return (str(asked["sha256"]), str(asked["stamp"])) if asked else None
        except (ValueError, TypeError, KeyError):
            return None

    def clear_confirmation(self, key: LoopKey) -> None:
        self.redis.delete(_k("confirm", key))

    def timeline_token(self, key: LoopKey) -> str | None:
        """The saved timeline's token: a new one each time it is built from nothing, so a
        copy held in a process is known to be this one (not one Redis lost, or an older
        stream's), for a few bytes a status update."""
        raw = self.redis.hget(_k("timeline", key), "token")
        return None if raw is None else _s(raw)

    def timeline_state(self, key: LoopKey) -> tuple[str, Any] | None:
        """The status comment's timeline as last saved (``bot.core.text.timeline.Timeline``)
        with its token, or None: built from the events once, then from the newer ones."""
        token, raw = self.redis.hmget(_k("timeline", key), ["token", "state"])
        if token is None or raw is None:
            return None
        try:
            return _s(token), json.loads(raw)
        except ValueError:
            return None

    def save_timeline_state(self, key: LoopKey, token: str, state: dict[str, Any]) -> None:
        self.redis.hset(_k("timeline", key), mapping={"token": token, "state": json.dumps(state)})

    def status_sent(self, key: LoopKey) -> str | None:
        """What the status comment was last edited to: "<comment id> <digest of the body>"
        (jobs/status_comment.py sends no edit that would leave it as it is)."""
        raw = self.redis.hget(_k("timeline", key), "sent")
        return None if raw is None else _s(raw)

    def save_status_sent(self, key: LoopKey, sent: str) -> None:
        self.redis.hset(_k("timeline", key), "sent", sent)

    def follow(
        self, key: LoopKey | None, last: str = "$", block_ms: int = 1000
    ) -> list[dict[str, Any]]:
        stream = _k("events", key) if key else P + "events"
        res = self.redis.xread({stream: last}, block=block_ms, count=100)
        return [_decode_event(i, f) for _, entries in res for i, f in entries]

    # -- leases and cancellation -------------------------------------------------------------

    def take_lease(self, key: LoopKey, owner: str, ttl: float) -> bool:
        """Take the loop's lease unless another owner holds it."""
        lkey = _k("lease", key)
        if self.redis.set(lkey, owner, nx=True, px=int(ttl * 1000)):
            self.redis.set(_k("beat", key), f"{time.time():.3f}:{ttl:g}", ex=86400)
            return True
        current = self.redis.get(lkey)
        return current is not None and current.decode() == owner

    def renew_lease(self, key: LoopKey, owner: str, ttl: float) -> bool:
        # Compare-and-renew in Lua: never extend a lease someone else took over. A renewal
        # is also the loop's heartbeat (see ``_update``): when, and the lease's TTL.
        script = (
            "if redis.call('get', KEYS[1]) == ARGV[1] then "
            "redis.call('set', KEYS[2], ARGV[3], 'EX', 86400) "
            "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
        )
        beat = f"{time.time():.3f}:{ttl:g}"
        return bool(
            self.redis.eval(
                script, 2, _k("lease", key), _k("beat", key), owner, int(ttl * 1000), beat
            )
        )

    def release_lease(self, key: LoopKey, owner: str) -> None:
        script = (
            "if redis.call('get', KEYS[1]) == ARGV[1] then "
            "return redis.call('del', KEYS[1]) else return 0 end"
        )
        self.redis.eval(script, 1, _k("lease", key), owner)

    def force_release_lease(self, key: LoopKey) -> None:
        self.redis.delete(_k("lease", key))

    def lease_holder(self, key: LoopKey) -> str | None:
        raw = self.redis.get(_k("lease", key))
        return None if raw is None else raw.decode()

    def request_cancel(self, key: LoopKey, reason: str) -> None:
        self.redis.set(_k("cancel", key), reason)

    def cancel_requested(self, key: LoopKey) -> str | None:
        raw = self.redis.get(_k("cancel", key))
        return None if raw is None else raw.decode()

    def clear_cancel(self, key: LoopKey) -> None:
        self.redis.delete(_k("cancel", key))

    def push_feedback(self, key: LoopKey, item: dict[str, Any]) -> None:
        """Human feedback for the loop's next continuation turn."""
        self.redis.rpush(_k("feedback", key), json.dumps(item))

    def feedback_waiting(self, key: LoopKey) -> bool:
        """Whether feedback waits for the loop's next turn (milestones: a post-action
        goes to the gate only when none does)."""
        return bool(self.redis.llen(_k("feedback", key)))

    def take_feedback(self, key: LoopKey) -> list[dict[str, Any]]:
        pipe = self.redis.pipeline()
        pipe.lrange(_k("feedback", key), 0, -1)
        pipe.delete(_k("feedback", key))
        raw, _ = pipe.execute()
        return [json.loads(x) for x in raw]

    @contextmanager
    def lock(self, name: str, timeout: float = 30, *, renew: bool = False) -> Iterator[None]:
        """A Redis lock for a decision across processes, lapsing ``timeout`` after its
        holder died. ``renew``: kept for as long as the body runs, however long (the
        gate's, whose GitHub calls can wait minutes for the installation's pace)."""
        # thread_local=False: the renewing thread must see the token the holder took.
        lock = self.redis.lock(
            P + "lock:" + name, timeout=timeout, blocking_timeout=timeout, thread_local=False
        )
        if not lock.acquire():
            raise LockError(f"could not take the lock {name} within {timeout:.0f} s")
        stop = threading.Event()
        if renew:

            def keep() -> None:
                while not stop.wait(timeout / 3):
                    try:
                        lock.reacquire()
                    except Exception as exc:  # noqa: BLE001 - lost (a failover): logged
                        log.warning("store.lock_renew_failed", lock=name, error=str(exc)[:200])
                        return

            threading.Thread(target=keep, daemon=True, name=f"lock-{name}").start()
        try:
            yield
        finally:
            stop.set()
            try:
                lock.release()
            except LockNotOwnedError:
                # It lapsed while held (a Redis restart or failover lost it): what the body
                # did stands; the next holder finds the state it left.
                log.warning("store.lock_lapsed", lock=name)


class FencedStore(Store):
    """The store as one lease holder sees it: every write checks the lease first.

    ``guard`` is the holder's local check (it raises ``LeaseLost`` once renewals have
    failed for longer than the TTL, or another owner answered); record writes to the
    leased loop are also fenced in Redis itself, atomically with the write.
    """

    def __init__(self, redis: Redis, key: LoopKey, owner: str, guard: Callable[[], None]) -> None:
        super().__init__(redis)
        self.key, self.owner, self.guard = key, owner, guard

    def put(self, record: LoopRecord, *, touch: bool = True) -> LoopRecord:
        self.guard()
        return super().put(record, touch=touch)

    def update(self, key: LoopKey, fn: Callable[[LoopRecord], None]) -> LoopRecord:
        self.guard()
        return self._update(key, fn, self.owner if key == self.key else None)

    def event(self, key: LoopKey, kind: str, **fields: Any) -> None:
        self.guard()
        super().event(key, kind, **fields)

    def save_conversation(self, key: LoopKey, messages: list[dict[str, Any]]) -> None:
        self.guard()
        super().save_conversation(key, messages)

    def save_agent_session(
        self, key: LoopKey, session: str, files: bytes, backend: str = "claude-code"
    ) -> None:
        self.guard()
        super().save_agent_session(key, session, files, backend)

    def count(self, name: str, by: int = 1) -> None:
        self.guard()
        super().count(name, by)

    def take_feedback(self, key: LoopKey) -> list[dict[str, Any]]:
        self.guard()
        return super().take_feedback(key)

    def push_feedback(self, key: LoopKey, item: dict[str, Any]) -> None:
        self.guard()
        super().push_feedback(key, item)


def _decode_event(entry_id: bytes | str, fields: dict[Any, Any]) -> dict[str, Any]:
    f = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }
    return {
        "id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        "loop": f.get("loop", ""),
        "kind": f.get("kind", ""),
        "at": float(f.get("at", 0)),
        "data": json.loads(f.get("data", "{}")),
    }
