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


def reserve(p: SharedPace) -> int:
    """Take the installation's next write slot as a writer elsewhere does, without
    sending anything (a real write would send at its slot)."""
    args = [1, int(p.gap * 1000), int(p.queue_wait * 1000), 0, int(p.max_wait * 1000)]
    return int(p._slot(keys=list(p.keys), args=args)[1])


def test_writes_of_one_installation_take_slots_a_gap_apart_across_processes(redis: Redis) -> None:
    """Two paces (two workers) of one installation: each write gets the slot after the
    last one given out, whoever asked; reads are not spaced; another installation is not
    held."""
    a = SharedPace(redis, 1, gap=0.5, sleep=lambda s: None)
    b = SharedPace(redis, 1, gap=0.5, sleep=lambda s: None)
    first = reserve(a)
    second = reserve(b)
    third = reserve(a)
    read = b.before(request("GET"))
    assert (second - first, third - second) == (500, 500)
    assert read < second  # a read takes no slot: it went at once
    other = SharedPace(redis, 2, gap=0.5, sleep=lambda s: None)
    assert reserve(other) < second


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

    reserve(SharedPace(redis, 1, gap=0.5))
    writer = SharedPace(redis, 1, gap=0.5, sleep=sleep)
    writer.before(request("POST"))
    assert len(slept) == 2 and slept[0] == pytest.approx(0.5, abs=0.05)
    assert slept[1] == pytest.approx(2.0, abs=0.1)  # the pause, waited after the slot


def test_a_write_that_will_not_wait_takes_no_slot(redis: Redis) -> None:
    """Writes refused for a queue longer than the longest wait leave the queue as it was:
    the next write is not pushed further off by them."""
    a = SharedPace(redis, 1, gap=1.0, max_wait=2.5, queue_wait=2.5, sleep=lambda s: None)
    for _ in range(3):
        reserve(a)  # slots at 0, 1, 2 s
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


def test_requests_in_flight_are_bounded_across_workers(redis: Redis) -> None:
    """Two requests of the installation in flight (two workers' paces) and a bound of two:
    a third, reads included, waits until one of them is answered."""
    a, b, c = (SharedPace(redis, 8, concurrent=2, sleep=time.sleep) for _ in range(3))
    a.before(request("GET"))
    b.before(request("POST"))
    entered = threading.Event()

    def third() -> None:
        c.before(request("GET"))
        entered.set()

    t = threading.Thread(target=third)
    t.start()
    assert not entered.wait(0.5)  # both places taken
    a.after(httpx.Response(200, request=request("GET")))
    assert entered.wait(2)
    t.join()
    assert redis.zcard("loopbot:gh-inflight:8") == 2  # b's and c's
    # Another installation has its own places.
    SharedPace(redis, 9, concurrent=2, sleep=time.sleep).before(request("GET"))


def test_a_request_that_never_ended_frees_its_place(redis: Redis) -> None:
    """A worker killed mid-request never answers its token: it lapses after its TTL. And
    a thread's next request gives back the place of its last one that got no answer (a
    timeout raised past the response hook)."""
    dead = SharedPace(redis, 10, concurrent=1, token_ttl=0.4, sleep=time.sleep)
    dead.before(request("GET"))  # ... and the worker is gone
    started = time.monotonic()
    alive = SharedPace(redis, 10, concurrent=1, token_ttl=0.4, sleep=time.sleep)
    alive.before(request("GET"))
    assert 0.3 <= time.monotonic() - started < 2
    # The same thread's next request, after a timeout: its own stale token is given back.
    alive.before(request("GET"))
    assert redis.zcard("loopbot:gh-inflight:10") == 1


def test_no_place_within_the_longest_wait_is_a_clear_unavailable(redis: Redis) -> None:
    SharedPace(redis, 11, concurrent=1, sleep=time.sleep).before(request("GET"))
    late = SharedPace(redis, 11, concurrent=1, max_wait=0.3, sleep=time.sleep)
    with pytest.raises(Unavailable, match="LOOPBOT_GITHUB_MAX_CONCURRENT"):
        late.before(request("POST"))
    assert redis.zcard("loopbot:gh-inflight:11") == 1


def test_a_yielding_write_lets_the_loops_own_writes_go_first(redis: Redis) -> None:
    """A status edit (yielding) that finds writes queued steps aside: a write that joins
    the line after it still goes before it. With no queue it goes at once."""
    quick = SharedPace(redis, 12, gap=0.5, sleep=lambda s: None)  # reserves, does not wait
    reserve(quick)
    reserve(quick)  # the next free slot is a whole second away
    got: dict[str, int] = {}

    def status_edit() -> None:
        got["yielding"] = SharedPace(redis, 12, gap=0.5).before(request("PATCH"), yielding=True)

    t = threading.Thread(target=status_edit)
    t.start()
    time.sleep(0.2)
    got["merge"] = SharedPace(redis, 12, gap=0.5, sleep=lambda s: None).before(request("PUT"))
    t.join()
    assert got["merge"] < got["yielding"], got
    # Nothing queued: a yielding write takes the next slot like any other.
    idle = SharedPace(redis, 13, gap=0.5, sleep=lambda s: None)
    started = time.monotonic()
    idle.before(request("PATCH"), yielding=True)
    assert time.monotonic() - started < 0.2


def test_a_graphql_query_is_a_read_and_a_mutation_a_write(redis: Redis) -> None:
    """GitHub counts GraphQL mutations as content-creating, not its queries: a query takes
    no write slot, a mutation (or anything not plainly a query) does."""
    from bot.io.github.pace import graphql_query

    def gql(text: Any) -> httpx.Request:
        return httpx.Request("POST", "https://api.github.com/graphql", json={"query": text})

    assert graphql_query(gql("query($owner: String!) { repository { id } }"))
    assert graphql_query(gql("\n  # a comment\n  { viewer { login } }"))
    assert not graphql_query(gql("mutation { addComment(input: {}) { clientMutationId } }"))
    assert not graphql_query(gql("  # query\n mutation M { x }"))
    assert not graphql_query(gql(None))
    # Several operations: GitHub runs the one operationName names, maybe the mutation.
    assert not graphql_query(gql("query Q { a }\nmutation M { addStar { x } }"))
    assert not graphql_query(httpx.Request("POST", "https://api.github.com/graphql", content=b"{"))
    assert not graphql_query(httpx.Request("POST", "https://api.github.com/repos/a/b/issues"))
    p = SharedPace(redis, 14, gap=5.0, sleep=lambda s: None)
    p.before(request("POST"))  # the next write slot is 5 s off
    started = time.monotonic()
    p.before(gql("query { viewer { login } }"))  # a read: no slot
    assert time.monotonic() - started < 0.5
    ms, _ = p._slot(keys=list(p.keys), args=[1, 5000, 120_000])
    assert 4000 < int(ms) < 6000  # the query took no slot: the next write is 5 s off, not 10


def test_a_line_longer_than_the_pause_bound_is_waited_not_failed(redis: Redis) -> None:
    """Fifty loops' writes at a 2 s gap make a line of minutes: a write waits its turn
    (up to LOOPBOT_GITHUB_MAX_QUEUE_WAIT) instead of failing its job at the bound for
    GitHub's pauses, which would only send it again later."""
    filler = SharedPace(redis, 15, gap=1.0, sleep=lambda s: None)
    for _ in range(5):
        reserve(filler)  # a line of 5 s
    slept: list[float] = []
    patient = SharedPace(redis, 15, gap=1.0, max_wait=2.0, queue_wait=30.0, sleep=slept.append)
    patient.before(request("POST"))
    assert 4.0 < sum(slept) < 6.5, slept
    # A line past the queue bound is still refused, and takes no slot.
    short = SharedPace(redis, 15, gap=1.0, max_wait=2.0, queue_wait=3.0, sleep=slept.append)
    with pytest.raises(Unavailable, match="LOOPBOT_GITHUB_MAX_QUEUE_WAIT"):
        short.before(request("POST"))


def test_a_write_stops_giving_way_once_asked(redis: Redis) -> None:
    """A status edit gives way while its callable says so; once a job waits for it (the
    callable turns False), it takes its place in line at the next look."""
    filler = SharedPace(redis, 16, gap=1.0, sleep=lambda s: None)
    for _ in range(3):
        reserve(filler)  # a line of 3 s
    urgent = threading.Event()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        urgent.set()  # the job's end arrives during the first look's wait

    p = SharedPace(redis, 16, gap=1.0, sleep=sleep)
    p.before(request("PATCH"), yielding=lambda: not urgent.is_set())
    assert slept[0] == 1.0  # it gave way once (one look)...
    assert len(slept) == 2 and slept[1] > 2.0, slept  # ...then waited its slot in line


def test_a_write_delayed_after_its_slot_still_starts_a_gap_after_the_last(redis: Redis) -> None:
    """Write A's slot comes, but no place in flight is free (two slow reads hold both);
    write B's slot comes a gap later, when a place is free again. B is not sent right
    after A: two writes never start closer than the gap (the red team's 0.13 s)."""
    gap = 1.0
    sent: dict[str, float] = {}
    readers = [SharedPace(redis, 17, gap=gap, concurrent=2, sleep=time.sleep) for _ in range(2)]
    for r in readers:
        r.before(request("GET"))  # both places held

    def write(name: str, delay: float) -> None:
        time.sleep(delay)
        SharedPace(redis, 17, gap=gap, concurrent=2, sleep=time.sleep).before(request("POST"))
        sent[name] = time.monotonic()

    started = time.monotonic()
    threads = [threading.Thread(target=write, args=(n, d)) for n, d in (("a", 0.0), ("b", 0.1))]
    for t in threads:
        t.start()
    time.sleep(0.9)
    for r in readers:
        r.give_back()  # the reads end; both writes may go
    for t in threads:
        t.join()
    assert abs(sent["b"] - sent["a"]) >= gap - 0.05, (sent, started)


def test_a_request_waiting_for_a_place_is_not_sent_inside_a_pause(redis: Redis) -> None:
    """A read holds the only place; another waits for it; meanwhile another worker is
    refused and pauses the installation: the waiting request goes after the pause."""
    holder = SharedPace(redis, 18, concurrent=1, sleep=time.sleep)
    holder.before(request("GET"))
    sent: list[float] = []
    waiter = SharedPace(redis, 18, concurrent=1, sleep=time.sleep)

    def go() -> None:
        waiter.before(request("POST"))
        sent.append(time.monotonic())

    t = threading.Thread(target=go)
    t.start()
    time.sleep(0.3)
    paused_at = time.monotonic()
    SharedPace(redis, 18).pause(2.0, "another worker's 403", slower=False)
    time.sleep(0.2)
    holder.give_back()
    t.join()
    assert sent and sent[0] - paused_at >= 1.9, sent[0] - paused_at


def test_a_guard_runs_after_every_wait_and_stops_the_request(redis: Redis) -> None:
    """A status edit's lease check runs right before sending, after the pace's waits: a
    lease lost during the wait stops it there."""
    p = SharedPace(redis, 19, sleep=time.sleep)
    p.pause(0.5, "a 403", slower=False)
    lost = threading.Event()
    threading.Timer(0.2, lost.set).start()

    def check() -> None:
        if lost.is_set():
            raise RuntimeError("lease lost")

    with p.guarded(check), pytest.raises(RuntimeError, match="lease lost"):
        p.before(request("PATCH"))
    p.before(request("PATCH"))  # outside the guard: sent


def test_odd_headers_never_break_the_hooks() -> None:
    assert pause_for(403, {"retry-after": "nan"}, "") is None
    assert pause_for(403, {"retry-after": "inf"}, "") is None
    assert pause_for(429, {"retry-after": "99999999"}, "")[0] == 3600.0  # type: ignore[index]
    far = {"x-ratelimit-remaining": "1", "x-ratelimit-reset": "1e30"}
    assert spread_for(far, NOW) == (10.0, 3600.0)
