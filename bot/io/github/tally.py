"""Every GitHub request of an installation, counted by the job that sent it and its route.

At fleet scale an installation's writes are its time (they go one at a time, a second
apart: bot/io/github/pace.py), so each write must be justified: the counts say which
job (loop, critic, gate, dispatch, the reconciler) made which write, for the fleet
benchmark and for an operator's ``loopbot_github_requests_total``. The job is the
process's: a work horse runs one job at a time, and every thread of it (the status
publisher, the check-run writer) writes for that job.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

# "job|kind|METHOD /route" -> count; kind: write, read, or read304 (a conditional read
# GitHub answered 304 Not Modified, which its primary rate limit does not count)
KEY = "loopbot:metrics:github-requests"

_job = "other"  # the job this process runs now (``running``): a horse runs one at a time


@contextlib.contextmanager
def running(kind: str) -> Iterator[None]:
    """Count the requests sent in the body (by any thread of the process) as ``kind``'s."""
    global _job
    previous, _job = _job, kind
    try:
        yield
    finally:
        _job = previous


def job() -> str:
    return _job


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
    return f"{_job}|{kind}|{method.upper()} {route(path)}"


def count(redis: Any, kind: str, method: str, path: str) -> None:
    """One request sent (``kind``: read, read304 or write). Never fails the request it
    counts."""
    with contextlib.suppress(Exception):
        redis.hincrby(KEY, field(kind, method, path), 1)


def counts(redis: Any) -> dict[tuple[str, str, str], int]:
    """Every count so far: (job, kind, "METHOD /route") -> requests."""
    out: dict[tuple[str, str, str], int] = {}
    for raw, n in redis.hgetall(KEY).items():
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        job_, _, rest = text.partition("|")
        kind, _, what = rest.partition("|")
        out[(job_, kind, what)] = int(n)
    return out
