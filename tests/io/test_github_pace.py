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
from bot.io.github.pace import RESERVE, SECONDARY_WAIT, SharedPace, pause_for, spread_for

NOW = 1_800_000_000.0


def test_a_refusal_says_how_long_to_pause() -> None:
    assert pause_for(403, {"retry-after": "7"}, "") == (7.0, "403 with Retry-After")
    assert pause_for(429, {"retry-after": "0"}, "") == (1.0, "429 with Retry-After")
    secondary = "You have exceeded a secondary rate limit. Please wait a few minutes."
    assert pause_for(403, {}, secondary) == (SECONDARY_WAIT, "403: secondary rate limit")
    assert pause_for(403, {}, "Resource not accessible by integration") is None  # a real 403
    assert pause_for(403, {"retry-after": "soon"}, "") is None
    assert pause_for(500, {"retry-after": "5"}, "") is None
    assert pause_for(200, {"retry-after": "5"}, "") is None


def test_a_primary_limit_near_its_end_spreads_the_writes_until_the_reset() -> None:
    low = {"x-ratelimit-remaining": "10", "x-ratelimit-reset": str(NOW + 50)}
    assert spread_for(low, NOW) == (5.0, 50.0)
    assert spread_for({**low, "x-ratelimit-remaining": "0"}, NOW) == (10.0, 50.0)  # capped
    plenty = {"x-ratelimit-remaining": str(RESERVE), "x-ratelimit-reset": str(NOW + 50)}
    assert spread_for(plenty, NOW) is None
    # GraphQL's and search's budgets are their own: they do not slow REST writes.
    assert spread_for({**low, "x-ratelimit-resource": "graphql"}, NOW) is None
    assert spread_for({**low, "x-ratelimit-reset": str(NOW - 1)}, NOW) is None
    assert spread_for({}, NOW) is None


def request(method: str) -> httpx.Request:
    return httpx.Request(method, "https://api.github.com/repos/a/b/issues")


def pace(redis: Redis, iid: int = 1, **kw: Any) -> tuple[SharedPace, list[float]]:
    """A pace that sleeps for real (a pause is over only when Redis's clock says so) and
    records each wait."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    return SharedPace(redis, iid, sleep=sleep, **kw), slept


def test_writes_of_one_installation_take_slots_a_gap_apart_across_processes(redis: Redis) -> None:
    """Two paces (two workers) of one installation: each write gets the slot after the
    last one given out, whoever asked; reads are not spaced; another installation is not
    held."""
    a = SharedPace(redis, 1, gap=0.5, sleep=lambda s: None)
    b = SharedPace(redis, 1, gap=0.5, sleep=lambda s: None)
    first = a.before(request("POST"))
    second = b.before(request("PATCH"))
    third = a.before(request("DELETE"))
    read = b.before(request("GET"))
    assert (second - first, third - second) == (500, 500)
    assert read < second  # a read takes no slot: it went at once
    other = SharedPace(redis, 2, gap=0.5, sleep=lambda s: None)
    assert other.before(request("POST")) < second


def test_a_secondary_limit_pauses_every_request_of_the_installation_everywhere(
    redis: Redis,
) -> None:
    a, _ = pace(redis)
    b, slept_b = pace(redis)
    answer = httpx.Response(
        403,
        headers={"retry-after": "2"},
        json={"message": "You have exceeded a secondary rate limit"},
        request=request("POST"),
    )
    a.after(answer)
    b.before(request("GET"))  # another worker's read waits too
    assert slept_b and slept_b[0] == pytest.approx(2.0, abs=0.1)
    # A shorter pause never shortens a longer one.
    a.after(answer)
    a.pause(0.5, "shorter")
    c, slept_c = pace(redis)
    c.before(request("GET"))
    assert slept_c[0] > 1.5


def test_a_secondary_limit_doubles_the_installation_s_write_gap_once_per_episode(
    redis: Redis,
) -> None:
    """The pace that hit the limit would hit it again after the pause: the installation's
    writes are spaced twice as far apart (at least 1 s, GitHub's documented minimum), for
    every worker. The other refusals of the same burst (writes already on their way) do
    not double it again; the next episode, after the pause, does."""
    a, _ = pace(redis, gap=0.3)
    b, _ = pace(redis, gap=0.3)
    assert b.gap_now() == pytest.approx(0.3)
    refused = httpx.Response(429, headers={"retry-after": "1"}, request=request("POST"))
    for _ in range(4):  # one burst
        a.after(refused)
    assert b.gap_now() == pytest.approx(1.0)
    redis.delete(a.keys[0])  # the pause is over
    a.after(refused)
    assert b.gap_now() == pytest.approx(2.0)
    c, _ = pace(redis, iid=3, gap=0.3)
    assert c.gap_now() == pytest.approx(0.3)  # another installation keeps its own


def test_a_write_whose_slot_falls_in_a_pause_set_after_it_waits_for_the_pause(
    redis: Redis,
) -> None:
    """A write took its slot, then another worker was refused and paused the
    installation: when the slot comes, the write sees the pause and waits it out."""
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 1:  # while the write waits for its slot, a pause begins
            SharedPace(redis, 1).pause(2.0, "another worker's 403")
        else:
            redis.delete("loopbot:gh-pause:1")  # the pause ran out
        now[0] += seconds

    SharedPace(redis, 1, gap=0.5, sleep=lambda s: None).before(request("POST"))
    writer = SharedPace(redis, 1, gap=0.5, sleep=sleep)
    writer.before(request("POST"))
    assert len(slept) == 2 and slept[0] == pytest.approx(0.5, abs=0.05)
    assert slept[1] == pytest.approx(2.0, abs=0.1)  # the pause, waited after the slot


def test_a_write_that_will_not_wait_takes_no_slot(redis: Redis) -> None:
    """Writes refused for a queue longer than the longest wait leave the queue as it was:
    the next write is not pushed further off by them."""
    a = SharedPace(redis, 1, gap=1.0, max_wait=2.5, sleep=lambda s: None)
    for _ in range(3):
        a.before(request("POST"))  # slots at 0, 1, 2 s
    for _ in range(5):
        with pytest.raises(Unavailable, match="its writes are queued"):
            a.before(request("POST"))
    ms, _ = a._slot(keys=list(a.keys), args=[1, 1000, 10_000])
    assert int(ms) <= 3_100  # the fourth slot, not the ninth


def test_a_pause_past_the_longest_wait_is_not_waited(redis: Redis) -> None:
    a, slept = pace(redis, max_wait=10.0)
    a.pause(600, "primary rate limit")
    with pytest.raises(Unavailable, match="GitHub paused it"):
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
