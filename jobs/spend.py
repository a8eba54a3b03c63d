"""The spend caps before each model call, in the worker (``bot/core/spend/caps.py``).

One ``SpendGate`` per job that calls the model for a loop (the loop job, the critic): the
built-in agent, the model gateway (a CLI backend's calls) and ``jobs.precall`` (loopbot's
own calls) ask ``admit`` with the call's worst case right after the issue's own budget
said yes, and ``charge`` with what the call was billed. ``admit`` reserves the worst case
on the four counters at once (``bot.io.spend``), or raises ``OverCap``, a kind of
``precall.OverBudget``: every caller already ends the loop ``budget_exhausted`` with the
message, which names the cap.

A gate's calls are made one at a time (the agent's loop, the critic's, the gateway's one
call at a time), so it keeps one reservation: the next ``admit`` gives back one that no
``charge`` settled (the API refused the call: not billed), and ``release`` gives it back
when the job is done with the gate.

The bound: the counted spend never passes a cap, and what the API billed never passes
the counted spend (a call is never billed more than its worst case), so however many
workers charge a repository at once, none overshoots a cap at all. A call made without
the gate (none in loopbot) would be counted after it, and could overshoot by its cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis import Redis

from bot.core.record import LoopRecord, Usage
from bot.core.repo_config import RepoConfig
from bot.core.rules.loop.budget import Call
from bot.core.settings import Settings
from bot.core.spend.caps import MICRO, Cap, caps_for, counter, full
from bot.io.logs import get_logger
from bot.io.spend import SpendMeter
from jobs.precall import OverBudget

log = get_logger("loopbot.spend")


class OverCap(OverBudget):
    """The call was not made: it could cross a spend cap (the message names it)."""

    prefix = ""

    def __init__(self, cap: Cap, words: str) -> None:
        super().__init__(words)
        self.cap = cap


def meter(redis: Redis, settings: Settings) -> SpendMeter:
    # Counters outlive their period by the retention setting, for the report's chart.
    return SpendMeter(redis, settings.retention_days * 86_400)


@dataclass
class _Held:
    counters: tuple[str, ...]
    micro: int


class SpendGate:
    def __init__(
        self,
        spend: SpendMeter,
        caps: tuple[Cap, ...],
        *,
        repo: str,
        installation_id: int,
        backend: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.meter, self.caps = spend, caps
        self.repo, self.installation_id, self.backend = repo, installation_id, backend
        self.clock = clock
        self._held: _Held | None = None
        self._lock = threading.Lock()
        self.admitted = 0  # calls admitted through this gate
        self.refused = ""  # the last refusal's words
        self.refused_usd = 0.0  # and the worst case it refused

    @classmethod
    def of(
        cls,
        redis: Redis,
        settings: Settings,
        record: LoopRecord,
        config: RepoConfig | None,
        backend: str = "builtin",
        clock: Callable[[], float] = time.time,
    ) -> SpendGate:
        """The gate of ``record``'s loop: the operator's caps, lowered by ``config``'s."""
        return cls.of_repo(
            redis, settings, record.repo, record.installation_id, config, backend, clock
        )

    @classmethod
    def of_repo(
        cls,
        redis: Redis,
        settings: Settings,
        repo: str,
        installation_id: int,
        config: RepoConfig | None,
        backend: str = "builtin",
        clock: Callable[[], float] = time.time,
    ) -> SpendGate:
        """The gate of a call for ``repo`` with no loop behind it (``/loop-plan``)."""
        spend = config.spend if config is not None else None
        caps = caps_for(
            settings.spend_caps(),
            spend.day_usd if spend is not None else None,
            spend.month_usd if spend is not None else None,
        )
        return cls(
            meter(redis, settings),
            caps,
            repo=repo,
            installation_id=installation_id,
            backend=backend,
            clock=clock,
        )

    def _counters(self, now: float) -> tuple[str, ...]:
        return tuple(counter(c, self.repo, self.installation_id, now) for c in self.caps)

    def room(self, worst: Call) -> str:
        """The empty string when a call whose worst case is ``worst`` would be admitted
        now, else the full cap's words (reserves nothing): whether a loop may start. A
        refusal is remembered as an admission's is (``refused``, ``refused_usd``)."""
        now = self.clock()
        need = round(worst.usd * MICRO)
        for cap, name in zip(self.caps, self._counters(now), strict=True):
            spent = self.meter.spent(name)
            if spent + need > cap.micro:
                self.refused, self.refused_usd = full(cap, spent, need, now), worst.usd
                return self.refused
        return ""

    def admit(self, worst: Call) -> None:
        """Reserve ``worst`` under every cap, or raise ``OverCap`` and reserve nothing."""
        with self._lock:
            self._give_back()
            now = self.clock()
            counters = self._counters(now)
            need = round(worst.usd * MICRO)
            out = self.meter.reserve(counters, [c.micro for c in self.caps], need)
            if out is not None:
                cap = self.caps[out.index]
                words = full(cap, out.spent, need, now)
                log.info("spend.refused", repo=self.repo, cap=cap.source, need=need)
                self.refused, self.refused_usd = words, worst.usd
                raise OverCap(cap, words)
            self._held = _Held(counters, need)
            self.admitted += 1

    def held_back(self) -> str:
        """A cap's words when it refused this gate's first call (the job spent nothing:
        its loop waits rather than ends), else ""."""
        return self.refused if self.admitted == 0 else ""

    def charge(self, model: str, used: Usage) -> None:
        """What the last admitted call was billed: its reservation becomes that."""
        billed = round(used.cost_usd * MICRO)
        with self._lock:
            held, self._held = self._held, None
            if held is not None:
                self.meter.settle(held.counters, held.micro, billed)
            else:
                self.meter.add(self._counters(self.clock()), billed)
        self.meter.count(self.repo, self.backend, model, used)

    def release(self) -> None:
        """Give back a reservation no charge settled: its call was not billed."""
        with self._lock:
            self._give_back()

    def _give_back(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self.meter.settle(held.counters, held.micro, 0)
