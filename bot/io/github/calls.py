"""How a GitHub call is tried and a listing is read: the retry loop that acts on
``bot.io.github.failures.classify``, and paging. Shared by the App (bot/io/github/app.py)
and its installations (bot/io/github/plumbing.py), below both."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from githubkit.exception import GitHubException
from httpx import TransportError

from bot.io.github.failures import Fatal, GitHubError, Reauthenticate, RetryAfter, classify
from bot.io.logs import get_logger

log = get_logger("loopbot.github")


def _with_retries(
    fn: Callable[[], Any],
    max_wait: float,
    sleep: Callable[[float], None],
    on_reauth: Callable[[], None] | None = None,
) -> Any:
    attempt = 0
    while True:
        try:
            return fn()
        except (GitHubException, TransportError) as exc:
            decision = classify(exc, attempt, max_wait=max_wait)
        if isinstance(decision, Fatal):
            raise decision.error
        if isinstance(decision, Reauthenticate):
            if on_reauth is None:
                raise GitHubError("401 from GitHub with App credentials", 401)
            on_reauth()
        elif isinstance(decision, RetryAfter):
            log.warning("github.retry", why=decision.why, after=decision.seconds, attempt=attempt)
            sleep(decision.seconds)
        attempt += 1


def _pages(fetch: Callable[[int], Any], max_wait: float) -> Iterator[dict[str, Any]]:
    n = 1
    while True:
        data = _with_retries(partial(fetch, n), max_wait, time.sleep)
        if isinstance(data, dict):  # e.g. {"total_count": .., "repositories": [..]}
            data = next((v for v in data.values() if isinstance(v, list)), [])
        yield from data
        if len(data) < 100:
            return
        n += 1
