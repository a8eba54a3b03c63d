"""Installation tokens shared by every process of the App through Redis, encrypted.

A work horse runs one job, and each minted its own installation token: a request to
GitHub per job, and (GitHub's ETags being per token) every conditional read of a job
was a whole read again. Kept in Redis until five minutes before it expires, a token is
minted once per installation and hour.

Redis is trusted with the loops, never with a credential: it holds no secret today
(jobs are JSON, docs/security.md). So a token is stored encrypted (Fernet: AES-128-CBC
and HMAC-SHA256) under a key derived from the App's private key, which Redis never
sees: someone who reads Redis gets ciphertext; one who writes it can only make a
worker mint a new token (what fails to decrypt, or says another installation, is
ignored).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken
from redis import Redis
from redis.exceptions import RedisError

from bot.io.logs import get_logger

log = get_logger("loopbot.github")

PREFIX = "loopbot:installation-token"


@dataclass(frozen=True)
class Held:
    token: str
    expires: float  # epoch seconds
    permissions: dict[str, str]


class SharedTokens:
    """Tokens by installation in Redis, encrypted; Redis failing is a token minted."""

    def __init__(self, redis: Redis, app_id: int | str, private_key_pem: str) -> None:
        self.redis = redis
        self.app_id = str(app_id)
        secret = hashlib.sha256(
            b"loopbot installation-token cache\0" + private_key_pem.encode()
        ).digest()
        self._fernet = Fernet(base64.urlsafe_b64encode(secret))

    def _key(self, installation_id: int) -> str:
        return f"{PREFIX}:{self.app_id}:{installation_id}"

    def get(self, installation_id: int) -> Held | None:
        try:
            raw = self.redis.get(self._key(installation_id))
        except RedisError as exc:
            log.warning("github.token_cache_failed", error=str(exc)[:200])
            return None
        if raw is None:
            return None
        try:
            data = json.loads(self._fernet.decrypt(raw))
            if data.get("installation") != installation_id:
                return None  # a value moved from another installation's key
            return Held(str(data["token"]), float(data["expires"]), dict(data["permissions"]))
        except (InvalidToken, ValueError, KeyError, TypeError):
            return None  # another key (a rotated private key), or not ours: mint anew

    def put(self, installation_id: int, held: Held, *, ttl: float) -> None:
        if ttl < 1:
            return
        value = self._fernet.encrypt(
            json.dumps(
                {
                    "installation": installation_id,
                    "token": held.token,
                    "expires": held.expires,
                    "permissions": held.permissions,
                }
            ).encode()
        )
        try:
            self.redis.set(self._key(installation_id), value, ex=int(ttl))
        except RedisError as exc:
            log.warning("github.token_cache_failed", error=str(exc)[:200])
