"""Queue names, the job entry points, and the one way to build queues, jobs and workers.

Two queues so that a long loop never delays a ``/loop-cancel``: a worker takes control
commands first, and ``loopbot worker`` keeps one worker process on the control queue.

A write to Redis must never become code execution in a worker. So every queue, job and
worker is built here, and they:

- serialize job data, results and meta as JSON (RQ's ``JSONSerializer``), never pickle:
  a pickle planted in Redis is undecodable data, not code;
- run only loopbot's own entry points (``job_functions()``): RQ would import and call any
  ``func_name`` it finds in a job, such as ``os.system``. ``LoopbotJob`` refuses any
  other name, an instance method, callbacks and webhooks before anything is imported,
  and the job fails like any failed job (failed registry, logged).

Jobs are run by function reference: ``jobs/entry.py`` registers each kind's function
(``register``), so mypy and a reader can follow every job to the code it runs. What a job
carries in Redis is its kind's wire name (``WIRE_NAMES``), fixed since release 0.1.0 and
independent of where the function lives now: a job queued by one release is run by
another during a rolling deploy, in both directions, so moving a job function to another
module must not rename its jobs. A worker runs a wire name's registered function; RQ never
imports a name from Redis. A process that registered nothing runs nothing but the command
entry point (fail closed).
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from redis import Redis
from rq import Queue, Retry, Worker
from rq.exceptions import DeserializationError
from rq.job import Job
from rq.scripts import _build_hset_args
from rq.serializers import JSONSerializer

from bot.core.commands import ChecksCompleted, Command
from bot.core.formats import JOB_FORMAT, JOB_FORMATS_READ, job_format_problem, queue_name
from bot.core.ids import LoopId
from bot.io.logs import get_logger

log = get_logger("loopbot.queues")

# The queues of this release's job format (bot/core/formats.py): format 1 keeps release
# 0.1.0's names. A worker also works the queues of the older formats it reads.
CONTROL_QUEUE = queue_name("loopbot-control")
LOOP_QUEUE = queue_name("loopbot-loops")
CONTROL_QUEUES = tuple(queue_name("loopbot-control", f) for f in JOB_FORMATS_READ)
ALL_QUEUES = CONTROL_QUEUES + tuple(queue_name("loopbot-loops", f) for f in JOB_FORMATS_READ)
# Every job says which format it is in (its meta); a worker refuses a format it does not run.
JOB_META = {"format": JOB_FORMAT}


class JobKind(StrEnum):
    """The four kinds of loopbot job; ``jobs/entry.py`` says which function runs each."""

    COMMAND = "command"  # a webhook's command: jobs.dispatch.handle_command
    LOOP = "loop"  # the coding loop
    CRITIC = "critic"  # the review
    GATE = "gate"  # the merge gate


# The name the web process enqueues commands by: it must never import ``jobs`` (bot/web
# imports only core and io), so it cannot take the function itself. ``register`` checks
# that jobs/entry.py's command function has exactly this name, which is also its wire name.
COMMAND_ENTRY = "jobs.dispatch.handle_command"

# What each kind of job is called in Redis (job format 1, release 0.1.0's module paths).
# The loop, critic and gate functions have moved into jobs/'s rooms since; their jobs keep
# these names, or a rolling deploy would strand what one release queued for the other.
WIRE_NAMES: dict[JobKind, str] = {
    JobKind.COMMAND: COMMAND_ENTRY,
    JobKind.LOOP: "jobs.loop.run_loop",
    JobKind.CRITIC: "jobs.critic.run_critic",
    JobKind.GATE: "jobs.merge_gate.run_gate",
}

_registered: dict[JobKind, Callable[..., object]] = {}


def job_name(fn: Callable[..., object]) -> str:
    """Where ``fn`` lives: its module and name."""
    return f"{fn.__module__}.{fn.__qualname__}"


def register(kind: JobKind, fn: Callable[..., object]) -> None:
    """Let workers run ``fn`` for ``kind``'s jobs, and let this process enqueue them."""
    name = job_name(fn)
    if "<" in name:  # a lambda or a nested function: not a job function a reader can find
        raise ValueError(f"{name} cannot be a job function: it has no module-level name")
    if kind is JobKind.COMMAND and name != COMMAND_ENTRY:
        raise ValueError(f"the command job must be {COMMAND_ENTRY}, not {name}")
    if _registered.get(kind, fn) is not fn:
        raise ValueError(f"{kind} jobs run {job_name(_registered[kind])} already, not {name}")
    _registered[kind] = fn


def func_name(kind: JobKind) -> str:
    """The name to enqueue ``kind``'s jobs under; ``RefusedJob`` if none is registered."""
    if kind is not JobKind.COMMAND and kind not in _registered:
        raise RefusedJob(f"no {kind} job function is registered in this process: import jobs.entry")
    return WIRE_NAMES[kind]


def kind_of(name: object) -> JobKind | None:
    """Which kind of job the wire name ``name`` is, or None for any other name."""
    return next((k for k in _registered if WIRE_NAMES[k] == name), None)


def job_functions() -> frozenset[str]:
    """Every name a loopbot job may carry here; nothing else is ever run from a job.

    The registered kinds' (none registered: none of them, fail closed) and the command
    entry point, which the web process enqueues without importing ``jobs``.
    """
    return frozenset({COMMAND_ENTRY, *(WIRE_NAMES[k] for k in _registered)})


SERIALIZER = JSONSerializer
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
LOOP_JOB_RETRIES = 3
# A command job is kept this long after it ran: its id (the delivery id) is the dedupe
# record, and GitHub lets people redeliver a delivery for 3 days.
COMMAND_KEEP_SECONDS = 4 * 24 * 3600


class RefusedJob(Exception):
    """A job that loopbot did not write: its function is never imported or called."""


class UndecodableJob(RefusedJob, DeserializationError):
    """Job data that is not JSON (a pickle, say): it stays bytes, it is never loaded."""


UNDECODABLE = "its data is not loopbot's JSON job format"


class LoopbotJob(Job):
    """An RQ job that is always JSON and runs only one of ``job_functions()``."""

    def __init__(
        self, id: str | None = None, connection: Redis | None = None, serializer: Any = None
    ):
        # Whatever the caller passes: loopbot's jobs are JSON, in both directions.
        super().__init__(id, connection=connection, serializer=SERIALIZER)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> LoopbotJob:
        """Enqueueing something a worker would refuse is a bug: fail at the enqueue."""
        job = super().create(*args, **kwargs)
        assert isinstance(job, LoopbotJob)
        refusal = job.refusal()
        if refusal:
            raise RefusedJob(refusal)
        return job

    def refusal(self) -> str | None:
        """Why a worker must not run this job, or None. Imports nothing."""
        try:
            name, instance = self.func_name, self.instance
        except DeserializationError:
            return UNDECODABLE
        if instance is not None:
            return "it calls a method on an object"
        if not isinstance(name, str) or name not in job_functions():
            return f"{str(name)[:200]!r} is not one of loopbot's job functions"
        if (
            self._success_callback_name
            or self._failure_callback_name
            or self._stopped_callback_name
        ):
            return "it has callbacks (loopbot's jobs have none)"
        if self.webhooks:
            return "it has webhooks (loopbot's jobs have none)"
        return job_format_problem(self.meta)

    def _deserialize_data(self) -> None:
        # RQ decodes the data on first use of func_name, args or kwargs; the worker reads
        # func_name before it calls func, so refuse here too, with the same words.
        try:
            super()._deserialize_data()  # type: ignore[no-untyped-call]
        except DeserializationError as exc:
            self.retries_left = 0
            log.error("job.refused", job=self.id, queue=self.origin, reason=UNDECODABLE)
            raise UndecodableJob(f"job {self.id} refused: {UNDECODABLE}") from exc.__cause__

    @property
    def func(self) -> Any:
        refusal = self.refusal()
        if refusal is not None:
            # Fail at once: a retry would only refuse it again.
            self.retries_left = 0
            log.error("job.refused", job=self.id, queue=self.origin, reason=refusal)
            raise RefusedJob(f"job {self.id} refused: {refusal}")
        # The registered function, never an import of a name read from Redis.
        kind = kind_of(self.func_name)
        return super().func if kind is None else _registered[kind]

    # Callbacks and webhooks would be imported or sent by RQ even for a refused job
    # (failure callbacks run on the failure path): loopbot uses none, so there are none.
    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, status: Any, *, exc_string: str | None = None) -> None:
        return None


W = TypeVar("W", bound=Worker)


def make_queue(name: str, redis: Redis) -> Queue:
    """A queue of loopbot's jobs (JSON, ``LoopbotJob``)."""
    return Queue(name, connection=redis, job_class=LoopbotJob, serializer=SERIALIZER)


def control_queue(redis: Redis) -> Queue:
    return make_queue(CONTROL_QUEUE, redis)


def loop_queue(redis: Redis) -> Queue:
    return make_queue(LOOP_QUEUE, redis)


def fetch_job(job_id: str, redis: Redis) -> LoopbotJob:
    """``Job.fetch`` for loopbot's jobs; raises ``NoSuchJobError``. Never runs anything."""
    job = LoopbotJob.fetch(job_id, connection=redis, serializer=SERIALIZER)
    assert isinstance(job, LoopbotJob)
    return job


def waits_where_it_says(job: Job, status: str, redis: Redis) -> bool:
    """Whether a job RQ calls queued or scheduled is where that takes it: in its queue,
    or in its queue's schedule. An entry lost in a failover, or a status written late by a
    replaced job's worker, would otherwise leave its loop waiting for a job that never
    comes. (A queued job a worker is just taking out of its queue looks the same for an
    instant; the reconciler's graces outlast it.)"""
    queue = make_queue(job.origin, redis)
    if status == "queued":
        return redis.lpos(queue.key, job.id) is not None
    if status == "scheduled":
        return redis.zscore(queue.scheduled_job_registry.key, job.id) is not None
    return True


def make_worker(queues: Sequence[str], redis: Redis, cls: type[W]) -> W:
    """An RQ worker of class ``cls`` that decodes JSON and runs only ``LoopbotJob``s."""
    return cls(
        [make_queue(name, redis) for name in queues],
        connection=redis,
        job_class=LoopbotJob,
        queue_class=Queue,
        serializer=SERIALIZER,
    )


class Duplicate(Exception):
    """This delivery, or the same body under another delivery id, was enqueued before."""


class Replay(Duplicate):
    """The same signed body as an earlier delivery, under a new delivery id."""


def command_job_id(delivery: str) -> str:
    """The delivery id as an RQ job id (which allows only ``[A-Za-z0-9_-]``)."""
    if _SAFE_ID.match(delivery):
        return f"cmd-{delivery}"
    return "cmd-h" + hashlib.sha256(delivery.encode()).hexdigest()[:40]


def body_key(body_sha256: str) -> str:
    """Which delivery (as its job id) first carried a body with this SHA-256."""
    return f"loopbot:webhook:body:{body_sha256}"


# How a delivery becomes a dispatch job: one Lua script, so one Redis round trip, that
# 1. refuses a body an earlier delivery carried under another delivery id (-1), and
#    records the body's hash (KEYS[3]) for as long as the delivery id is deduped;
# 2. refuses a job id (the delivery id) that exists (0): RQ's unique enqueue;
# 3. writes the job hash exactly as RQ's ``Queue.enqueue`` would, pushes the id onto the
#    queue and registers the queue in RQ's set of queues (KEYS[4]).
# Building an RQ ``Job`` per request (uuid, datetimes, to_dict, ~50 arguments to pack)
# cost three times the Redis round trip. So RQ builds one template job when the
# enqueuer is made; the fields a delivery changes (data, description, timestamps) are
# the script's arguments and the rest are constants written into the script's source.
# tests/io/test_webhook.py compares the hash with the one RQ writes for the same job.
_PER_JOB_FIELDS = ("data", "description", "created_at", "enqueued_at")
_ENQUEUE_SCRIPT = """
    if ARGV[6] ~= "" then
        local first = redis.call("GET", KEYS[3])
        if first and first ~= ARGV[1] then
            return -1
        end
    end
    if redis.call("EXISTS", KEYS[1]) == 1 then
        return 0
    end
    if ARGV[6] ~= "" then
        redis.call("SET", KEYS[3], ARGV[1], "EX", %(keep)d)
    end
    redis.call("HSET", KEYS[1], "data", ARGV[2], "description", ARGV[3],
        "created_at", ARGV[4], "enqueued_at", ARGV[5]%(constants)s)
    redis.call("RPUSH", KEYS[2], ARGV[1])
    redis.call("SADD", KEYS[4], KEYS[2])
    return 1
"""


def _lua_string(value: str | bytes) -> str:
    """``value`` as a Lua string literal: every byte but a few plain ones as ``\\ddd``."""
    raw = value.encode() if isinstance(value, str) else value
    plain = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:, []"
    return '"' + "".join(chr(b) if b in plain else f"\\{b:03d}" for b in raw) + '"'


def _job_options(delivery: str, description: str) -> dict[str, Any]:
    return {
        "job_id": command_job_id(delivery),
        "result_ttl": COMMAND_KEEP_SECONDS,
        "failure_ttl": 7 * 24 * 3600,
        # A dispatch job only reads GitHub and enqueues; retrying it is safe, and a
        # GitHub outage should not drop a maintainer's request.
        "retry": Retry(max=3, interval=[10, 60, 300]),
        "description": description,
        "timeout": 300,
        "meta": JOB_META,
    }


def _description(command: Command) -> str:
    # Not a loop key: a command on a pull request may not know its issue yet (issue 0).
    return f"{command.kind} {command.repo} issue {command.issue} by {command.actor}"


# What RQ's JSONSerializer writes for the call (COMMAND_ENTRY, None, (args,), {}), with
# the one argument spliced in: json.dumps of the whole tuple walks it in Python.
_CALL_HEAD = json.dumps([COMMAND_ENTRY, None])[:-1] + ", ["
_CALL_TAIL = "], {}]"


def _job_data(command: Command) -> bytes:
    """What RQ stores as ``data`` for the command job: a zlib stream of the JSON call.

    RQ reads it with ``zlib.decompress``, which takes any window size and level. A
    default ``zlib.compress`` sets up a 32 KB window and searches it for a few hundred
    bytes of JSON: about 30 µs of the webhook's time, most of the job format's cost, to
    save some 100 bytes. Stored blocks (level 0) in a 512-byte window give RQ the same
    bytes back in under 1 µs (bench/webhook.py).
    """
    arg = json.dumps(command.model_dump_json())
    packer = zlib.compressobj(0, zlib.DEFLATED, 9, 1)
    return packer.compress(f"{_CALL_HEAD}{arg}{_CALL_TAIL}".encode()) + packer.flush()


def _stamp(moment: datetime | None = None) -> str:
    """RQ's timestamp for ``moment`` (UTC, now by default), as ``rq.utils.utcformat``
    writes it (``%Y-%m-%dT%H:%M:%S.%fZ``), without strftime's cost."""
    return (moment or datetime.now(UTC)).isoformat(timespec="microseconds")[:-6] + "Z"


def rq_job_fields(queue: Queue, command: Command) -> dict[str, bytes]:
    """The job hash RQ itself writes when it enqueues ``command``: the reference."""
    job = queue.create_job(
        COMMAND_ENTRY,
        args=(command.model_dump_json(),),
        **_job_options(command.delivery, _description(command)),
    )
    queue._prepare_for_queue(job)
    args = _build_hset_args(job)  # type: ignore[no-untyped-call]
    return {
        str(k): v if isinstance(v, bytes) else str.encode(v)
        for k, v in zip(args[::2], args[1::2], strict=True)
    }


class CommandEnqueuer:
    """Enqueue dispatch jobs for one queue, each in one Redis round trip (see above)."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.script: Any = None  # built on first use: RQ asks Redis its version

    def _script(self) -> Any:
        if self.script is None:
            template = rq_job_fields(self.queue, _TEMPLATE_COMMAND)
            if "ttl" in template or template["status"] != b"queued":
                raise RuntimeError("RQ's job format changed: re-check CommandEnqueuer")
            constants = "".join(
                f", {_lua_string(k)}, {_lua_string(v)}"
                for k, v in template.items()
                if k not in _PER_JOB_FIELDS
            )
            source = _ENQUEUE_SCRIPT % {"keep": COMMAND_KEEP_SECONDS, "constants": constants}
            self.script = self.queue.connection.register_script(source)
        return self.script

    def enqueue(self, command: Command, body_sha256: str | None = None) -> str:
        """Enqueue ``command``; raises ``Duplicate`` (or ``Replay``) and writes nothing.

        The job id is the delivery id (``command_job_id``), so GitHub's redelivery of a
        delivery is ``Duplicate``. With ``body_sha256`` (the raw webhook body's hash) the
        same body under another delivery id is a ``Replay``: GitHub's own redeliveries
        keep the id, and two real events never have byte-identical bodies.
        """
        job_id = command_job_id(command.delivery)
        stamp = _stamp()
        result = self._script()(
            keys=[
                Job.key_for(job_id),
                self.queue.key,
                body_key(body_sha256) if body_sha256 else "",
                self.queue.redis_queues_keys,
            ],
            args=[
                job_id,
                _job_data(command),
                _description(command),
                stamp,
                stamp,
                body_sha256 or "",
            ],
        )
        if result == -1:
            raise Replay(command.delivery)
        if result == 0:
            raise Duplicate(command.delivery)
        return job_id


_TEMPLATE_COMMAND = ChecksCompleted(
    installation_id=1, repo="o/r", issue=1, actor="a", delivery="template", head_sha="0" * 40
)


def enqueue_command(queue: Queue, command: Command, body_sha256: str | None = None) -> str:
    """``CommandEnqueuer(queue).enqueue``, for callers that enqueue once."""
    return CommandEnqueuer(queue).enqueue(command, body_sha256)


def enqueue_loop_job(redis: Redis, loop: LoopId) -> None:
    """Enqueue ``loop``'s one coding job, under its own job id (``LoopId.job_id``)."""
    loop_queue(redis).enqueue(
        func_name(JobKind.LOOP),
        loop.repo,
        loop.issue,
        job_id=loop.job_id,
        job_timeout=6 * 3600,
        result_ttl=7 * 24 * 3600,
        failure_ttl=7 * 24 * 3600,
        description=f"loop {loop.key}",
        meta=JOB_META,
        # Transient failures (GitHub down, a git timeout) retry the job; the loop's own
        # error budget (jobs.loop.job.MAX_ERRORS) decides when to give up.
        retry=Retry(max=LOOP_JOB_RETRIES, interval=[15, 60, 180]),
    )


def enqueue_critic(redis: Redis, repo: str, issue: int) -> None:
    loop_queue(redis).enqueue(
        func_name(JobKind.CRITIC),
        repo,
        issue,
        job_timeout=1800,
        retry=Retry(max=2, interval=30),
        description=f"critic {LoopId(repo, issue).key}",
        meta=JOB_META,
    )


def enqueue_gate(redis: Redis, repo: str, issue: int, *, after: float = 0.0) -> None:
    """Wake the merge gate now, or ``after`` seconds from now (needs RQ's scheduler)."""
    name = func_name(JobKind.GATE)
    description = f"merge gate {LoopId(repo, issue).key}"
    kwargs: dict[str, object] = {
        "job_timeout": 600,
        "description": description,
        "meta": JOB_META,
    }
    if after:
        loop_queue(redis).enqueue_in(timedelta(seconds=after), name, repo, issue, **kwargs)
    else:
        loop_queue(redis).enqueue(name, repo, issue, **kwargs)
