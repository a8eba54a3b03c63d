"""The critic's and the gate's way through failures: retry what may pass, then give up
in a way that ends the loop instead of stranding it in ``reviewing`` or ``merging``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anthropic

from bot.io.github.failures import GitHubError, Unavailable, new_error_id, public_error
from bot.io.logs import get_logger
from bot.io.store import Store

log = get_logger("loopbot.retries")

T = TypeVar("T")


def with_retries(
    run_once: Callable[[], T],
    give_up: Callable[[str, int], T],
    *,
    kind: str,
    key: str,
    store: Store,
    attempts: int,
    backoff: tuple[float, ...],
    fatal: tuple[type[BaseException], ...] = (),
    pause: Callable[[float], object] = time.sleep,
) -> T:
    """Run one critic or gate pass (or a section audit); retry what ``transient`` says may
    pass, with pauses (``pause``: how to wait, ``time.sleep`` unless the caller can be
    woken, as a draining loop can).

    Every failure goes whole to the log and the event stream (``{kind}_error``, with an
    error id). When it is final, ``give_up`` gets only a short public reason with that
    id, which is what GitHub shows: no paths, tokens or exception messages. ``fatal``
    errors pass through untouched (a lost lease: nothing more may be written).
    """
    for attempt in range(attempts):
        try:
            return run_once()
        except fatal:
            raise
        except Exception as exc:
            error_id = new_error_id()
            error = f"{type(exc).__name__}: {exc}"[:300]
            again = transient(exc) and attempt + 1 < attempts
            log.warning(
                f"{kind}.error",
                loop=key,
                attempt=attempt + 1,
                error=error,
                error_id=error_id,
                exc_info=exc,
            )
            store.event(
                key,
                f"{kind}_error",
                attempt=attempt + 1,
                error=error,
                error_id=error_id,
                retry=again,
            )
            if not again:
                return give_up(public_error(exc, error_id), attempt + 1)
            pause(backoff[min(attempt, len(backoff) - 1)])
    raise AssertionError("unreachable")


def transient(exc: BaseException) -> bool:
    """Whether trying again later may succeed: GitHub or the model down, slow or rate
    limiting (after the client's own retries). Anything else fails the same way again."""
    if isinstance(exc, GitHubError):
        return isinstance(exc, Unavailable) or exc.status == 0 or exc.status >= 500
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 429)
    return isinstance(exc, anthropic.APIConnectionError)
