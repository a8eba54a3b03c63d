"""An installation's plumbing (``InstallationBase``), which every part of
``bot.io.github.client.Installation`` stands on: its token and the clients kept for it,
the redaction and defusing of every text it writes, and the one way each call is made
(``_call``: retries through ``failures.classify``; ``_create``: a POST done once;
``_list``: every page). Also the hidden marker that tags what loopbot wrote, and the
models' base (only the fields loopbot reads)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import httpx
from githubkit import GitHub, TokenAuthStrategy
from pydantic import BaseModel, ConfigDict

from bot.core.text.defuse import one_line, safe_text
from bot.core.text.redact import Redactor
from bot.io.github.app import AppIdentity
from bot.io.github.calls import _pages, _with_retries
from bot.io.github.conditional import Bodies, ConditionalTransport, RedisBodies, Store
from bot.io.github.pace import SharedPace
from bot.io.preload import tls

T = TypeVar("T")


def marker(key: str) -> str:
    """A hidden tag that lets loopbot find what it wrote before."""
    return f"<!-- loopbot:{key} -->"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def _split(repo: str) -> tuple[str, str]:
    owner, _, name = repo.partition("/")
    return owner, name


class InstallationBase:
    """GitHub as one installation of the App sees it: what every part of it shares."""

    def __init__(self, app: AppIdentity, installation_id: int) -> None:
        self.app = app
        self.installation_id = installation_id
        s = app.settings
        self.pace = (
            SharedPace(
                app.redis,
                installation_id,
                gap=s.github_write_gap,
                max_wait=s.github_max_retry_wait,
                queue_wait=s.github_max_queue_wait,
                concurrent=s.github_max_concurrent,
                # Longer than a request may take (its timeout, for the headers and again
                # for the body), so only a request that never ended lapses.
                token_ttl=2 * s.github_timeout + 5,
                sleep=app._sleep,
            )
            if app.redis is not None
            else None
        )
        self._clients: dict[int, tuple[str, GitHub[Any]]] = {}
        # The installation's bodies for conditional reads, shared by its threads' clients
        # and, in the Redis the pace uses, by every job of the installation.
        self.bodies: Store = (
            RedisBodies(app.redis, installation_id) if app.redis is not None else Bodies()
        )
        self._redactor: tuple[str, Redactor] | None = None  # (token, redactor knowing it)

    # -- plumbing -------------------------------------------------------------------

    def token(self) -> str:
        return self.app.installation_token(self.installation_id)

    def permissions(self) -> dict[str, str]:
        """The installation token's permissions, as GitHub answered with it."""
        return self.app.installation_permissions(self.installation_id)

    def _gh(self) -> GitHub[Any]:
        """A githubkit client for the current token, kept open for connection reuse.

        githubkit opens (and closes) a new HTTP client per request unless it is used as
        a context manager; that costs ~25 ms a call. The open client lives in a
        ContextVar, i.e. per thread, so clients are kept per thread.
        """
        token = self.token()
        key = threading.get_ident()
        held = self._clients.get(key)
        if held is not None and held[0] == token:
            return held[1]
        if held is not None:
            with contextlib.suppress(Exception):
                held[1].__exit__(None, None, None)
        s = self.app.settings
        client: GitHub[Any] = GitHub(
            TokenAuthStrategy(token),
            base_url=s.api_url + "/",
            timeout=s.github_timeout,
            auto_retry=False,
            # Not githubkit's cache (hishel): loopbot's conditional reads, which always
            # ask GitHub (bot/io/github/conditional.py). A proxy from the environment
            # would take httpx's own transport, without them.
            http_cache=False,
            transport=ConditionalTransport(httpx.HTTPTransport(verify=tls()), self.bodies),
            user_agent="loopbot",
            ssl_verify=tls(),
            # Every request of the installation, retries included, keeps its shared pace.
            event_hooks=self.pace.hooks() if self.pace is not None else None,
        )
        client.__enter__()  # type: ignore[no-untyped-call]
        self._clients[key] = (token, client)
        return client

    def _reauth(self) -> None:
        self.app.installation_token(self.installation_id, refresh=True)

    def redact(self, text: str) -> str:
        """``text`` without the secrets of the settings and this installation's token:
        what every write here sends, and what loopbot pushes by git (commit messages)."""
        token = self.token()
        held = self._redactor
        if held is None or held[0] != token:  # built once per token: it compiles a pattern
            held = self._redactor = (token, self.app.redactor().with_secrets(token))
        return held[1](text)

    def _text(self, text: str) -> str:
        """``text`` as loopbot may post it: secrets redacted first (an exact secret with an
        ``@`` or a ``#`` in it would no longer match once defused), then defused."""
        return safe_text(self.redact(text))

    def _title(self, text: str) -> str:
        """A title: ``_text`` on one line."""
        return one_line(self.redact(text))

    def _call(self, fn: Callable[[GitHub[Any]], Any]) -> Any:
        """Run a read or an idempotent write (GET, PUT, PATCH, DELETE) with retries."""
        return _with_retries(
            lambda: self._attempt(fn),
            self.app.settings.github_max_retry_wait,
            self.app._sleep,
            self._reauth,
        )

    def _attempt(self, fn: Callable[[GitHub[Any]], Any]) -> Any:
        """One try of ``fn``; its place among the requests in flight is given back
        however it ends (a timeout or a reset never reaches the response hook)."""
        try:
            return fn(self._gh())
        finally:
            if self.pace is not None:
                self.pace.give_back()

    def _create(self, create: Callable[[GitHub[Any]], T], find: Callable[[], T | None]) -> T:
        """A POST that must happen once: after a failed attempt, look before trying again.

        A 5xx or a timeout does not say whether GitHub applied the write, so before
        each retry ``find`` looks for what the earlier attempt may have created.
        """
        first = True

        def attempt(gh: GitHub[Any]) -> T:
            nonlocal first
            if not first and (existing := find()) is not None:
                return existing
            first = False
            return create(gh)

        return cast(T, self._call(attempt))

    def _list(self, fetch: Callable[[GitHub[Any], int], Any]) -> Iterator[dict[str, Any]]:
        wait = self.app.settings.github_max_retry_wait
        return _pages(lambda n: self._attempt(lambda gh: fetch(gh, n)), wait)
