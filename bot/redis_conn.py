"""One way to connect to Redis: with retries that ride out a restart or a dropped link."""

from __future__ import annotations

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

# About 30 s of retrying (0.1 s doubling to 2 s, 20 times): long enough for a Redis
# restart or failover, short enough that a dead Redis surfaces as an error.
RETRIES = 20


def connect(url: str, *, retries: int = RETRIES, timeout: float | None = None) -> Redis:
    return Redis.from_url(
        url,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=30,
        socket_timeout=timeout,
        socket_connect_timeout=timeout or 5,
    )
