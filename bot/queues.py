"""Queue names, the job entry points, and the one way to build queues, jobs and workers.

Two queues so that a long loop never delays a ``/loop-cancel``: a worker takes control
commands first, and ``loopbot worker`` keeps one worker process on the control queue.

A write to Redis must never become code execution in a worker. So every queue, job and
worker is built here, and they:

- serialize job data, results and meta as JSON (RQ's ``JSONSerializer``), never pickle:
  a pickle planted in Redis is undecodable data, not code;
- run only loopbot's own entry points (``JOB_FUNCTIONS``): RQ would import and call any
  ``func_name`` it finds in a job, such as ``os.system``. ``LoopbotJob`` refuses any
  other name, an instance method, callbacks and webhooks before anything is imported,
  and the job fails like any failed job (failed registry, logged).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

from redis import Redis
from rq import Queue, Retry, Worker
from rq.exceptions import DeserializationError, DuplicateJobError
from rq.job import Job
from rq.scripts import UNIQUE_ENQUEUE_SCRIPT, _build_hset_args
from rq.serializers import JSONSerializer

from bot.commands import Command
from bot.logs import get_logger

log = get_logger("loopbot.queues")

CONTROL_QUEUE = "loopbot-control"
LOOP_QUEUE = "loopbot-loops"
ALL_QUEUES = (CONTROL_QUEUE, LOOP_QUEUE)

# Every function a loopbot job may run. Nothing else is ever imported from a job.
DISPATCH = "jobs.dispatch.handle_command"
LOOP_JOB = "jobs.loop.run_loop"
CRITIC_JOB = "jobs.critic.run_critic"
GATE_JOB = "jobs.merge_gate.run_gate"
JOB_FUNCTIONS = frozenset({DISPATCH, LOOP_JOB, CRITIC_JOB, GATE_JOB})

SERIALIZER = JSONSerializer
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# A command job is kept this long after it ran: its id (the delivery id) is the dedupe
# record, and GitHub lets people redeliver a delivery for 3 days.
COMMAND_KEEP_SECONDS = 4 * 24 * 3600


class RefusedJob(Exception):
    """A job that loopbot did not write: its function is never imported or called."""


class UndecodableJob(RefusedJob, DeserializationError):
    """Job data that is not JSON (a pickle, say): it stays bytes, it is never loaded."""


UNDECODABLE = "its data is not loopbot's JSON job format"


class LoopbotJob(Job):
    """An RQ job that is always JSON and runs only one of ``JOB_FUNCTIONS``."""

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
        if name not in JOB_FUNCTIONS:
            return f"{str(name)[:200]!r} is not one of loopbot's job functions"
        if (
            self._success_callback_name
            or self._failure_callback_name
            or self._stopped_callback_name
        ):
            return "it has callbacks (loopbot's jobs have none)"
        if self.webhooks:
            return "it has webhooks (loopbot's jobs have none)"
        return None

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
        return super().func

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


# RQ's own atomic unique enqueue (check the job key, HSET the job, EXPIRE, push), with
# loopbot's two extra steps in front, in the same script and so the same round trip:
# the body-hash record (KEYS[3]) and the queue's entry in RQ's set of queues (KEYS[4]).
# The body record holds the job id of the first delivery that carried the body: the same
# delivery again (GitHub's redeliver, or a retry after a 503) goes on to RQ's check, and a
# different delivery id with the same body is a replay (-1). The record lives as long as
# the dedupe on the delivery id.
_ENQUEUE_SCRIPT = (
    f"""
    local first = redis.call("GET", KEYS[3])
    if first and first ~= ARGV[1] then
        return -1
    end
    redis.call("SET", KEYS[3], ARGV[1], "EX", {COMMAND_KEEP_SECONDS})
    redis.call("SADD", KEYS[4], KEYS[2])
    """
    + UNIQUE_ENQUEUE_SCRIPT
)


def enqueue_command(queue: Queue, command: Command, body_sha256: str | None = None) -> str:
    """Enqueue ``command`` for the dispatcher, once per delivery and once per body.

    The job id is derived from the delivery id and enqueued with RQ's atomic unique
    enqueue (check, save and push in one Lua script): the dedupe and the enqueue are one
    Redis round trip, and there is no moment where one happened without the other.
    With ``body_sha256`` (the webhook's raw body) the same script also refuses a body
    that an earlier delivery carried under another delivery id (``Replay``).
    Raises ``Duplicate`` for a delivery seen before.
    """
    job_id = command_job_id(command.delivery)
    options: dict[str, Any] = {
        "job_id": job_id,
        "result_ttl": COMMAND_KEEP_SECONDS,
        "failure_ttl": 7 * 24 * 3600,
        # A dispatch job only reads GitHub and enqueues; retrying it is safe, and a
        # GitHub outage should not drop a maintainer's request.
        "retry": Retry(max=3, interval=[10, 60, 300]),
        "description": f"{command.kind} {command.repo}#{command.issue} by {command.actor}",
    }
    if body_sha256 is None:
        try:
            job = queue.enqueue(
                DISPATCH, command.model_dump_json(), job_timeout=300, unique=True, **options
            )
        except DuplicateJobError:
            raise Duplicate(command.delivery) from None
        return str(job.id)
    # What Queue.enqueue(..., unique=True) does for a job without dependencies, with
    # loopbot's script in place of RQ's (see _ENQUEUE_SCRIPT).
    job = queue.create_job(DISPATCH, args=(command.model_dump_json(),), timeout=300, **options)
    queue._prepare_for_queue(job)
    conn = queue.connection
    script = conn.register_script(_ENQUEUE_SCRIPT)
    ttl = job.ttl if job.ttl is not None else -1
    result = script(
        keys=[job.key, queue.key, body_key(body_sha256), queue.redis_queues_keys],
        args=[job.id, "R", ttl, *_build_hset_args(job)],  # type: ignore[no-untyped-call]
    )
    if result == -1:
        raise Replay(command.delivery)
    if result == 0:
        raise Duplicate(command.delivery)
    return str(job.id)


def enqueue_critic(redis: Redis, repo: str, issue: int) -> None:
    loop_queue(redis).enqueue(
        CRITIC_JOB,
        repo,
        issue,
        job_timeout=1800,
        retry=Retry(max=2, interval=30),
        description=f"critic {repo}#{issue}",
    )


def enqueue_gate(redis: Redis, repo: str, issue: int, *, after: float = 0.0) -> None:
    """Wake the merge gate now, or ``after`` seconds from now (needs RQ's scheduler)."""
    kwargs: dict[str, object] = {"job_timeout": 600, "description": f"merge gate {repo}#{issue}"}
    if after:
        loop_queue(redis).enqueue_in(timedelta(seconds=after), GATE_JOB, repo, issue, **kwargs)
    else:
        loop_queue(redis).enqueue(GATE_JOB, repo, issue, **kwargs)
