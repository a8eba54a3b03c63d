"""Queue names and the one enqueue used by the web process.

Two queues so that a long loop never delays a ``/loop-cancel``: a worker takes control
commands first, and ``loopbot worker`` keeps one worker process on the control queue.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta

from redis import Redis
from rq import Queue, Retry
from rq.exceptions import DuplicateJobError

from bot.commands import Command

CONTROL_QUEUE = "loopbot-control"
LOOP_QUEUE = "loopbot-loops"
ALL_QUEUES = (CONTROL_QUEUE, LOOP_QUEUE)

DISPATCH = "jobs.dispatch.handle_command"
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
# A command job is kept this long after it ran: its id (the delivery id) is the dedupe
# record, and GitHub lets people redeliver a delivery for 3 days.
COMMAND_KEEP_SECONDS = 4 * 24 * 3600


class Duplicate(Exception):
    """This delivery was enqueued before."""


def control_queue(redis: Redis) -> Queue:
    return Queue(CONTROL_QUEUE, connection=redis)


def loop_queue(redis: Redis) -> Queue:
    return Queue(LOOP_QUEUE, connection=redis)


def command_job_id(delivery: str) -> str:
    """The delivery id as an RQ job id (which allows only ``[A-Za-z0-9_-]``)."""
    if _SAFE_ID.match(delivery):
        return f"cmd-{delivery}"
    return "cmd-h" + hashlib.sha256(delivery.encode()).hexdigest()[:40]


def enqueue_command(queue: Queue, command: Command) -> str:
    """Enqueue ``command`` for the dispatcher, once per delivery.

    The job id is derived from the delivery id and enqueued with RQ's atomic unique
    enqueue (check, save and push in one Lua script): the dedupe and the enqueue are one
    Redis round trip, and there is no moment where one happened without the other.
    Raises ``Duplicate`` for a delivery seen before.
    """
    job_id = command_job_id(command.delivery)
    try:
        job = queue.enqueue(
            DISPATCH,
            command.model_dump_json(),
            job_id=job_id,
            unique=True,
            job_timeout=300,
            result_ttl=COMMAND_KEEP_SECONDS,
            failure_ttl=7 * 24 * 3600,
            # A dispatch job only reads GitHub and enqueues; retrying it is safe, and a
            # GitHub outage should not drop a maintainer's request.
            retry=Retry(max=3, interval=[10, 60, 300]),
            description=f"{command.kind} {command.repo}#{command.issue} by {command.actor}",
        )
    except DuplicateJobError:
        raise Duplicate(command.delivery) from None
    return str(job.id)


CRITIC_JOB = "jobs.critic.run_critic"
GATE_JOB = "jobs.merge_gate.run_gate"


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
