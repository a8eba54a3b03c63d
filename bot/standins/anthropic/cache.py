"""The prompt-cache simulation (``PromptCache``) and the breakpoint rules it and the
request's validation share (``_breakpoints``)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.standins.anthropic.models import ModelSpec
from bot.standins.anthropic.tokens import _Unit, _units
from bot.standins.anthropic.wire import Json, _blocks

MAX_CACHE_POINTS = 4
CACHE_LOOKBACK = 20  # positions checked before each breakpoint, after its own
CACHE_TTL = {"5m": 300.0, "1h": 3600.0}


def _breakpoints(body: Json, units: list[_Unit]) -> tuple[list[int], str | None]:
    """The positions that are cache breakpoints, or why the API would reject them."""
    points = [n for n, u in enumerate(units) if u.cache is not None]
    nested = 0
    msgs = body.get("messages")
    for msg in msgs if isinstance(msgs, list) else []:
        for block in _blocks(msg if isinstance(msg, dict) else {}):
            content = block.get("content")
            if block.get("type") == "tool_result" and isinstance(content, list):
                nested += sum(1 for b in content if isinstance(b, dict) and "cache_control" in b)
    top = body.get("cache_control")
    if top is not None and units and units[-1].cache is None:
        units[-1].cache = top  # automatic caching: the last cacheable block
        points.append(len(units) - 1)
    found = len(points) + nested
    if found > MAX_CACHE_POINTS:
        return points, (
            f"A maximum of {MAX_CACHE_POINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )
    seen_short = False
    for n in points:
        cache = units[n].cache
        if not isinstance(cache, dict) or cache.get("type") != "ephemeral":
            return points, f"{units[n].path}.cache_control.type: Input should be 'ephemeral'"
        ttl = cache.get("ttl", "5m")
        if ttl not in CACHE_TTL:
            return points, f"{units[n].path}.cache_control.ttl: Input should be '5m' or '1h'"
        if ttl == "1h" and seen_short:
            return points, (
                f"{units[n].path}.cache_control: a `ttl='1h'` cache_control block must not "
                "come after a `ttl='5m'` cache_control block"
            )
        seen_short = seen_short or ttl == "5m"
        if units[n].empty:
            return points, f"{units[n].path}: cache_control cannot be set for empty text blocks"
    return points, None


@dataclass
class _Entry:
    tokens: int
    ttl: float
    expires: float


class PromptCache:
    """The prompt cache of one server: prefixes, by a hash of the model and everything up
    to and including a breakpoint (tools, system, messages; ``cache_control`` left out).

    A request reads the longest prefix stored by an earlier one that ends at one of its
    breakpoints or at one of the ``CACHE_LOOKBACK`` positions just before it, and stores
    the prefix at each of its breakpoints that is at least the model's
    ``min_cache_tokens`` long. An entry lives for its TTL (5 minutes
    unless ``ttl: "1h"``) after it was last written or read.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries: dict[str, _Entry] = {}
        self.clock = clock
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def use(self, model: ModelSpec, body: Json) -> tuple[int, int, int]:
        """(cache read tokens, 5-minute writes, 1-hour writes) for ``body``.

        Billed as Anthropic's prompt-caching page says of mixed TTLs: A is the prefix of
        the longest hit, B the prefix at the last 1-hour breakpoint after A (else A), C
        the prefix at the last breakpoint; A is read, B - A written at the 1-hour rate
        and C - B at the 5-minute rate (the request's order puts every 1-hour breakpoint
        before any 5-minute one)."""
        units = _units(body)
        points, why = _breakpoints(body, units)
        if why is not None or not points:
            return 0, 0, 0
        digest = hashlib.sha256(model.id.encode()).digest()
        hashes: list[str] = []
        prefix: list[int] = []
        total = 0
        for u in units:
            digest = hashlib.sha256(digest + u.key.encode()).digest()
            hashes.append(digest.hex())
            total += u.tokens
            prefix.append(total)
        now = self.clock()
        with self.lock:
            self.entries = {h: e for h, e in self.entries.items() if e.expires > now}
            hit = -1
            for b in points:
                for n in range(b, max(-1, b - CACHE_LOOKBACK - 1), -1):
                    if hashes[n] in self.entries:
                        hit = max(hit, n)
                        break
            if hit >= 0:
                entry = self.entries[hashes[hit]]
                entry.expires = now + entry.ttl
            read = prefix[hit] if hit >= 0 else 0
            for b in points:
                ttl = CACHE_TTL[_ttl(units[b].cache)]
                if prefix[b] >= model.min_cache_tokens:
                    old = self.entries.get(hashes[b])
                    ttl = max(ttl, old.ttl if old else 0.0)  # a 1h entry stays 1h
                    self.entries[hashes[b]] = _Entry(prefix[b], ttl, now + ttl)
        last = points[-1]
        if prefix[last] < model.min_cache_tokens or hit >= last:
            return read, 0, 0
        long = [b for b in points if b > hit and _ttl(units[b].cache) == "1h"]
        upto_1h = prefix[long[-1]] if long else read
        return read, prefix[last] - upto_1h, upto_1h - read


def _ttl(cache: object) -> str:
    """A breakpoint's TTL: ``5m`` unless it asks for ``1h`` (``_breakpoints`` refuses
    any other value before the cache is used)."""
    return str(cache.get("ttl", "5m")) if isinstance(cache, dict) else "5m"
