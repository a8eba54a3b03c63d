"""One GitHub pace per installation, shared through a real redis-server
(``bot/io/github/pace.py``): writes one at a time at least a gap apart across processes,
a secondary limit or a near-empty primary one pausing every request of the installation,
and what an answer's headers say (pure)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import httpx
import pytest
from redis import Redis

from bot.io.github.failures import Unavailable
from bot.io.github.pace import RESERVE, SECONDARY_WAIT, SharedPace, pause_for

NOW = 1_800_000_000.0


def test_an_answer_says_how_long_to_pause() -> None:
    assert pause_for(403, {"retry-after": "7"}, "", NOW) == (7.0, "403 with Retry-After")
    assert pause_for(429, {"retry-after": "0"}, "", NOW) == (1.0, "429 with Retry-After")
    secondary = "You have exceeded a secondary rate limit. Please wait a few minutes."
    assert pause_for(403, {}, secondary, NOW) == (SECONDARY_WAIT, "403: secondary rate limit")
    spent = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(NOW + 300)}
    assert pause_for(403, spent, "API rate limit exceeded", NOW) == (
        300.0,
        "403: primary rate limit",
    )
    low = {"x-ratelimit-remaining": str(RESERVE - 1), "x-ratelimit-reset": str(NOW + 90)}
    assert pause_for(200, low, "", NOW) == (90.0, f"primary rate limit: {RESERVE - 1} left")
    plenty = {"x-ratelimit-remaining": "4000", "x-ratelimit-reset": str(NOW + 90)}
    assert pause_for(200, plenty, "", NOW) is None
    assert pause_for(403, {}, "Resource not accessible by integration", NOW) is None  # a real 403
    assert pause_for(403, {"retry-after": "soon"}, "", NOW) is None
    assert pause_for(500, {"retry-after": "5"}, "", NOW) is None


def request(method: str) -> httpx.Request:
    return httpx.Request(method, "https://api.github.com/repos/a/b/issues")


def pace(redis: Redis, iid: int = 1, **kw: Any) -> tuple[SharedPace, list[float]]:
    slept: list[float] = []
    return SharedPace(redis, iid, sleep=slept.append, **kw), slept


def test_writes_of_one_installation_take_slots_a_gap_apart_across_processes(redis: Redis) -> None:
    """Two paces (two workers) of one installation: each write waits for the slot after
    the last one given out; reads are not spaced; another installation is not held."""
    a, slept_a = pace(redis, gap=0.5)
    b, slept_b = pace(redis, gap=0.5)
    a.before(request("POST"))
    b.before(request("PATCH"))
    a.before(request("DELETE"))
    b.before(request("GET"))
    assert slept_a[0] == pytest.approx(1.0, abs=0.05)  # third write: two slots out
    assert slept_b == [pytest.approx(0.5, abs=0.05)]  # its read did not wait
    other, slept_other = pace(redis, iid=2, gap=0.5)
    other.before(request("POST"))
    assert slept_other == []


def test_a_secondary_limit_pauses_every_request_of_the_installation_everywhere(
    redis: Redis,
) -> None:
    a, _ = pace(redis)
    b, slept_b = pace(redis)
    answer = httpx.Response(
        403,
        headers={"retry-after": "3"},
        json={"message": "You have exceeded a secondary rate limit"},
        request=request("POST"),
    )
    a.after(answer)
    b.before(request("GET"))  # another worker's read waits too
    assert slept_b and slept_b[0] == pytest.approx(3.0, abs=0.1)
    # A shorter pause never shortens a longer one.
    a.pause(1.0, "shorter")
    c, slept_c = pace(redis)
    c.before(request("GET"))
    assert slept_c[0] > 2.5


def test_a_secondary_limit_doubles_the_installation_s_write_gap_for_every_worker(
    redis: Redis,
) -> None:
    """The pace that hit the limit would hit it again after the pause: the installation's
    writes are spaced twice as far apart (at least 1 s, GitHub's documented minimum), for
    every worker; a primary limit does not change the gap."""
    a, _ = pace(redis, gap=0.3)
    b, _ = pace(redis, gap=0.3)
    assert b.gap_now() == pytest.approx(0.3)
    a.after(httpx.Response(429, headers={"retry-after": "1"}, request=request("POST")))
    assert b.gap_now() == pytest.approx(1.0)
    a.after(httpx.Response(403, headers={"retry-after": "1"}, request=request("POST")))
    assert b.gap_now() == pytest.approx(2.0)
    spent = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(time.time() + 5)}
    a.after(httpx.Response(403, headers=spent, json={"message": "x"}, request=request("GET")))
    assert b.gap_now() == pytest.approx(2.0)
    c, _ = pace(redis, iid=3, gap=0.3)
    assert c.gap_now() == pytest.approx(0.3)  # another installation keeps its own


def test_a_pause_past_the_longest_wait_is_not_waited(redis: Redis) -> None:
    a, slept = pace(redis, max_wait=10.0)
    a.pause(600, "primary rate limit")
    with pytest.raises(Unavailable, match="paused installation 1 for 600 s"):
        a.before(request("POST"))
    assert slept == []


def test_concurrent_writers_never_share_a_slot(redis: Redis) -> None:
    """Twenty writers at once (threads, each its own pace as a worker would be): the
    slots Redis gave them are all distinct and at least a gap apart."""
    slots: list[int] = []
    lock = threading.Lock()

    def write() -> None:
        slot = SharedPace(redis, 7, gap=0.05, sleep=lambda s: None).before(request("POST"))
        with lock:
            slots.append(slot)

    threads = [threading.Thread(target=write) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = sorted(slots)
    assert len(set(ordered)) == 20
    assert min(b - a for a, b in itertools.pairwise(ordered)) >= 50
