"""One GitHub pace per installation, shared by every worker through Redis.

GitHub's secondary rate limits are per installation, whatever process sends: fifty loops
on five workers that each retried their own 403 kept the other four writing into the
limit. So, as octokit's throttling plugin does for one process, but across processes:

* **writes** (POST, PATCH, PUT, DELETE; GraphQL's POSTs too) of one installation start
  at least ``gap`` seconds apart: each takes the next free slot from Redis (``_SLOT``,
  atomic) and waits for it (a write slower than the gap may overlap the next);
* a **403 or 429 from a secondary limit** (a ``Retry-After``, or GitHub's "secondary rate
  limit" message without one: one minute, as GitHub's docs ask) pauses every request of
  the installation, on every worker, until then, and doubles its write gap for ten
  minutes (the pace that hit the limit would hit it again);
* the **primary limit**: once fewer than ``RESERVE`` REST requests are left, the
  installation's writes are spread over the time to ``x-ratelimit-reset`` (at most
  ``MAX_GAP`` apart); at zero, GitHub's refusal says when to retry;
* a wait longer than ``max_wait`` is not waited: ``Unavailable`` is raised (the job
  fails and RQ retries it later), so a worker is never held for an hour.

The hooks run inside githubkit's HTTP client (httpx event hooks), so every call of an
installation passes here, retries included. The clock is Redis's (``TIME``): workers on
machines whose clocks differ share one schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from redis import Redis

from bot.io.github.failures import Unavailable
from bot.io.logs import get_logger

log = get_logger("loopbot.github.pace")

WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})
GAP = 1.0  # seconds between two writes of one installation (octokit's default)
RESERVE = 50  # requests of the primary limit kept back (of 5,000 or more an hour)
SECONDARY_WAIT = 60.0  # seconds, when a secondary limit gives no Retry-After
# After a secondary limit the installation's writes are spaced twice as far apart, at
# least a second (GitHub's documented minimum) and at most MAX_GAP, for every worker, for
# LEARNED_FOR: the pace that hit the limit once would hit it again after the pause.
MIN_LEARNED_GAP = 1.0
MAX_GAP = 10.0
LEARNED_FOR = 600.0

# KEYS: pause-until, next write slot (both ms on Redis's clock), the installation's
# learned gap (ms). ARGV: write (1/0), the configured gap (ms), the longest wait (ms).
# Returns {ms to wait before sending, the slot (ms on Redis's clock)}; a slot further off
# than the longest wait is not taken (the caller gives up: the queue does not grow).
_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pause = tonumber(redis.call('GET', KEYS[1]) or '0')
local slot = math.max(now, pause)
if ARGV[1] == '1' then
  slot = math.max(slot, tonumber(redis.call('GET', KEYS[2]) or '0'))
  if slot - now > tonumber(ARGV[3]) then return {slot - now, slot} end
  local gap = math.max(tonumber(ARGV[2]), tonumber(redis.call('GET', KEYS[3]) or '0'))
  redis.call('SET', KEYS[2], slot + gap, 'PX', slot + gap - now + 60000)
end
return {slot - now, slot}
"""
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
        return max(after, 1.0), f"{status} with Retry-After"
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
    return min((reset - now) / max(remaining, 1.0), MAX_GAP), reset - now


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class SharedPace:
    """The pace of one installation (``hooks()`` go into its githubkit client)."""

    def __init__(
        self,
        redis: Redis,
        installation_id: int,
        *,
        gap: float = GAP,
        max_wait: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = redis
        self.keys = (
            f"loopbot:gh-pause:{installation_id}",
            f"loopbot:gh-write:{installation_id}",
            f"loopbot:gh-gap:{installation_id}",
        )
        self.installation_id = installation_id
        self.gap, self.max_wait = gap, max_wait
        self.sleep, self.clock = sleep, clock
        self._slot = redis.register_script(_SLOT)
        self._left = redis.register_script(_LEFT)
        self._pause = redis.register_script(_PAUSE)
        self._spread = redis.register_script(_SPREAD)

    def hooks(self) -> dict[str, list[Callable[..., Any]]]:
        return {"request": [self.before], "response": [self.after]}

    def before(self, request: httpx.Request) -> int:
        """Wait for this request's turn: a write's slot, or the end of a pause; again if a
        pause began while it waited (its slot falls inside the pause). Returns the slot
        it was given (ms on Redis's clock). Raises ``Unavailable`` for a wait past
        ``max_wait``: the job fails and is retried later, no worker is held."""
        write = request.method.upper() in WRITES
        args = [1 if write else 0, int(self.gap * 1000), int(self.max_wait * 1000)]
        while True:
            ms, slot = (int(v) for v in self._slot(keys=list(self.keys), args=args))
            if ms > self.max_wait * 1000:
                paused = int(self._left(keys=[self.keys[0]])) > 0
                raise Unavailable(
                    f"GitHub installation {self.installation_id}: the next "
                    f"{'write' if write else 'request'} could go in {ms / 1000:.0f} s "
                    f"({'GitHub paused it' if paused else 'its writes are queued'}; more "
                    f"than LOOPBOT_GITHUB_MAX_RETRY_WAIT, {self.max_wait:.0f} s)"
                )
            if ms > 0:
                self.sleep(ms / 1000)
            if int(self._left(keys=[self.keys[0]])) <= 0:
                return slot

    def after(self, response: httpx.Response) -> None:
        """Read the answer's limits: a secondary limit pauses the installation for every
        worker; a primary limit near its end spreads the writes until its reset."""
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
