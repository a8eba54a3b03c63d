"""A critic or gate job whose worker was SIGKILLed stays in RQ's started registry until
someone cleans it up, and a clean-up retries it: it is fetched, counted down and saved
again. Whoever does that must read and write it as loopbot's JSON. Reading the registry
with RQ's default (pickle) serializer once rewrote such a job's meta as a pickle, and the
RQ scheduler, meeting it at its retry time, raised on it and died: every retry on that
worker waited for ever, and the loops it held stayed ``reviewing`` with no lease
(found by bench/chaos.py, seed 811632: 7 loops of 24)."""

from __future__ import annotations

from redis import Redis
from rq.executions import Execution
from rq.scheduler import RQScheduler

from bot.io import queues
from bot.io.queues import LOOP_QUEUE, JobKind, LoopbotJob
from jobs import lifecycle


def abandoned_critic(redis: Redis) -> LoopbotJob:
    """A critic job a worker took and died running: its execution's time ran out."""
    queues.enqueue_critic(redis, "acme/widgets", 7)
    queue = queues.loop_queue(redis)
    job = queue.fetch_job(queue.get_job_ids()[0])
    assert isinstance(job, LoopbotJob)
    queue.remove(job.id)
    with redis.pipeline() as pipe:
        Execution.create(job, ttl=1, pipeline=pipe, worker_name="gone")
        pipe.execute()
    # Its time ran out: the score in the started registry is in the past.
    key = queue.started_job_registry.key
    for member in redis.zrange(key, 0, -1):
        redis.zadd(key, {member: 1})
    return job


def test_an_abandoned_stage_job_is_retried_in_loopbot_s_json_and_the_scheduler_runs_it(
    redis: Redis,
) -> None:
    job = abandoned_critic(redis)
    found = lifecycle.pending_stage_jobs(redis)  # the reconciler's look: it cleans up
    # Retried by the clean-up: scheduled, so still pending (not lost, not doubled).
    assert (JobKind.CRITIC, "acme/widgets", 7) in found
    scheduled = queues.loop_queue(redis).scheduled_job_registry
    assert scheduled.get_job_ids() == [job.id]
    again = queues.loop_queue(redis).fetch_job(job.id)
    assert isinstance(again, LoopbotJob)
    assert again.meta == queues.JOB_META  # JSON, as written: not {'unserialized': ...}
    assert again.refusal() is None  # a worker would still run it
    # At its retry time the scheduler moves it to the queue (it raised here, and died).
    redis.zadd(scheduled.key, {job.id: 1})
    scheduler = RQScheduler([LOOP_QUEUE], connection=redis, serializer=queues.SERIALIZER)
    scheduler.acquire_locks()
    try:
        scheduler.enqueue_scheduled_jobs()
    finally:
        scheduler.release_locks()
    assert queues.loop_queue(redis).get_job_ids() == [job.id]
