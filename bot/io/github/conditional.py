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

One ``Bodies`` per installation; entries are keyed by (token, URL, Accept), so neither
two installations nor two tokens share one.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import httpx

NOT_MODIFIED = "loopbot_not_modified"  # response extension: GitHub answered 304
WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# An installation keeps at most 256 bodies and 8 MiB of them (least recently used
# first out); a body over 1 MiB (a large file's contents) is not kept at all. A loop
# reads a few dozen distinct resources, and a worker's horse serves one loop at a time.
MAX_ENTRIES = 256
MAX_BYTES = 8 * 1024 * 1024
MAX_BODY = 1024 * 1024
# Headers that describe the stored body as it came over the wire, not as kept (decoded).
_WIRE = frozenset({"content-encoding", "content-length", "transfer-encoding"})


@dataclass(frozen=True)
class Body:
    etag: str
    headers: tuple[tuple[str, str], ...]
    content: bytes


class Bodies:
    """The last body of each GET that came with an ETag, bounded; thread-safe (the
    installation's threads each have their own client, and share these)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, str, str], Body] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def get(self, key: tuple[str, str, str]) -> Body | None:
        with self._lock:
            body = self._held.get(key)
            if body is not None:
                self._held.move_to_end(key)
            return body

    def put(self, key: tuple[str, str, str], body: Body) -> None:
        with self._lock:
            self._pop(key)
            if len(body.content) > min(MAX_BODY, self.max_bytes):
                return
            self._held[key] = body
            self.nbytes += len(body.content)
            while len(self._held) > self.max_entries or self.nbytes > self.max_bytes:
                self._pop(next(iter(self._held)))

    def forget(self, token: str, path: str) -> None:
        """Drop what is held of the resource at ``path`` (a write changed it): memory
        back early; correctness does not need it, every read asks GitHub."""
        with self._lock:
            for key in [k for k in self._held if k[0] == token and _path(k[1]) == path]:
                self._pop(key)

    def _pop(self, key: tuple[str, str, str]) -> None:
        body = self._held.pop(key, None)
        if body is not None:
            self.nbytes -= len(body.content)


class ConditionalTransport(httpx.BaseTransport):
    """Sends a GET with ``If-None-Match`` when a body of it is held, and turns GitHub's
    304 into that body (a 200, marked ``NOT_MODIFIED``)."""

    def __init__(self, inner: httpx.BaseTransport, bodies: Bodies) -> None:
        self.inner = inner
        self.bodies = bodies

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        method = request.method.upper()
        token = _token(request)
        if method != "GET" or "if-none-match" in request.headers:
            response = self.inner.handle_request(request)
            if method in WRITES:
                self.bodies.forget(token, request.url.path)
            return response
        key = (token, str(request.url), request.headers.get("accept", ""))
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
        if response.status_code != 200 or not etag or (size.isdigit() and int(size) > MAX_BODY):
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
