"""The one place that sorts GitHub failures: retry after N seconds, re-authenticate, or fatal.

Pure: it looks at an exception and the attempt number and returns a decision. The
client acts on it (``bot.io.github.calls``, its retry loop). Callers only ever see the
exception tree below.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
from githubkit.exception import (
    GitHubException,
    RateLimitExceeded,
    RequestError,
    RequestFailed,
    RequestTimeout,
)
from redis.exceptions import RedisError

MAX_ATTEMPTS = 6


class GitHubError(Exception):
    """A GitHub call failed for good. ``status`` is the HTTP status, 0 for no answer."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFound(GitHubError):
    pass


class Forbidden(GitHubError):
    pass


class Unprocessable(GitHubError):
    """422: GitHub understood the request and refused it (validation, already exists)."""


class Conflict(GitHubError):
    """409 (or 405 on merge): the resource changed under us."""


class Unavailable(GitHubError):
    """GitHub kept failing (5xx, rate limits, timeouts) past the retry budget."""


@dataclass(frozen=True)
class RetryAfter:
    seconds: float
    why: str


@dataclass(frozen=True)
class Reauthenticate:
    """401: the installation token was revoked or expired early; mint a new one once."""


@dataclass(frozen=True)
class Fatal:
    error: GitHubError


Decision = RetryAfter | Reauthenticate | Fatal


def _backoff(attempt: int) -> float:
    return float(min(2**attempt, 30))


def message_of(exc: RequestFailed) -> str:
    """GitHub's ``message`` in a failed answer (or its status line)."""
    try:
        data = exc.response.json()
        if isinstance(data, dict) and "message" in data:
            return str(data["message"])
    except ValueError:
        pass
    return exc.response.text[:200]


SECONDARY_WAIT = 60.0  # GitHub's docs: wait at least a minute when no Retry-After is given


def classify(exc: Exception, attempt: int, *, max_wait: float) -> Decision:
    """Decide what to do about ``exc`` on the ``attempt``-th try (0-based)."""
    last = attempt + 1 >= MAX_ATTEMPTS
    if isinstance(exc, RequestError) and isinstance(exc.exc, GitHubError):
        return Fatal(exc.exc)  # raised in the request's own hooks (the pace): as it is
    if isinstance(exc, RequestError) and isinstance(exc.exc, RedisError):
        raise exc.exc  # the pace's store is down: a Redis failure, not GitHub's
    if isinstance(exc, RateLimitExceeded):
        wait = max(exc.retry_after.total_seconds(), 1.0)
        if wait > max_wait or last:
            return Fatal(Unavailable(f"rate limited for {wait:.0f}s", exc.response.status_code))
        return RetryAfter(wait, "rate limit")
    if isinstance(exc, RequestFailed):
        status = exc.response.status_code
        msg = f"{exc.request.method} {exc.request.url.path}: {status} {message_of(exc)}"
        if status >= 500:
            if last:
                return Fatal(Unavailable(msg, status))
            return RetryAfter(_backoff(attempt), f"server error {status}")
        if status == 401:
            return Fatal(GitHubError(msg, status)) if attempt > 0 else Reauthenticate()
        if status == 404:
            return Fatal(NotFound(msg, status))
        if status in (403, 429) and "secondary rate limit" in message_of(exc).lower():
            # A secondary limit without Retry-After (githubkit raises RateLimitExceeded
            # only with one): wait as GitHub's docs ask; the pace pauses the others.
            if max_wait < SECONDARY_WAIT or last:
                return Fatal(Unavailable(msg, status))
            return RetryAfter(SECONDARY_WAIT, "secondary rate limit")
        if status == 403:
            return Fatal(Forbidden(msg, status))
        if status == 422:
            return Fatal(Unprocessable(msg, status))
        if status in (405, 409):
            return Fatal(Conflict(msg, status))
        return Fatal(GitHubError(msg, status))
    if isinstance(exc, RequestTimeout | httpx.TransportError) or (
        isinstance(exc, RequestError) and isinstance(exc.exc, httpx.TransportError)
    ):
        if last:
            return Fatal(Unavailable(f"no answer from GitHub: {exc!r}"))
        return RetryAfter(_backoff(attempt), "no answer")
    if isinstance(exc, GitHubException):
        return Fatal(GitHubError(repr(exc)))
    raise exc


# -- what a public comment may say about an internal failure ----------------------------------

_REASONS = (
    # (class name anywhere in the exception's MRO, the short public reason)
    ("GitHubError", "a GitHub API call failed"),
    ("GitError", "a git operation failed"),
    ("SandboxUnavailable", "the sandbox could not run"),
    ("APIError", "the model API call failed"),
    ("RedisError", "the state store (Redis) failed"),
    ("OSError", "a file system operation failed"),
)


def new_error_id() -> str:
    """A short id that ties a public reason to the full error in the logs and events."""
    return uuid.uuid4().hex[:8]


def public_reason(exc: BaseException) -> str:
    """A short, fixed reason for ``exc``: never its message, which may hold paths or tokens."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    for name, reason in _REASONS:
        if name in names:
            status = getattr(exc, "status", 0) if name == "GitHubError" else 0
            return f"{reason} (HTTP {status})" if isinstance(status, int) and status else reason
    return "an internal error"


def public_error(exc: BaseException, error_id: str) -> str:
    """What a GitHub comment says about ``exc``: a short reason and the id to look up."""
    return f"{public_reason(exc)} (error id {error_id}; details in the worker log)"
