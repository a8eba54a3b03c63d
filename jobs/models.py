"""The Models API, asked once an hour per model: its window, output limit, thinking and
effort (``bot.core.models.ModelSpec``).

``GET /v1/models/{id}`` through the anthropic SDK. A 404 means the model does not exist
for this key (``UnknownModel``): a setting to fix, not a reason to guess. Any other
failure (the API down, a timeout) gives a fallback spec from the operator's settings
(``LOOPBOT_CONTEXT_WINDOW``, ``LOOPBOT_MAX_OUTPUT``, no thinking, no effort): a loop runs
on with requests every model accepts, and the API is asked again a minute later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import anthropic

from bot.core.models import ModelSpec, fallback_spec, spec_from_info
from bot.io.logs import get_logger

log = get_logger("loopbot.models")

TTL = 3600.0  # seconds a spec the API gave is kept
FALLBACK_TTL = 60.0  # seconds a fallback guess is kept before the API is asked again
TIMEOUT = 15.0  # seconds for one Models API call (the client's own is 10 minutes)


class Fallback(Protocol):
    """What a fallback spec is made of: ``Settings`` has both."""

    @property
    def context_window(self) -> int: ...

    @property
    def max_output(self) -> int: ...


class UnknownModel(Exception):
    """The Models API does not know the model (404): it cannot be used with this key."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"unknown model: {model}")


class ModelCatalog:
    """Model specs by id, cached per process for ``ttl`` seconds; safe across threads."""

    def __init__(
        self,
        client: anthropic.Anthropic,
        fallback: Fallback,
        ttl: float = TTL,
        *,
        fallback_ttl: float = FALLBACK_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client.with_options(timeout=TIMEOUT, max_retries=1)
        self.fallback = fallback
        self.ttl = ttl
        self.fallback_ttl = fallback_ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._specs: dict[str, tuple[float, ModelSpec]] = {}  # id -> (expires, spec)

    def spec(self, model: str) -> ModelSpec:
        """``model``'s spec: cached, or from the API; ``UnknownModel`` on a 404."""
        now = self.clock()
        with self._lock:
            cached = self._specs.get(model)
        if cached is not None and cached[0] > now:
            return cached[1]
        # Asked outside the lock: one slow answer never holds up another model's spec.
        try:
            info = self.client.models.retrieve(model)
        except anthropic.NotFoundError:
            raise UnknownModel(model) from None
        except anthropic.APIError as exc:
            log.warning(
                "models.fallback",
                model=model,
                error=f"{type(exc).__name__}: {exc}"[:300],
                window=self.fallback.context_window,
                max_output=self.fallback.max_output,
            )
            guess = fallback_spec(model, self.fallback.context_window, self.fallback.max_output)
            self._keep(model, guess, now + self.fallback_ttl)
            return guess
        spec = spec_from_info(
            info.model_dump(),
            window=self.fallback.context_window,
            max_output=self.fallback.max_output,
        )
        self._keep(model, spec, now + self.ttl)
        return spec

    def _keep(self, model: str, spec: ModelSpec, expires: float) -> None:
        with self._lock:
            self._specs[model] = (expires, spec)

    def active(self) -> list[str]:
        """Every model the API lists as active for this key, newest first, as it lists
        them. API errors propagate: the caller is saying which models to choose from."""
        return [m.id for m in self.client.models.list(limit=100) if m.lifecycle == "active"]
