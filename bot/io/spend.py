"""The spend counters in Redis: one per cap and period, shared by every worker.

Keys (under ``loopbot:spend:``, see ``bot.core.spend.caps.counter``):
  repo:{owner/name}:day:{YYYY-MM-DD}    micro-dollars spent (and reserved) that UTC day
  repo:{owner/name}:month:{YYYY-MM}
  inst:{id}:day:{...}, inst:{id}:month:{...}   the same across an installation
  totals                                hash "repo|backend|model|kind" -> running total
                                        (kind: usd_micro, input, output, cache_read,
                                        cache_write): the Prometheus counters

A call's worst case is reserved on every counter it is held to in one Lua script, which
first checks that each has room: two workers never both take the last room, whatever
their timing. When the call returns, the reservation is replaced by what it was billed
(``settle``); a call that was refused and not billed gives it back. A worker killed
between the two leaves its reservation counted: the caps err on the safe side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from bot.core.record import Usage
from bot.core.spend.caps import MICRO

P = "loopbot:spend:"
TOTALS = P + "totals"

# KEYS: the counters; ARGV[1]: micro-dollars to reserve; ARGV[2]: TTL in seconds;
# ARGV[3..]: each counter's cap. Returns 0 when reserved, else the 1-based index of the
# first counter without room, and reserves nothing.
_RESERVE = """
local amount = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local spent = tonumber(redis.call('GET', key) or '0')
  if spent + amount > tonumber(ARGV[2 + i]) then
    return {i, spent}
  end
end
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, amount)
  redis.call('EXPIRE', key, tonumber(ARGV[2]))
end
return {0, 0}
"""


@dataclass(frozen=True)
class Full:
    """The counter at ``index`` (of those asked) had no room: ``spent`` micro-dollars."""

    index: int
    spent: int


class SpendMeter:
    def __init__(self, redis: Redis, ttl_seconds: int) -> None:
        self.redis = redis
        self.ttl = ttl_seconds
        self._reserve = redis.register_script(_RESERVE)

    def reserve(self, counters: Sequence[str], caps: Sequence[int], amount: int) -> Full | None:
        """Add ``amount`` to every counter if each stays within its cap, atomically; else
        which one is full, and nothing is added."""
        keys = [P + c for c in counters]
        index, spent = self._reserve(keys=keys, args=[amount, self.ttl, *caps])
        return None if int(index) == 0 else Full(int(index) - 1, int(spent))

    def settle(self, counters: Sequence[str], reserved: int, billed: int) -> None:
        """Replace a reservation of ``reserved`` by what the call was ``billed``."""
        if billed == reserved:
            return
        pipe = self.redis.pipeline()
        for c in counters:
            pipe.incrby(P + c, billed - reserved)
        pipe.execute()

    def add(self, counters: Sequence[str], amount: int) -> None:
        """A charge with no reservation before it (a call the caps were not asked about)."""
        pipe = self.redis.pipeline()
        for c in counters:
            pipe.incrby(P + c, amount)
            pipe.expire(P + c, self.ttl)
        pipe.execute()

    def spent(self, counter: str) -> int:
        return int(self.redis.get(P + counter) or 0)

    def count(self, repo: str, backend: str, model: str, used: Usage) -> None:
        """What a call was billed, on the running totals Prometheus reads (counters: they
        only rise)."""
        label = f"{repo}|{backend}|{model}"
        pipe = self.redis.pipeline()
        for kind, value in (
            ("usd_micro", round(used.cost_usd * MICRO)),
            ("input", used.input_tokens),
            ("output", used.output_tokens),
            ("cache_read", used.cache_read_tokens),
            ("cache_write", used.cache_write_tokens),
        ):
            if value:
                pipe.hincrby(TOTALS, f"{label}|{kind}", value)
        pipe.execute()

    def totals(self) -> dict[tuple[str, str, str, str], int]:
        """(repo, backend, model, kind) -> running total."""
        out: dict[tuple[str, str, str, str], int] = {}
        for field, value in self.redis.hgetall(TOTALS).items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            parts = name.rsplit("|", 3)
            if len(parts) == 4:
                out[(parts[0], parts[1], parts[2], parts[3])] = int(value)
        return out

    def days(self, repo: str, dates: Sequence[str]) -> list[int]:
        """A repository's micro-dollars on each of ``dates`` (``YYYY-MM-DD``)."""
        if not dates:
            return []
        values: list[Any] = list(self.redis.mget([f"{P}repo:{repo}:day:{d}" for d in dates]))
        return [int(v or 0) for v in values]
