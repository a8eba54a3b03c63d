"""What a worker process builds once at start-up and every job uses.

``loopbot worker`` builds a ``Runtime`` from the validated settings and installs it
before the first job; forked work horses inherit it. Nothing is read at import time.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import ParamSpec, TypeVar

import anthropic
import structlog
from redis import Redis
from rq import get_current_job

from bot.core import repo_config
from bot.core.ids import LoopId
from bot.core.repo_config import Ceilings, RepoConfig
from bot.core.settings import Settings
from bot.io.github import tally
from bot.io.github.client import GitHubApp, Installation
from bot.io.github.pace import waited_here
from bot.io.metrics import observe_job, observe_pace
from bot.io.store import Store
from jobs.drain import sigterm_drains
from jobs.gateway.responses import OpenAIUpstream
from jobs.models import ModelCatalog
from jobs.status_comment import publishing


@dataclass
class Runtime:
    settings: Settings
    redis: Redis
    github: GitHubApp = field(init=False)

    def __post_init__(self) -> None:
        self.github = GitHubApp(self.settings, redis=self.redis)

    @property
    def store(self) -> Store:
        return Store(self.redis)

    @cached_property
    def model(self) -> anthropic.Anthropic:
        key = self.settings.anthropic_api_key
        base = self.settings.anthropic_base_url
        return anthropic.Anthropic(
            api_key=key.get_secret_value() if key else None,
            base_url=str(base).rstrip("/") if base else None,
            max_retries=self.settings.model_retries,  # the SDK retries 429, 529, 5xx
            timeout=600,
        )

    @cached_property
    def openai(self) -> OpenAIUpstream:
        """The codex backend's model API, as the gateway's OpenAI side reaches it."""
        return OpenAIUpstream(self.settings)

    @cached_property
    def models(self) -> ModelCatalog:
        """Each model's window, output limit, thinking and effort, from the Models API."""
        return ModelCatalog(self.model, self.settings)

    @property
    def ceilings(self) -> Ceilings:
        """The operator's limits, which every repository's ``loop.yml`` is clamped to."""
        return Ceilings.of(self.settings)

    def config(self, gh: Installation, repo: str) -> RepoConfig:
        """``repo``'s ``.github/loop.yml`` from its default branch, parsed and clamped.

        Read afresh on every call: a maintainer's edit applies to the next job.
        ``repo_config.ConfigError`` lists what is wrong with it.
        """
        return self.parse_config(gh.file(repo, repo_config.CONFIG_PATH))

    def parse_config(self, text: str | None) -> RepoConfig:
        """``config`` for a ``loop.yml`` text already read (None: there is none)."""
        return repo_config.parse(text, self.ceilings)


_current: Runtime | None = None
P = ParamSpec("P")
R = TypeVar("R")


def install(runtime: Runtime) -> Runtime:
    global _current
    _current = runtime
    return runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError("no loopbot runtime installed; start jobs with `loopbot worker`")
    return _current


def instrumented(kind: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap an RQ entry point: bind job, repo and issue to every log line, time the job."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            job = get_current_job()
            context: dict[str, object] = {"job": job.id if job else None, "job_kind": kind}
            loop = None
            if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], int):
                context |= {"repo": args[0], "issue": args[1]}
                with contextlib.suppress(ValueError):  # never fails the job it measures
                    loop = LoopId(args[0], args[1]).key
            started = time.monotonic()
            paced = waited_here()
            with (
                structlog.contextvars.bound_contextvars(**context),
                sigterm_drains(),
                tally.running(kind),
                publishing(),
            ):
                try:
                    return fn(*args, **kwargs)
                finally:
                    with contextlib.suppress(Exception):  # metrics never fail a job
                        redis = current().redis
                        observe_job(redis, kind, time.monotonic() - started)
                        observe_pace(redis, kind, loop, waited_here() - paced)

        return run

    return wrap
