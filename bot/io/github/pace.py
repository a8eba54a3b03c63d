"""One GitHub pace per installation, shared by every worker through Redis.

GitHub's secondary rate limits are per installation, whatever process sends: fifty loops
on five workers that each retried their own 403 kept the other four writing into the
limit. So, as octokit's throttling plugin does for one process, but across processes:

* **writes** (POST, PATCH, PUT, DELETE) of one installation go one at a time, at least
  ``gap`` seconds apart: each takes the next free slot from Redis (``_SLOT``, atomic)
  and waits for it;
* a **403 or 429 from a secondary limit** (a ``Retry-After``, or GitHub's "secondary rate
  limit" message without one: one minute, as GitHub's docs ask) pauses every request of
  the installation, on every worker, until then, and doubles its write gap for ten
  minutes (the pace that hit the limit would hit it again);
* the **primary limit**: once ``x-ratelimit-remaining`` falls below ``RESERVE``, every
  request of the installation waits for ``x-ratelimit-reset``;
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
MAX_GAP = 10.0
LEARNED_FOR = 600.0

# KEYS: pause-until, next write slot (both ms on Redis's clock), the installation's
# learned gap (ms). ARGV: write (1/0), the configured gap (ms). Returns {ms to wait before
# sending, the slot (ms on Redis's clock)}.
_SLOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pause = tonumber(redis.call('GET', KEYS[1]) or '0')
local slot = math.max(now, pause)
if ARGV[1] == '1' then
  slot = math.max(slot, tonumber(redis.call('GET', KEYS[2]) or '0'))
  local gap = math.max(tonumber(ARGV[2]), tonumber(redis.call('GET', KEYS[3]) or '0'))
  redis.call('SET', KEYS[2], slot + gap, 'PX', slot + gap - now + 60000)
end
return {slot - now, slot}
"""
# KEYS: pause-until, learned gap. ARGV: ms from now, the gap to learn (ms, 0: none). The
# later of the pause set and this one; the learned gap lasts LEARNED_FOR.
_PAUSE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ = now + tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
local gap = tonumber(ARGV[2])
if gap > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], gap, 'PX', tonumber(ARGV[3]))
end
if until_ > held then
  redis.call('SET', KEYS[1], until_, 'PX', until_ - now + 60000)
  return until_ - now
end
return held - now
"""


def pause_for(status: int, headers: Any, message: str, now: float) -> tuple[float, str] | None:
    """How long an answer says to pause the installation (seconds, why), or None. Pure:
    ``now`` is the epoch seconds ``x-ratelimit-reset`` is measured against."""
    remaining = _number(headers.get("x-ratelimit-remaining"))
    reset = _number(headers.get("x-ratelimit-reset"))
    if status in (403, 429):
        after = _number(headers.get("retry-after"))
        if after is not None:
            return max(after, 1.0), f"{status} with Retry-After"
        if "secondary rate limit" in message.lower():
            return SECONDARY_WAIT, f"{status}: secondary rate limit"
        if remaining == 0 and reset is not None:
            return max(reset - now, 1.0), f"{status}: primary rate limit"
    if remaining is not None and reset is not None and remaining < RESERVE:
        return max(reset - now, 1.0), f"primary rate limit: {remaining:.0f} left"
    return None


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
        self._pause = redis.register_script(_PAUSE)
        self.waited = 0.0  # seconds this process waited for the pace (for the benchmark)

    def hooks(self) -> dict[str, list[Callable[..., Any]]]:
        return {"request": [self.before], "response": [self.after]}

    def before(self, request: httpx.Request) -> int:
        """Wait for this request's turn: a write's slot, or the end of a pause. Returns
        the slot it was given (ms on Redis's clock)."""
        write = request.method.upper() in WRITES
        ms, slot = self._slot(keys=list(self.keys), args=[1 if write else 0, int(self.gap * 1000)])
        if int(ms) <= 0:
            return int(slot)
        seconds = int(ms) / 1000
        if seconds > self.max_wait:
            raise Unavailable(
                f"GitHub paused installation {self.installation_id} for {seconds:.0f} s "
                f"(more than LOOPBOT_GITHUB_MAX_RETRY_WAIT, {self.max_wait:.0f} s)"
            )
        self.waited += seconds
        self.sleep(seconds)
        return int(slot)

    def after(self, response: httpx.Response) -> None:
        """Read the answer's limits: a secondary limit or a near-empty primary one pauses
        the installation for every worker."""
        status = response.status_code
        message = ""
        if status in (403, 429):
            try:
                response.read()
                message = str((response.json() or {}).get("message", ""))
            except (ValueError, AttributeError, httpx.HTTPError):
                message = ""
        found = pause_for(status, response.headers, message, self.clock())
        if found is None:
            return
        seconds, why = found
        self.pause(seconds, why, slower=status in (403, 429) and "primary" not in why)

    def gap_now(self) -> float:
        """The installation's write gap now: the configured one, or the learned one."""
        learned = self.redis.get(self.keys[2])
        return max(self.gap, int(learned) / 1000 if learned else 0.0)

    def pause(self, seconds: float, why: str, *, slower: bool = False) -> None:
        """Pause the installation ``seconds`` for every worker; ``slower``: and double its
        write gap (a secondary limit was hit at this pace)."""
        gap = min(max(self.gap_now() * 2, 1.0), MAX_GAP) if slower else 0.0
        held = int(
            self._pause(
                keys=[self.keys[0], self.keys[2]],
                args=[int(seconds * 1000), int(gap * 1000), int(LEARNED_FOR * 1000)],
            )
        )
        log.warning(
            "github.paused",
            installation=self.installation_id,
            why=why,
            seconds=held / 1000,
            write_gap=gap or None,
        )
