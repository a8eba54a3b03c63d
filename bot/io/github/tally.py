"""Every GitHub request of an installation, counted by the job and phase that sent it
and its route.

At fleet scale an installation's writes are its time (they go one at a time, a second
apart: bot/io/github/pace.py), so each write must be justified: the counts say which
job (loop, critic, gate, dispatch, the reconciler), in which of its phases (a turn, the
pull request, a catch-up, a review, a wait, the merge...), made which write, for the
fleet benchmark and for an operator's ``loopbot_github_requests_total``. The job and its
phase are the process's: a work horse runs one job at a time, its phases one after
another. A thread that writes for the job later (the status publisher, the check-run
writer) counts its write in the phase that asked for it (``as_phase``).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

# "job|kind|METHOD /route|phase" -> count; kind: write, read, or read304 (a conditional
# read GitHub answered 304 Not Modified, which its primary rate limit does not count).
# Fields written before phases were counted have no "|phase": their phase is "".
KEY = "loopbot:metrics:github-requests"

_job = "other"  # the job this process runs now (``running``): a horse runs one at a time
_phase = ""  # the phase of that job now (``enter``)
_asked = threading.local()  # a thread's phase for the write it sends for another (``as_phase``)


class Count(NamedTuple):
    job: str
    phase: str
    kind: str
    what: str  # "METHOD /route"


@contextlib.contextmanager
def running(kind: str) -> Iterator[None]:
    """Count the requests sent in the body (by any thread of the process) as ``kind``'s;
    its phase starts empty."""
    global _job, _phase
    previous, _job = (_job, _phase), kind
    _phase = ""
    try:
        yield
    finally:
        _job, _phase = previous


def job() -> str:
    return _job


def enter(phase: str) -> None:
    """The job is in ``phase`` from now on (until the next ``enter`` or its end)."""
    global _phase
    _phase = phase


def phase() -> str:
    """The phase a request sent now by this thread counts in."""
    asked = getattr(_asked, "phase", None)
    return _phase if asked is None else asked


@contextlib.contextmanager
def as_phase(name: str) -> Iterator[None]:
    """This thread's requests in the body count in ``name``: the phase that asked for the
    write it sends (a status edit, a check run), not the phase the job is in by then."""
    previous = getattr(_asked, "phase", None)
    _asked.phase = name
    try:
        yield
    finally:
        _asked.phase = previous


def route(path: str) -> str:
    """A request's path without its host prefix, repository, numbers, shas and branch
    names: what kind of request it is, a label of few values. Pure."""
    path = re.sub(r"^(/api/v3)?/repos/[^/]+/[^/]+", "", path.split("?", 1)[0])
    path = re.sub(r"/(git/)?(refs|matching-refs)/heads/.+$", r"/\1\2/heads/{branch}", path)
    path = re.sub(r"^/((rules/)?branches)/.+?(/protection.*)?$", r"/\1/{branch}\3", path)
    path = re.sub(r"^/compare/.+$", "/compare/{range}", path)
    path = re.sub(r"^/(contents|readme)/.+$", r"/\1/{path}", path)
    return re.sub(r"/[0-9a-f]{40}(?=/|$)|/\d+(?=/|$)", "/N", path) or "/"


def field(kind: str, method: str, path: str) -> str:
    return f"{_job}|{kind}|{method.upper()} {route(path)}|{phase()}"


def count(redis: Any, kind: str, method: str, path: str) -> None:
    """One request sent (``kind``: read, read304 or write). Never fails the request it
    counts."""
    with contextlib.suppress(Exception):
        redis.hincrby(KEY, field(kind, method, path), 1)


def by_phase(redis: Any) -> dict[Count, int]:
    """Every count so far, by job, phase, kind and route."""
    out: dict[Count, int] = {}
    for raw, n in redis.hgetall(KEY).items():
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        job_, kind, what, phase_ = [*text.split("|", 3), "", "", ""][:4]
        key = Count(job_, phase_, kind, what)
        out[key] = out.get(key, 0) + int(n)
    return out


def counts(redis: Any) -> dict[tuple[str, str, str], int]:
    """Every count so far: (job, kind, "METHOD /route") -> requests, all phases."""
    out: dict[tuple[str, str, str], int] = {}
    for c, n in by_phase(redis).items():
        out[(c.job, c.kind, c.what)] = out.get((c.job, c.kind, c.what), 0) + n
    return out
