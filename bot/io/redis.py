"""One way to connect to Redis: with retries that ride out a restart or a dropped link.

Every process (web, worker, control lane, CLI, doctor, dashboard) connects through
``connect``. ``REDIS_URL`` may carry credentials and TLS, as redis-py reads them:

- ``redis://:PASSWORD@host:6379/0`` or ``redis://USER:PASSWORD@host:6379/0``
- ``rediss://host:6380/0?ssl_ca_certs=/path/ca.pem`` (TLS; ``ssl_cert_reqs``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` work the same way)
- ``unix:///run/redis/redis.sock?db=0``

A password never reaches a log line or an error message: ``mask_url`` is what an
operator sees, and ``check`` turns a failed first contact into one line that names
``REDIS_URL``. Wrong credentials and TLS failures are not retried: waiting does not
fix them, and retrying them only hides the cause for minutes.
"""

from __future__ import annotations

import ssl
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    RedisError,
    ResponseError,
    TimeoutError,
)
from redis.retry import Retry

from bot.core.redis_url import check_url, mask_url, scrub
from bot.io.logs import get_logger

# About 30 s of retrying (0.1 s doubling to 2 s, 20 times): long enough for a Redis
# restart or failover, short enough that a dead Redis surfaces as an error.
RETRIES = 20
T = TypeVar("T")
log = get_logger("loopbot.redis")


class RedisProblem(Exception):
    """Redis cannot be used with this ``REDIS_URL``; the message is one line, no password.

    ``permanent``: waiting will not help (wrong credentials, TLS, a malformed URL).
    """

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


_TRANSIENT_TLS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


def _tls_error(exc: BaseException) -> ssl.SSLError | None:
    return next(
        (
            e
            for e in _chain(exc)
            if isinstance(e, ssl.SSLError) and not isinstance(e, _TRANSIENT_TLS)
        ),
        None,
    )


def permanent_error(exc: BaseException) -> bool:
    """Waiting cannot fix it: refused credentials, or a TLS handshake that failed."""
    for e in _chain(exc):
        if isinstance(e, AuthenticationError | AuthorizationError):
            return True
        if isinstance(e, ResponseError) and str(e).startswith(("WRONGPASS", "NOAUTH", "NOPERM")):
            return True
    return _tls_error(exc) is not None


class _Retry(Retry):
    """redis-py's retry, minus the errors that retrying cannot fix.

    ``AuthenticationError`` is a ``ConnectionError`` to redis-py, so a wrong password
    would otherwise be retried (at two levels) for many minutes before anyone sees it.
    """

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        def once() -> T:
            try:
                return do()
            except (ConnectionError, TimeoutError) as exc:
                if permanent_error(exc):
                    raise _Permanent(exc) from exc
                raise

        try:
            return super().call_with_retry(once, fail, *args, **kwargs)
        except _Permanent as wrapped:
            # No ``fail`` (disconnect) needed: redis-py closes the socket itself when the
            # handshake or AUTH fails, before the error reaches this retry.
            error = wrapped.error
        # Raised outside the handler, so its own context (the ssl.SSLError) is kept.
        raise error


class _Permanent(Exception):
    def __init__(self, error: RedisError) -> None:
        super().__init__(str(error))
        self.error = error


def connect(url: str, *, retries: int = RETRIES, timeout: float | None = None) -> Redis:
    """A client for ``url``; it connects on first use (``check`` does that at start-up)."""
    check_url(url)
    return Redis.from_url(
        url,
        retry=_Retry(ExponentialBackoff(cap=2.0, base=0.1), retries),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=30,
        socket_timeout=timeout,
        socket_connect_timeout=timeout or 5,
    )


def explain(url: str, exc: BaseException) -> str:
    """One line for the operator: what went wrong with ``REDIS_URL``, password masked."""
    shown = f"REDIS_URL ({mask_url(url)})"
    detail = scrub(str(exc).strip().rstrip("."), url) or type(exc).__name__
    tls = _tls_error(exc)
    if tls is not None:
        reason = getattr(tls, "reason", None) or str(tls)
        if isinstance(tls, ssl.SSLCertVerificationError) and tls.verify_message:
            reason = f"{reason}: {tls.verify_message}"
        reason = scrub(reason, url)
        return f"{shown}: TLS handshake failed ({reason}); check ssl_ca_certs and the host name"
    if isinstance(exc, AuthenticationError | AuthorizationError) or permanent_error(exc):
        return f"{shown}: Redis refused the credentials ({detail}); check the user and password"
    if isinstance(exc, ValueError):
        return f"{shown}: {detail}"
    if _tls_file_missing(url, exc):
        return f"{shown}: cannot read a TLS file ({detail}); check the ssl_* paths"
    hint = ""
    closed = ("closed by server", "reset by peer")
    if url.lower().startswith("redis://") and any(c in detail.lower() for c in closed):
        hint = " (does this server want TLS? then use rediss://)"
    return f"{shown}: cannot reach Redis ({detail}){hint}"


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not seen for seen in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _tls_file_missing(url: str, exc: BaseException) -> bool:
    """``rediss://`` with an ``ssl_ca_certs`` (or cert, key) file that cannot be read."""
    unreadable = (FileNotFoundError, PermissionError, IsADirectoryError)
    return url.lower().startswith("rediss://") and any(
        isinstance(e, unreadable) for e in _chain(exc)
    )


def check(url: str, *, wait: float = 0.0, timeout: float = 5.0) -> None:
    """First contact at start-up: PING ``url``; raise ``RedisProblem`` with a clear line.

    A Redis that does not answer yet is tried again for up to ``wait`` seconds (it may be
    starting alongside us); refused credentials and TLS failures fail at once.
    """
    try:
        check_url(url)
    except ValueError as exc:
        raise RedisProblem(f"REDIS_URL ({mask_url(url)}): {exc}", permanent=True) from None
    deadline = time.monotonic() + wait
    while True:
        probe: Redis | None = None
        try:
            probe = connect(url, retries=0, timeout=timeout)
            probe.ping()
            return
        except (RedisError, OSError, ValueError) as exc:
            permanent = (
                permanent_error(exc) or isinstance(exc, ValueError) or _tls_file_missing(url, exc)
            )
            if permanent or time.monotonic() >= deadline:
                raise RedisProblem(explain(url, exc), permanent=permanent) from None
        finally:
            if probe is not None:
                probe.close()
        time.sleep(0.5)


def check_at_startup(url: str, who: str, *, wait: float = 0.0, tolerate_down: bool = False) -> None:
    """``check`` for a process entry point: a problem ends it with one line on stderr.

    ``tolerate_down``: only what cannot heal (refused credentials, TLS, a bad URL) stops
    the process; an unreachable Redis is logged and start-up goes on (the web answers
    503 until Redis is back, and GitHub redelivers).
    """
    try:
        check(url, wait=wait)
    except RedisProblem as exc:
        if tolerate_down and not exc.permanent:
            log.warning("redis.unavailable", error=str(exc))
            return
        sys.stderr.write(f"{who}: {exc}\n")
        raise SystemExit(2) from None
