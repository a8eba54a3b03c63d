"""Conditional reads: a GET sent again carries the ETag of the body last read, and a
``304 Not Modified`` is answered with that body. GitHub does not count a 304 against
the primary rate limit (its REST API best practices), and a loop reads the same pull,
issue and files again and again.

Every GET still goes to GitHub: a body is reused only when GitHub says, now, that it
has not changed. GitHub's ``Cache-Control: private, max-age=60`` would let an HTTP
cache answer from memory for a minute, a stale pull head, issue state or review state
to the merge gate. Hence loopbot's own layer rather than githubkit's ``http_cache``
(hishel): hishel can be told to revalidate (githubkit sends ``Cache-Control:
no-cache``), but its storages (SQLite, Redis) are bounded by age only, not by entries
or bytes, and a 304 reaches the response hooks as the stored 200, so it could not be
counted. This layer is an httpx transport, below the event hooks: the shared pace
(bot/io/github/pace.py) sees every request, and a 304 as a 200 marked ``NOT_MODIFIED``.

Where the bodies are kept: with Redis, in it (``RedisBodies``), shared by every job of
the installation (RQ forks a fresh work horse per job, so bodies kept in the process
saved only a job's own repeated reads); keyed by installation, not token, so a token's
hourly rotation does not empty them. Sharing is safe because a body is only ever used
when GitHub answers 304 to its ETag for this very request: GitHub itself says the body it
would send is that one. GitHub is reported to tie an ETag to the token that read it
(GitHub support, in eclipse-csi/otterdog#201): a read with another token is then
answered in full and its body replaces the entry, so a 304 across jobs needs the jobs to
read with the same token (each work horse mints its own today). Without Redis, one
``Bodies`` per installation in the process, keyed by (token, URL, Accept). Either way, no
two installations share one.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import httpx
from redis import Redis, RedisError

from bot.io.logs import get_logger

log = get_logger("loopbot.github.conditional")

NOT_MODIFIED = "loopbot_not_modified"  # response extension: GitHub answered 304
WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# An installation keeps at most 256 bodies and 8 MiB of them (least recently used
# first out); a body over 1 MiB (a large file's contents) is not kept at all. A loop
# reads a few dozen distinct resources, and a worker's horse serves one loop at a time.
MAX_ENTRIES = 256
MAX_BYTES = 8 * 1024 * 1024
MAX_BODY = 1024 * 1024
# In Redis: no body over 256 KiB, and each resource's bodies expire 15 minutes after
# their last use. How big that gets: ``bench/fleet.py --smoke`` ends with about 12
# bodies a loop, 8 KiB a loop in Redis (the local GitHub's JSON is terse). GitHub's
# bodies are larger (a pull's JSON is some 20-30 KiB, a few KiB once compressed): at
# 50 loops, a few MiB to some tens of MiB; at worst, 50 x 12 x 256 KiB (150 MiB) of
# incompressible files, gone 15 minutes after the loops stop reading them.
REDIS_MAX_BODY = 256 * 1024
REDIS_TTL = 15 * 60  # seconds
# After a Redis error the bodies' store is left alone this long: redis-py retries a
# refused connection ten times with backoff, seconds that every read would wait for a
# body it would then send without anyway.
REDIS_REST = 30.0  # seconds
# Headers that describe the stored body as it came over the wire, not as kept (decoded).
_WIRE = frozenset({"content-encoding", "content-length", "transfer-encoding"})


@dataclass(frozen=True)
class Body:
    etag: str
    headers: tuple[tuple[str, str], ...]
    content: bytes


Key = tuple[str, str, str]  # (whose: see ``Store.whose``, URL with its query, Accept)


class Store(Protocol):
    """Where an installation's bodies are kept: in the process or in Redis."""

    max_body: int  # bytes: a larger body is not kept (nor read before it is passed on)

    def whose(self, request: httpx.Request) -> str: ...
    def get(self, key: Key) -> Body | None: ...
    def put(self, key: Key, body: Body) -> None: ...
    def forget(self, whose: str, path: str) -> None: ...


class Bodies:
    """The last body of each GET that came with an ETag, bounded; thread-safe (the
    installation's threads each have their own client, and share these)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_body = min(MAX_BODY, max_bytes)
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, str, str], Body] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def whose(self, request: httpx.Request) -> str:
        """In the process, per token: nothing else is shared, and tokens are few."""
        return _token(request)

    def get(self, key: Key) -> Body | None:
        with self._lock:
            body = self._held.get(key)
            if body is not None:
                self._held.move_to_end(key)
            return body

    def put(self, key: Key, body: Body) -> None:
        with self._lock:
            self._pop(key)
            if len(body.content) > self.max_body:
                return
            self._held[key] = body
            self.nbytes += len(body.content)
            while len(self._held) > self.max_entries or self.nbytes > self.max_bytes:
                self._pop(next(iter(self._held)))

    def forget(self, whose: str, path: str) -> None:
        """Drop what is held of the resource at ``path`` (a write changed it): memory
        back early; correctness does not need it, every read asks GitHub."""
        with self._lock:
            for key in [k for k in self._held if k[0] == whose and _path(k[1]) == path]:
                self._pop(key)

    def _pop(self, key: Key) -> None:
        body = self._held.pop(key, None)
        if body is not None:
            self.nbytes -= len(body.content)


# Headers kept in Redis with a body: what githubkit reads of a 200 (its type, the next
# page's link). Every other header comes fresh with GitHub's 304.
_KEPT = frozenset({"content-type", "link", "etag", "last-modified"})


class RedisBodies:
    """An installation's bodies in Redis, shared by all its jobs and workers: one hash a
    resource path (``loopbot:etag:<installation>:<path>``), a field per URL and Accept,
    so a write drops its resource's bodies with one DEL and they expire together. A
    read costs one round trip before it is sent (the entry, its TTL refreshed) and, after
    a 200 with an ETag, one more (the new entry). Redis failing never fails a read: it is
    sent unconditionally, the failure logged once, and the store left alone for
    ``REDIS_REST`` seconds before it is tried again."""

    def __init__(self, redis: Redis, installation_id: int, max_body: int = REDIS_MAX_BODY) -> None:
        self.redis = redis
        self.installation_id = installation_id
        self.max_body = max_body
        self._failed = False
        self._rest_until = 0.0  # monotonic: no Redis call before then (it just failed)

    def whose(self, request: httpx.Request) -> str:
        """The installation, whatever its token: a token lasts an hour."""
        return str(self.installation_id)

    def get(self, key: Key) -> Body | None:
        if self._resting():
            return None
        name, field = self._where(key)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hget(name, field)
            pipe.expire(name, REDIS_TTL)
            raw, _ = pipe.execute()
        except RedisError as e:
            self._failure("get", e)
            return None
        return _unpacked(raw) if isinstance(raw, bytes) else None

    def put(self, key: Key, body: Body) -> None:
        if len(body.content) > self.max_body or self._resting():
            return
        name, field = self._where(key)
        headers = tuple((k, v) for k, v in body.headers if k.lower() in _KEPT)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(name, field, _packed(Body(body.etag, headers, body.content)))
            pipe.expire(name, REDIS_TTL)
            pipe.execute()
        except RedisError as e:
            self._failure("put", e)

    def forget(self, whose: str, path: str) -> None:
        if self._resting():
            return  # what it held lapses: its TTL, and every read asks GitHub anyway
        try:
            self.redis.delete(self._name(path))
        except RedisError as e:
            self._failure("forget", e)

    def _name(self, path: str) -> str:
        return f"loopbot:etag:{self.installation_id}:{path}"

    def _where(self, key: Key) -> tuple[str, str]:
        _, url, accept = key
        return self._name(_path(url)), f"{accept} {url}"

    def _resting(self) -> bool:
        return time.monotonic() < self._rest_until

    def _failure(self, what: str, e: RedisError) -> None:
        self._rest_until = time.monotonic() + REDIS_REST
        if not self._failed:
            self._failed = True
            log.warning(
                "github.etag_store_failed",
                installation=self.installation_id,
                what=what,
                error=repr(e),
            )


def _packed(body: Body) -> bytes:
    """zlib of: the ETag and headers as one line of JSON, a newline, the body."""
    head = json.dumps([body.etag, body.headers]).encode()  # JSON escapes its newlines
    return zlib.compress(head + b"\n" + body.content)


def _unpacked(raw: bytes) -> Body | None:
    try:
        head, _, content = zlib.decompress(raw).partition(b"\n")
        etag, headers = json.loads(head)
        return Body(str(etag), tuple((str(k), str(v)) for k, v in headers), content)
    except (zlib.error, ValueError, TypeError):
        return None  # not one of ours: read unconditionally, and replaced after


class ConditionalTransport(httpx.BaseTransport):
    """Sends a GET with ``If-None-Match`` when a body of it is held, and turns GitHub's
    304 into that body (a 200, marked ``NOT_MODIFIED``)."""

    def __init__(self, inner: httpx.BaseTransport, bodies: Store) -> None:
        self.inner = inner
        self.bodies = bodies

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        method = request.method.upper()
        whose = self.bodies.whose(request)
        if method != "GET" or "if-none-match" in request.headers:
            response = self.inner.handle_request(request)
            if method in WRITES:
                self.bodies.forget(whose, request.url.path)
            return response
        key = (whose, str(request.url), request.headers.get("accept", ""))
        held = self.bodies.get(key)
        if held is not None:
            request.headers["If-None-Match"] = held.etag
        response = self.inner.handle_request(request)
        if response.status_code == 304 and held is not None:
            response.close()
            # GitHub's 304 carries fresh headers (the rate limit's): they win.
            headers = dict(held.headers) | {
                k: v for k, v in response.headers.items() if k.lower() not in _WIRE
            }
            return _built(200, headers, held.content, request, response, not_modified=True)
        etag = response.headers.get("etag")
        size = response.headers.get("content-length", "")
        if (
            response.status_code != 200
            or not etag
            or (size.isdigit() and int(size) > self.bodies.max_body)
        ):
            return response  # nothing to keep: passed on as it comes (a large one unread)
        try:
            content = response.read()
        finally:
            response.close()
        kept = tuple((k, v) for k, v in response.headers.items() if k.lower() not in _WIRE)
        self.bodies.put(key, Body(etag, kept, content))
        return _built(200, dict(kept), content, request, response, not_modified=False)

    def close(self) -> None:
        self.inner.close()


def _built(
    status: int,
    headers: dict[str, str],
    content: bytes,
    request: httpx.Request,
    wire: httpx.Response,
    *,
    not_modified: bool,
) -> httpx.Response:
    """A response with ``content`` already decoded (its Content-Length set by httpx)."""
    extensions = dict(wire.extensions) | {NOT_MODIFIED: not_modified}
    return httpx.Response(
        status, headers=headers, content=content, request=request, extensions=extensions
    )


def _token(request: httpx.Request) -> str:
    """Whose request it is: a digest of its credential, so the key holds no secret."""
    return hashlib.sha256(request.headers.get("authorization", "").encode()).hexdigest()


def _path(url: str) -> str:
    return httpx.URL(url).path
