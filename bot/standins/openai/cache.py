"""The prompt-cache simulation (``PromptCache``): which of a prompt's tokens are read
from the cache and which are written to it."""

from __future__ import annotations

import threading

MIN_CACHE_TOKENS = 1024  # the shortest prefix the prompt cache stores


class PromptCache:
    """The prompt cache of one server, one entry per model and ``prompt_cache_key`` (no
    key is a key of its own): the units (``_units``) of the last request answered.

    A request reads the longest prefix of units equal to the entry's, when it is at least
    ``MIN_CACHE_TOKENS`` long (``cached_tokens``); the rest of a prompt of at least
    ``MIN_CACHE_TOKENS`` is written (``cache_write_tokens``); a shorter prompt is neither
    read nor written. The request's units then replace the entry.
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str | None], list[tuple[str, int]]] = {}
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def use(self, model: str, key: str | None, units: list[tuple[str, int]]) -> tuple[int, int]:
        """(cached tokens, cache-write tokens) of a prompt of ``units``."""
        total = sum(t for _, t in units)
        with self.lock:
            before = self.entries.get((model, key), [])
            same = 0
            for (mine, tokens), (theirs, _) in zip(units, before, strict=False):
                if mine != theirs:
                    break
                same += tokens
            self.entries[(model, key)] = units
        if total < MIN_CACHE_TOKENS:
            return 0, 0
        cached = same if same >= MIN_CACHE_TOKENS else 0
        return cached, total - cached
