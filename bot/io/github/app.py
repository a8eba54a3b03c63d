"""The App itself: its JWT-authenticated client, the installation tokens it mints and
caches, and the App-level reads (``GET /app``, its installations, its webhook's config
and deliveries); and the manifest conversion that registers an App. Apart from what an
installation does; ``bot.io.github.client.GitHubApp`` is this with ``installation()``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from githubkit import AppAuthStrategy, GitHub
from githubkit.cache import MemCacheStrategy
from githubkit.exception import GitHubException, RequestFailed
from httpx import TransportError
from redis import Redis

from bot.core.settings import Settings
from bot.core.text.redact import Redactor, settings_secrets
from bot.io.github import tokens
from bot.io.github.calls import _pages, _with_retries
from bot.io.github.failures import GitHubError, message_of
from bot.io.preload import tls

TOKEN_MARGIN_SECONDS = 300


def convert_manifest_code(api_url: str, code: str, timeout: float = 30.0) -> dict[str, Any]:
    """``POST /app-manifests/{code}/conversions``: the App that GitHub registered from a
    manifest, with its private key and webhook secret. Needs no credentials (the code is
    one; GitHub accepts it once, within an hour). Not retried: a second try of a code the
    first one used up would only hide the first answer."""
    with GitHub(
        base_url=api_url.rstrip("/") + "/",
        timeout=timeout,
        auto_retry=False,
        http_cache=False,
        user_agent="loopbot",
    ) as gh:
        try:
            return cast(dict[str, Any], gh.rest.apps.create_from_manifest(code).json())
        except RequestFailed as exc:
            status = exc.response.status_code
            raise GitHubError(f"GitHub answered {status}: {message_of(exc)}", status) from None
        except (GitHubException, TransportError) as exc:
            raise GitHubError(f"no answer from GitHub: {exc}") from None


class AppIdentity:
    """The App identity: a JWT-authenticated client and the installation token cache."""

    def __init__(
        self,
        settings: Settings,
        sleep: Callable[[float], None] = time.sleep,
        redis: Redis | None = None,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        # With Redis: one pace per installation, shared by every worker (pace.py).
        self.redis = redis
        self._lock = threading.Lock()
        self._tokens: dict[int, tuple[str, float]] = {}
        self._permissions: dict[int, dict[str, str]] = {}  # what each token was granted
        self._redactor: Redactor | None = None
        self._shared_tokens: tokens.SharedTokens | None = None
        self._slug: str | None = None
        self.client = GitHub(
            AppAuthStrategy(settings.github_app_id, settings.private_key_pem()),
            base_url=settings.api_url + "/",
            timeout=settings.github_timeout,
            auto_retry=False,  # retries are decided in bot.io.github.failures, once for all calls
            http_cache=False,
            user_agent="loopbot",
            ssl_verify=tls(),  # one TLS context per process, not one per client
            # githubkit's default cache is one per process, keyed by App id only: a JWT
            # signed with a rotated (or another test's) key would be reused. Own cache.
            cache_strategy=MemCacheStrategy(),
        )

    def installation_token(self, installation_id: int, *, refresh: bool = False) -> str:
        """A token for ``installation_id``; reused until five minutes before it expires,
        by this process and, with Redis, by every job of the installation
        (``bot.io.github.tokens``: a work horse runs one job, and GitHub's ETags are per
        token, so a token per job made every job's reads whole again)."""
        with self._lock:
            cached = self._tokens.get(installation_id)
            if cached and not refresh and cached[1] - time.time() > TOKEN_MARGIN_SECONDS:
                return cached[0]
        shared = self._shared()
        held = None if refresh or shared is None else shared.get(installation_id)
        if held is not None and held.expires - time.time() > TOKEN_MARGIN_SECONDS:
            data: dict[str, Any] = {"token": held.token, "permissions": held.permissions}
            expires_at = held.expires
        else:
            data = _with_retries(
                lambda: self.client.rest.apps.create_installation_access_token(
                    installation_id
                ).json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            )
            expires_at = (
                datetime.strptime(data["expires_at"], "%Y-%m-%dT%H:%M:%SZ")
                .replace(tzinfo=UTC)
                .timestamp()
            )
            if shared is not None:
                shared.put(
                    installation_id,
                    tokens.Held(
                        str(data["token"]), expires_at, dict(data.get("permissions") or {})
                    ),
                    ttl=expires_at - time.time() - TOKEN_MARGIN_SECONDS,
                )
        with self._lock:
            self._tokens[installation_id] = (data["token"], expires_at)
            self._permissions[installation_id] = dict(data.get("permissions") or {})
        return str(data["token"])

    def _shared(self) -> tokens.SharedTokens | None:
        """The installation tokens kept in Redis, encrypted with a key only the App's
        private key gives (None without Redis)."""
        if self.redis is None:
            return None
        if self._shared_tokens is None:
            self._shared_tokens = tokens.SharedTokens(
                self.redis, self.settings.github_app_id, self.settings.private_key_pem()
            )
        return self._shared_tokens

    def installation_permissions(self, installation_id: int) -> dict[str, str]:
        """What the installation's token may do (``permissions`` of the token's answer:
        what its owner granted), e.g. whether ``workflows`` is ``write``."""
        self.installation_token(installation_id)
        with self._lock:
            return dict(self._permissions.get(installation_id, {}))

    def redactor(self) -> Redactor:
        """Every secret value of the settings (built once: it reads the private key)."""
        if self._redactor is None:
            self._redactor = Redactor(settings_secrets(self.settings))
        return self._redactor

    def slug(self) -> str:
        """The App's slug (its bot is ``SLUG[bot]``), asked once."""
        if self._slug is None:
            self._slug = str(self.app_info().get("slug") or "")
        return self._slug

    def app_info(self) -> dict[str, Any]:
        """``GET /app``: the App's own record (used by ``loopbot doctor``)."""
        return cast(
            dict[str, Any],
            _with_retries(
                lambda: self.client.rest.apps.get_authenticated().json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            ),
        )

    def installations(self) -> list[dict[str, Any]]:
        """``GET /app/installations``: each with its account and what its owner granted."""

        def page(n: int) -> Any:
            return self.client.rest.apps.list_installations(per_page=100, page=n).json()

        return list(_pages(page, self.settings.github_max_retry_wait))

    def installation_ids(self) -> list[int]:
        return [inst["id"] for inst in self.installations()]

    def hook_config(self) -> dict[str, Any]:
        """``GET /app/hook/config``: the App's webhook URL and content type (the secret
        is never shown back)."""
        return cast(
            dict[str, Any],
            _with_retries(
                lambda: self.client.rest.apps.get_webhook_config_for_app().json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            ),
        )

    def recent_deliveries(self, count: int = 100) -> list[dict[str, Any]]:
        """``GET /app/hook/deliveries``: the newest ``count`` (at most 100) deliveries of
        the App's webhook, newest first, with GitHub's status for each."""
        return cast(
            list[dict[str, Any]],
            _with_retries(
                lambda: self.client.rest.apps.list_webhook_deliveries(per_page=count).json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            ),
        )
