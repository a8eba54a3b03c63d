"""One way to connect to Redis: with retries that ride out a restart or a dropped link.

Every process (web, worker, control lane, CLI, doctor, dashboard) connects through
``connect``. ``REDIS_URL`` may carry credentials and TLS, as redis-py reads them:

- ``redis://:PASSWORD@host:6379/0`` or ``redis://USER:PASSWORD@host:6379/0``
- ``rediss://host:6380/0?ssl_ca_certs=/path/ca.pem`` (TLS; ``ssl_cert_reqs``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` work the same way)
- ``unix:///run/redis/redis.sock?db=0``
- ``redis+sentinel://:PASSWORD@sentinel-a:26379,sentinel-b:26379/mymaster/0`` (Redis
  Sentinel; ``?sentinel_password=`` for sentinels that want one; ``REDIS_SENTINELS`` and
  ``REDIS_SENTINEL_MASTER`` become this URL in settings, ``bot.core.redis_url``)

Through Sentinel the client asks the sentinels for the master's address whenever it
(re)connects, so after a failover every process finds the new master by itself, within
the same retries that ride out a restart: a connection to the dead master fails, one to an
old master turned replica answers READONLY (redis-py drops it), and the next attempt asks
the sentinels again. An old master that lives on (a manual ``SENTINEL FAILOVER``, a
partition) takes writes until Sentinel demotes it, and those are lost: docs/operating.md, "Redis
Sentinel and failover", says what bounds that.

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

from redis import ConnectionPool, Redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    RedisError,
    ResponseError,
    TimeoutError,
)
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelConnectionPoolProxy,
    SentinelManagedConnection,
)

from bot.core.redis_url import (
    SentinelSpec,
    check_url,
    is_sentinel,
    mask_url,
    parse_sentinel_url,
    scrub,
)
from bot.io.logs import get_logger

# About 30 s of retrying (0.1 s doubling to 2 s, 20 times): long enough for a Redis
# restart or failover, short enough that a dead Redis surfaces as an error.
RETRIES = 20
# One question to one sentinel: a sentinel that does not answer within this is skipped
# for the next one (they answer from memory, at once).
SENTINEL_TIMEOUT = 2.0
# A write refused for want of in-sync replicas (NOREPLICAS) is tried again after this.
NOREPLICAS_PAUSE = 0.5
_UNSET = object()
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
    """Waiting cannot fix it: refused credentials, a TLS handshake that failed, sentinels
    that know no master of that name."""
    for e in _chain(exc):
        if isinstance(e, AuthenticationError | AuthorizationError | SentinelMisconfigured):
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
            except ResponseError as exc:
                # ``min-replicas-to-write``: the master refuses writes while too few
                # replicas are in sync (right after a failover, say). It heals by itself,
                # so wait for it like for a restart instead of failing the job.
                if str(exc).startswith("NOREPLICAS"):
                    # Paced here too: a WATCHed transaction turns it into a WatchError at
                    # once, and its caller's loop tries again without a backoff.
                    time.sleep(NOREPLICAS_PAUSE)
                    raise _NoReplicas(str(exc)) from exc
                raise

        try:
            return super().call_with_retry(once, fail, *args, **kwargs)
        except _Permanent as wrapped:
            # No ``fail`` (disconnect) needed: redis-py closes the socket itself when the
            # handshake or AUTH fails, before the error reaches this retry.
            error = wrapped.error
        # Raised outside the handler, so its own context (the ssl.SSLError) is kept.
        raise error


class _NoReplicas(ConnectionError):
    """NOREPLICAS, retried (and, if it lasts, raised) as a connection error."""


class _Permanent(Exception):
    def __init__(self, error: RedisError) -> None:
        super().__init__(str(error))
        self.error = error


def connect(url: str, *, retries: int = RETRIES, timeout: float | None = None) -> Redis:
    """A client for ``url``; it connects on first use (``check`` does that at start-up).

    A ``redis+sentinel://`` URL gives a client of the master the sentinels name (a
    ``SentinelRedis``): each new connection asks them, so a failover needs no restart.
    """
    check_url(url)
    options: dict[str, Any] = {
        "retry": _Retry(ExponentialBackoff(cap=2.0, base=0.1), retries),
        "retry_on_error": [ConnectionError, TimeoutError],
        "health_check_interval": 30,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout or 5,
    }
    if is_sentinel(url):
        return _master_for(parse_sentinel_url(url), options, timeout)
    return Redis.from_url(url, **options)


# -- Redis Sentinel ----------------------------------------------------------------------------


class SentinelMisconfigured(RedisError):
    """The sentinels answer, but not about this master: a wrong name, or not sentinels."""


class SentinelRefused(AuthenticationError):
    """The sentinels refused the credentials (``sentinel_password``)."""


class _Sentinel(Sentinel):
    """redis-py's ``Sentinel`` with one change: when no master is found, the error says
    what each sentinel answered, and tells a lasting cause (refused credentials, no
    master of that name, not a sentinel at all) from a passing one (a failover under way,
    a sentinel down), so only the passing one is retried."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        problems: list[str] = []
        failures: list[BaseException] = []
        unknown = 0
        for number, sentinel in enumerate(self.sentinels):
            kwargs = sentinel.connection_pool.connection_kwargs
            where = f"sentinel {kwargs.get('host')}:{kwargs.get('port')}"
            try:
                masters = sentinel.sentinel_masters()
            except (ConnectionError, TimeoutError) as exc:
                failures.append(exc)
                problems.append(f"{where}: {exc or type(exc).__name__}")
                continue
            except ResponseError as exc:  # a Redis that is not a sentinel, say
                failures.append(SentinelMisconfigured(str(exc)))
                problems.append(f"{where} is not a sentinel? ({exc})")
                continue
            state = masters.get(service_name) if isinstance(masters, dict) else None
            if not state:
                unknown += 1
                problems.append(f"{where} monitors no master named {service_name!r}")
                continue
            if self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                # Ask this one first next time, as redis-py does.
                self.sentinels[0], self.sentinels[number] = sentinel, self.sentinels[0]
                return state["ip"], int(state["port"])
            problems.append(
                f"{where}: master {state['ip']}:{state['port']} is down (a failover under way?)"
            )
        detail = "; ".join(problems)
        if unknown == len(self.sentinels):
            raise SentinelMisconfigured(
                f"no sentinel monitors a master named {service_name!r} ({detail}); "
                "check REDIS_SENTINEL_MASTER or the URL's master name"
            )
        lasting = [e for e in failures if permanent_error(e)]
        if lasting and len(lasting) + unknown == len(self.sentinels):
            if all(isinstance(e, SentinelMisconfigured) for e in lasting):
                raise SentinelMisconfigured(f"no master for {service_name!r}: {detail}")
            raise SentinelRefused(
                f"the sentinels refused the credentials ({detail}); check sentinel_password"
            )
        raise MasterNotFoundError(f"no master for {service_name!r} from the sentinels: {detail}")


class SentinelConnection(SentinelManagedConnection):
    """redis-py's Sentinel-managed connection with two of its ways put right (8.1):

    - It asks the sentinels on *every* reconnect. redis-py asks them only in
      ``connect()``; a command that fails on a live connection (the master killed under
      a BLMOVE, a NOREPLICAS) is retried on the same connection object, which
      ``send_packed_command`` reconnects through ``connect_check_health``, to the host and
      port it had: the dead master for the whole retry window (an RQ worker's blocked
      BLMOVE came back after 35 s, with an error), or an old master that lives on.
    - A read cut short by an exception drops the connection, as a plain ``Connection``
      does. redis-py's Sentinel connection defaults ``disconnect_on_error`` to False, so
      a signal handler's exception inside a read (RQ's warm shutdown under BLMOVE, RQ's
      job timeout) left the reply pending on a connection that went back to the pool:
      the next command on it (RQ's ``register_death``) waited out the BLMOVE's 405 s.
    """

    _resolving = False

    def read_response(
        self,
        disable_decoding: bool = False,
        *,
        timeout: float | object = _UNSET,
        disconnect_on_error: bool | None = True,
        push_request: bool | None = False,
    ) -> Any:
        options: dict[str, Any] = {
            "disable_decoding": disable_decoding,
            "disconnect_on_error": disconnect_on_error,
            "push_request": push_request,
        }
        if timeout is not _UNSET:
            options["timeout"] = timeout
        return super().read_response(**options)

    def connect_to(self, address: tuple[str, int]) -> None:
        self._resolving = True
        try:
            super().connect_to(address)  # type: ignore[no-untyped-call]
        finally:
            self._resolving = False

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if self._sock is None and not self._resolving:
            self.connect()  # type: ignore[no-untyped-call]  # asks the sentinels, then connect_to
            return
        super().connect_check_health(check_health, retry_socket_connect)


class SentinelRedis(Redis):
    """The client of a Sentinel-managed master; stays one when rebuilt from its parts.

    RQ's scheduler (and its worker pool) rebuild a connection in the forked process as
    ``type(conn)(connection_pool=ConnectionPool(connection_class=..., **connection_kwargs))``
    (rq.connections.parse_connection). For a Sentinel client that would be a plain pool
    of Sentinel-managed connections, which still asks the sentinels but never drops its
    idle connections to an old master. So a pool rebuilt like that is turned back into a
    ``SentinelConnectionPool`` on the same sentinels and master.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pool = kwargs.get("connection_pool")
        if isinstance(pool, ConnectionPool) and not isinstance(pool, SentinelConnectionPool):
            proxy = pool.connection_kwargs.get("connection_pool")
            if isinstance(proxy, SentinelConnectionPoolProxy):
                rest = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
                pool.disconnect()
                kwargs["connection_pool"] = SentinelConnectionPool(  # type: ignore[no-untyped-call]
                    proxy.service_name,
                    proxy.sentinel_manager,
                    connection_class=pool.connection_class,
                    is_master=proxy.is_master,
                    check_connection=proxy.check_connection,
                    **rest,
                )
                super().__init__(*args, **kwargs)
                self.auto_close_connection_pool = True  # its own pool: closed with it
                return
        super().__init__(*args, **kwargs)

    # Whether ``close`` also closes the sentinels' clients: only the client ``connect``
    # made owns them; a rebuilt one shares them with it.
    owns_sentinels = False

    def close(self) -> None:
        super().close()
        pool = self.connection_pool
        if self.owns_sentinels and isinstance(pool, SentinelConnectionPool):
            pool.sentinel_manager.close()


def sentinel_view(client: Redis) -> tuple[str, int, int] | None:
    """For a Sentinel client: the master's ``host:port`` and how many healthy replicas and
    sentinels watch it (as the first sentinel that answers sees them); None otherwise."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return None
    manager = pool.sentinel_manager
    host, port = manager.discover_master(pool.service_name)
    replicas = len(manager.discover_slaves(pool.service_name))
    state = manager.sentinels[0].sentinel_master(pool.service_name)
    return f"{host}:{port}", replicas, int(state.get("num-other-sentinels", 0)) + 1


def _master_for(spec: SentinelSpec, options: dict[str, Any], timeout: float | None) -> Redis:
    quick = min(timeout or SENTINEL_TIMEOUT, SENTINEL_TIMEOUT)
    sentinels = _Sentinel(  # type: ignore[no-untyped-call]
        list(spec.sentinels),
        sentinel_kwargs={
            "socket_timeout": quick,
            "socket_connect_timeout": quick,
            # A sentinel that does not answer is skipped for the next, not waited for:
            # the master connection's own retries ask them all again.
            "retry": Retry(NoBackoff(), 0),
            "username": spec.sentinel_username,
            "password": spec.sentinel_password,
        },
    )
    client = sentinels.master_for(  # type: ignore[no-untyped-call]
        spec.master,
        redis_class=SentinelRedis,
        connection_class=SentinelConnection,
        db=spec.db,
        username=spec.username,
        password=spec.password,
        **options,
    )
    assert isinstance(client, SentinelRedis)
    client.owns_sentinels = True
    return client


def explain(url: str, exc: BaseException) -> str:
    """One line for the operator: what went wrong with ``REDIS_URL``, password masked."""
    shown = f"{_name(url)} ({mask_url(url)})"
    detail = scrub(str(exc).strip().rstrip("."), url) or type(exc).__name__
    tls = _tls_error(exc)
    if tls is not None:
        reason = getattr(tls, "reason", None) or str(tls)
        if isinstance(tls, ssl.SSLCertVerificationError) and tls.verify_message:
            reason = f"{reason}: {tls.verify_message}"
        reason = scrub(reason, url)
        return f"{shown}: TLS handshake failed ({reason}); check ssl_ca_certs and the host name"
    if any(isinstance(e, SentinelMisconfigured | SentinelRefused) for e in _chain(exc)):
        return f"{shown}: {detail}"
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


def _name(url: str) -> str:
    """What the operator set: REDIS_URL, or REDIS_SENTINELS (or a redis+sentinel:// URL)."""
    return "REDIS_SENTINELS/REDIS_URL" if is_sentinel(url) else "REDIS_URL"


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
        raise RedisProblem(f"{_name(url)} ({mask_url(url)}): {exc}", permanent=True) from None
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
