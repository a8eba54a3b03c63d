"""One GitHub pace per installation, shared by every worker through Redis.

GitHub's secondary rate limits are per installation, whatever process sends: fifty loops
on five workers that each retried their own 403 kept the other four writing into the
limit. So, as octokit's throttling plugin does for one process, but across processes:

* **writes** (POST, PATCH, PUT, DELETE; GraphQL mutations, not its queries) of one
  installation start
  at least ``gap`` seconds apart: each takes the next free slot from Redis (``_SLOT``,
  atomic) and waits for it (a write slower than the gap may overlap the next);
* a **403 or 429 from a secondary limit** (a ``Retry-After``, or GitHub's "secondary rate
  limit" message without one: one minute, as GitHub's docs ask) pauses every request of
  the installation, on every worker, until then, and doubles its write gap for ten
  minutes (the pace that hit the limit would hit it again);
* the **primary limit**: once fewer than ``RESERVE`` REST requests are left, the
  installation's writes are spread over the time to ``x-ratelimit-reset`` (at most
  ``MAX_GAP`` apart); at zero, GitHub's refusal says when to retry;
* **requests in flight** (reads and writes) of one installation are at most
  ``concurrent`` at once across every worker (GitHub refuses more than 100 concurrent
  requests of one installation, REST and GraphQL together): each holds a token in a
  Redis sorted set while it runs (``_ENTER``), scored with when it lapses, so a worker
  killed mid-request frees its place after ``token_ttl``;
* a pause longer than ``max_wait``, or a line of writes longer than ``queue_wait``, is
  not waited: ``Unavailable`` is raised (the job
  fails and RQ retries it later), so a worker is never held for an hour.

The hooks run inside githubkit's HTTP client (httpx event hooks), so every call of an
installation passes here, retries included. The clock is Redis's (``TIME``): workers on
machines whose clocks differ share one schedule.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from redis import Redis

from bot.io.github import tally
from bot.io.github.conditional import NOT_MODIFIED
from bot.io.github.failures import Unavailable
from bot.io.logs import get_logger

log = get_logger("loopbot.github.pace")

WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})
GAP = 1.0  # seconds between two writes of one installation (octokit's default)
RESERVE = 50  # requests of the primary limit kept back (of 5,000 or more an hour)
MAX_PAUSE = 3600.0  # seconds: a longer Retry-After or reset is read as this (the hour)
SECONDARY_WAIT = 60.0  # seconds, when a secondary limit gives no Retry-After
# After a secondary limit the installation's writes are spaced twice as far apart, at
# least a second (GitHub's documented minimum) and at most MAX_GAP, for every worker, for
# LEARNED_FOR: the pace that hit the limit once would hit it again after the pause.
MIN_LEARNED_GAP = 1.0
MAX_GAP = 10.0
LEARNED_FOR = 600.0

# KEYS: pause-until, next write slot (both ms on Redis's clock), the installation's
# learned gap (ms). ARGV: write (1/0), the configured gap (ms), the longest wait in the
# line of writes (ms), for a write that yields to others the wait (ms) past which it
# does (0: it does not), and the longest pause waited out (ms). Returns {ms to wait
# before sending, the slot (ms on Redis's clock)}. No slot is taken when the pause or the
# line is longer than the caller waits (it gives up: the line does not grow), nor when a
# yielding write would wait too long ({ms, -1}: it tries again).
_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pause = tonumber(redis.call('GET', KEYS[1]) or '0')
if pause - now > tonumber(ARGV[5] or ARGV[3]) then return {pause - now, 0} end
local slot = math.max(now, pause)
if ARGV[1] == '1' then
  slot = math.max(slot, tonumber(redis.call('GET', KEYS[2]) or '0'))
  if slot - now > tonumber(ARGV[3]) then return {slot - now, slot} end
  local yield = tonumber(ARGV[4] or '0')
  if yield > 0 and slot - now > yield then return {slot - now, -1} end
  local gap = math.max(tonumber(ARGV[2]), tonumber(redis.call('GET', KEYS[3]) or '0'))
  redis.call('SET', KEYS[2], slot + gap, 'PX', slot + gap - now + 60000)
end
return {slot - now, slot}
"""
# KEYS: the installation's requests in flight (a sorted set: token -> lapses at, ms),
# pause-until, when its last write started (ms), its learned gap (ms). ARGV: a token,
# the bound, its time to live (ms), write (1/0; 2: a write whose start ``ahead`` kept),
# the configured gap (ms). Returns {code, ms}: {1, 0} a place taken (a write's start
# kept); {0, 0} none free; {2, ms} paused for ms more; {3, ms} a write that would start
# less than the gap after the last one (its slot came late), ms to wait. Tokens of
# requests that never ended (a killed worker) lapse.
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pause = tonumber(redis.call('GET', KEYS[2]) or '0')
if pause > now then return {2, pause - now} end
if ARGV[4] == '1' then
  local gap = math.max(tonumber(ARGV[5]), tonumber(redis.call('GET', KEYS[4]) or '0'))
  local last = tonumber(redis.call('GET', KEYS[3]) or '0')
  if last + gap > now then return {3, last + gap - now} end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return {0, 0} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
if ARGV[4] == '1' then redis.call('SET', KEYS[3], now, 'PX', tonumber(ARGV[5]) + 60000) end
return {1, 0}
"""
CONCURRENT = 20  # requests of one installation in flight at once, across every worker
ENTER_POLL = 0.05  # seconds between two tries for a place in flight

_WAITED = threading.local()


def waited_here() -> float:
    """Seconds this thread has waited for GitHub's pace (slots, pauses, places in
    flight) since it began: what the pace added to the job it runs."""
    return float(getattr(_WAITED, "seconds", 0.0))


def _wait(sleep: Callable[[float], None], seconds: float) -> None:
    _WAITED.seconds = waited_here() + seconds
    sleep(seconds)


# A yielding write (``SharedPace.before``) lets others go first while the next free slot
# is more than a gap and YIELD_SLACK away, looks again every YIELD_POLL, and after
# YIELD_FOR of that takes its place in line anyway (it is not starved).
YIELD_SLACK, YIELD_POLL, YIELD_FOR = 0.25, 1.0, 60.0
QUEUE_WAIT = 1800.0  # seconds a write waits in the installation's line before failing

# KEYS: pause-until. Returns the ms the installation stays paused (0 or less: not).
_LEFT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return tonumber(redis.call('GET', KEYS[1]) or '0') - now
"""
# KEYS: pause-until, learned gap. ARGV: ms from now, slower (1/0), the configured gap
# (ms), the gap's bounds (ms), how long a learned gap lasts (ms). Sets the later of the
# pause held and this one. A secondary limit hit while no pause holds (a new episode, not
# the other refusals of the same burst) doubles the learned gap and restarts its timer.
_PAUSE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ = now + tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[2] == '1' and held <= now then
  local cur = math.max(tonumber(ARGV[3]), tonumber(redis.call('GET', KEYS[2]) or '0'))
  local gap = math.min(math.max(cur * 2, tonumber(ARGV[4])), tonumber(ARGV[5]))
  redis.call('SET', KEYS[2], gap, 'PX', tonumber(ARGV[6]))
end
if until_ > held then
  redis.call('SET', KEYS[1], until_, 'PX', until_ - now + 60000)
  return until_ - now
end
return held - now
"""
# KEYS: learned gap. ARGV: a gap (ms), how long (ms). The larger of it and the one held.
_SPREAD = """
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 0
"""


def pause_for(status: int, headers: Any, message: str) -> tuple[float, str] | None:
    """How long a refusal says to pause the installation (seconds, why), or None. Pure."""
    if status not in (403, 429):
        return None
    after = _number(headers.get("retry-after"))
    if after is not None:
        return min(max(after, 1.0), MAX_PAUSE), f"{status} with Retry-After"
    if "secondary rate limit" in message.lower():
        return SECONDARY_WAIT, f"{status}: secondary rate limit"
    return None


def spread_for(headers: Any, now: float) -> tuple[float, float] | None:
    """The write gap that makes the primary limit last until its reset (seconds, and for
    how long), once fewer than ``RESERVE`` requests are left; None otherwise. Only the
    REST budget (``x-ratelimit-resource: core``): GraphQL and search have their own. At
    zero GitHub refuses, and githubkit's ``RateLimitExceeded`` waits for the reset. Pure."""
    if (headers.get("x-ratelimit-resource") or "core") != "core":
        return None
    remaining = _number(headers.get("x-ratelimit-remaining"))
    reset = _number(headers.get("x-ratelimit-reset"))
    if remaining is None or reset is None or remaining >= RESERVE or reset <= now:
        return None
    until = min(reset - now, MAX_PAUSE)
    return min(until / max(remaining, 1.0), MAX_GAP), until


def graphql_query(request: httpx.Request) -> bool:
    """A GraphQL POST that only reads (a query, not a mutation): GitHub counts it as a
    read, not a content-creating request. Pure (the body httpx has already built)."""
    if not request.url.path.endswith("/graphql"):
        return False
    try:
        text = json.loads(request.content).get("query")
    except (httpx.RequestNotRead, ValueError, AttributeError):
        return False
    if not isinstance(text, str):
        return False
    if re.search(r"\bmutation\b", text):
        return False  # a document naming a mutation anywhere may run it (operationName)
    lines = (line.strip() for line in text.splitlines())
    first = next((line for line in lines if line and not line.startswith("#")), "")
    return first.startswith("{") or re.match(r"query\b", first) is not None


def _number(value: Any) -> float | None:
    """A header's number, if it is a finite one (``nan`` or ``inf`` is not)."""
    try:
        number = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return number if number is not None and math.isfinite(number) else None


class SharedPace:
    """The pace of one installation (``hooks()`` go into its githubkit client)."""

    def __init__(
        self,
        redis: Redis,
        installation_id: int,
        *,
        gap: float = GAP,
        max_wait: float = 120.0,
        queue_wait: float = QUEUE_WAIT,
        concurrent: int = CONCURRENT,
        token_ttl: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.inflight = f"loopbot:gh-inflight:{installation_id}"
        self.last_write = f"loopbot:gh-last-write:{installation_id}"
        self.concurrent, self.token_ttl = concurrent, token_ttl
        # The token this thread's request holds. A thread sends one request at a time, so
        # a token still held when it sends the next is one whose answer never came (a
        # timeout, a dropped link): it is given back then.
        self._held = threading.local()
        self.keys = (
            f"loopbot:gh-pause:{installation_id}",
            f"loopbot:gh-write:{installation_id}",
            f"loopbot:gh-gap:{installation_id}",
        )
        self.installation_id = installation_id
        self.gap, self.max_wait = gap, max_wait
        # The line of writes is as long as there are writers (one waiting write a thread
        # at most): fifty loops at a 2 s gap wait minutes, and failing them would only
        # send them again later. A pause is GitHub's word, and waited only up to max_wait.
        self.queue_wait = max(queue_wait, max_wait)
        self.sleep, self.clock = sleep, clock
        self._slot = redis.register_script(_SLOT)
        self._left = redis.register_script(_LEFT)
        self._pause = redis.register_script(_PAUSE)
        self._spread = redis.register_script(_SPREAD)
        self._enter = redis.register_script(_ENTER)

    def hooks(self) -> dict[str, list[Callable[..., Any]]]:
        return {"request": [self.before], "response": [self.after]}

    def before(self, request: httpx.Request, *, yielding: bool | Callable[[], bool] = False) -> int:
        """Wait for this request's turn: a write's slot, or the end of a pause; again if a
        pause began while it waited (its slot falls inside the pause). Returns the slot
        it was given (ms on Redis's clock). Raises ``Unavailable`` for a wait past
        ``max_wait``: the job fails and is retried later, no worker is held.

        ``yielding``: a write that can wait (a status comment's edit) takes a slot only
        while no other write of the installation waits for one, for up to ``YIELD_FOR``;
        then it takes its place in line like any write. The loops' own writes (a push's
        check run, a pull request, a merge) never queue behind it. A callable is asked
        again at every look: once it says False, the write stops giving way."""
        still = yielding if callable(yielding) else (lambda: bool(yielding))
        write = request.method.upper() in WRITES and not graphql_query(request)
        sending = 1 if write else 0
        if write and getattr(self._held, "prepaid", False):
            self._held.prepaid = False  # its slot was waited for by ``ahead``
            write, sending = False, 2  # only a pause set since then is waited out
        gap = int(self.gap * 1000)
        threshold = max(gap, 1) + int(YIELD_SLACK * 1000) if write and still() else 0
        yielded = 0.0
        while True:
            args = [
                1 if write else 0,
                gap,
                int(self.queue_wait * 1000),
                threshold,
                int(self.max_wait * 1000),
            ]
            ms, slot = (int(v) for v in self._slot(keys=list(self.keys), args=args))
            if slot == -1:  # others are waiting: let them go first, and look again
                step = min(ms / 1000, YIELD_POLL)
                _wait(self.sleep, step)
                yielded += step
                if yielded >= YIELD_FOR or not still():
                    threshold = 0
                continue
            if ms > self.max_wait * 1000:
                left = int(self._left(keys=[self.keys[0]]))
                if left > self.max_wait * 1000:
                    raise Unavailable(
                        f"GitHub installation {self.installation_id}: GitHub paused it for "
                        f"{left / 1000:.0f} s more (more than LOOPBOT_GITHUB_MAX_RETRY_WAIT, "
                        f"{self.max_wait:.0f} s)"
                    )
                if ms > self.queue_wait * 1000:
                    raise Unavailable(
                        f"GitHub installation {self.installation_id}: the next write could "
                        f"go in {ms / 1000:.0f} s (its writes are queued; more than "
                        f"LOOPBOT_GITHUB_MAX_QUEUE_WAIT, {self.queue_wait:.0f} s)"
                    )
            if ms > 0:
                _wait(self.sleep, ms / 1000)
            if int(self._left(keys=[self.keys[0]])) <= 0:
                self._take_place(sending)
                return slot

    @contextlib.contextmanager
    def ahead(self, *, yielding: bool | Callable[[], bool] = False) -> Iterator[None]:
        """Wait now for the write slot of the first write this thread sends in the body,
        so what it sends can be built after the wait: a status comment then shows the
        loop's state when it goes, not when it joined the line (``jobs.status_comment``).
        ``yielding``: as ``before``'s.
        """
        self.before(httpx.Request("POST", "https://api.github.com/"), yielding=yielding)
        self.give_back()
        self._held.prepaid = True
        try:
            yield
        finally:
            self._held.prepaid = False

    def _take_place(self, write: int) -> None:
        """Wait for a place among the installation's requests in flight, then send at
        once: not inside a pause set meanwhile, and a write not closer than the gap to
        the last write's start (a slot that came late would be). ``write``: 0 a read, 1
        a write, 2 a write whose start ``ahead`` already kept."""
        self.give_back()
        token = uuid.uuid4().hex
        args: list[str | int] = [
            token,
            self.concurrent,
            int(self.token_ttl * 1000),
            write,
            int(self.gap * 1000),
        ]
        keys = [self.inflight, self.keys[0], self.last_write, self.keys[2]]
        waited = 0.0
        while True:
            code, ms = (int(v) for v in self._enter(keys=keys, args=args))
            if code == 1:
                break
            if code == 2 and ms > self.max_wait * 1000:
                raise Unavailable(
                    f"GitHub installation {self.installation_id}: GitHub paused it for "
                    f"{ms / 1000:.0f} s more (more than LOOPBOT_GITHUB_MAX_RETRY_WAIT, "
                    f"{self.max_wait:.0f} s)"
                )
            if code == 0 and waited >= self.max_wait:
                raise Unavailable(
                    f"GitHub installation {self.installation_id}: no place for another "
                    f"{'write' if write else 'request'} among its {self.concurrent} in "
                    f"flight after {waited:.0f} s (LOOPBOT_GITHUB_MAX_CONCURRENT)"
                )
            step = ms / 1000 if code in (2, 3) else ENTER_POLL
            _wait(self.sleep, step)
            if code == 0:
                waited += step
        self._held.token = token
        guard = getattr(self._held, "guard", None)
        if guard is not None:
            guard()  # the caller's last check, after every wait (a lease still held?)

    @contextlib.contextmanager
    def guarded(self, check: Callable[[], None]) -> Iterator[None]:
        """Run ``check`` right before each request of this thread in the body is sent,
        after all its waits: a status edit whose loop lost its lease while it waited
        raises there and is not sent."""
        previous = getattr(self._held, "guard", None)
        self._held.guard = check
        try:
            yield
        finally:
            self._held.guard = previous

    def give_back(self) -> None:
        """Give back this thread's place in flight (its request ended, however)."""
        token = getattr(self._held, "token", None)
        if token is not None:
            self._held.token = None
            self.redis.zrem(self.inflight, token)

    def after(self, response: httpx.Response) -> None:
        """Read the answer's limits: a secondary limit pauses the installation for every
        worker; a primary limit near its end spreads the writes until its reset."""
        self.give_back()
        request = response.request
        write = request.method.upper() in WRITES and not graphql_query(request)
        kind = "write" if write else "read"
        if response.extensions.get(NOT_MODIFIED):
            kind = "read304"  # answered from the body held: not against the primary limit
        tally.count(self.redis, kind, request.method, request.url.path)
        status = response.status_code
        message = ""
        if status in (403, 429):
            response.read()  # the error body (a timeout here is the call's, not swallowed)
            try:
                message = str((response.json() or {}).get("message", ""))
            except (ValueError, AttributeError):
                message = ""
        found = pause_for(status, response.headers, message)
        if found is not None:
            self.pause(*found)
        spread = spread_for(response.headers, self.clock())
        if spread is not None:
            gap, until = spread
            self._spread(keys=[self.keys[2]], args=[int(gap * 1000), int(until * 1000) + 1])

    def gap_now(self) -> float:
        """The installation's write gap now: the configured one, or the learned one."""
        learned = self.redis.get(self.keys[2])
        return max(self.gap, int(learned) / 1000 if learned else 0.0)

    def pause(self, seconds: float, why: str, *, slower: bool = True) -> None:
        """Pause the installation ``seconds`` for every worker; ``slower``: a secondary
        limit was hit at this pace, so its writes are spaced twice as far apart."""
        held = int(
            self._pause(
                keys=[self.keys[0], self.keys[2]],
                args=[
                    int(seconds * 1000),
                    1 if slower else 0,
                    int(self.gap * 1000),
                    int(MIN_LEARNED_GAP * 1000),
                    int(MAX_GAP * 1000),
                    int(LEARNED_FOR * 1000),
                ],
            )
        )
        log.warning(
            "github.paused",
            installation=self.installation_id,
            why=why,
            seconds=held / 1000,
            write_gap=self.gap_now(),
        )
