"""Installation tokens shared by an installation's jobs through Redis, encrypted
(``bot.io.github.tokens``): minted once per installation and hour, never readable by
someone who only reads Redis, never taken from a value someone planted there."""

from __future__ import annotations

import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr
from redis import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from structlog.testing import capture_logs

from bot.core.settings import Settings
from bot.io.github.client import GitHubApp
from bot.io.github.tokens import PREFIX, Held, SharedTokens
from bot.standins.github import GitHubServer

REPO = "acme/widgets"


def mints(github: GitHubServer) -> int:
    return sum(1 for m, p, _ in github.requests if m == "POST" and p.endswith("/access_tokens"))


def app(settings: Settings, redis: Redis | None) -> GitHubApp:
    return GitHubApp(settings, sleep=lambda _: None, redis=redis)


def test_one_token_per_installation_for_every_job_and_only_ciphertext_in_redis(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    first = app(settings, redis).installation(iid)
    token = first.token()
    for _ in range(3):  # three more jobs, each a fresh process's app
        assert app(settings, redis).installation(iid).token() == token
    assert mints(github) == 1
    keys = list(redis.scan_iter(f"{PREFIX}:*"))
    assert len(keys) == 1
    raw = redis.get(keys[0])
    assert raw is not None and token.encode() not in raw
    # Kept no longer than the token lives, less the margin a process keeps it for.
    ttl = redis.ttl(keys[0])
    assert 0 < ttl <= 3600 - 300


def test_without_redis_each_process_mints_its_own(github: GitHubServer, settings: Settings) -> None:
    iid = github.add_installation("acme")
    app(settings, None).installation(iid).token()
    app(settings, None).installation(iid).token()
    assert mints(github) == 2


def test_another_private_key_cannot_read_it_and_mints_anew(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    iid = github.add_installation("acme")
    app(settings, redis).installation(iid).token()
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = other_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    assert SharedTokens(redis, settings.github_app_id, pem).get(iid) is None
    rotated = settings.model_copy(update={"github_private_key": SecretStr(pem)})
    assert SharedTokens(redis, rotated.github_app_id, rotated.private_key_pem()).get(iid) is None


def test_a_value_planted_or_moved_in_redis_is_never_used(settings: Settings, redis: Redis) -> None:
    shared = SharedTokens(redis, settings.github_app_id, settings.private_key_pem())
    shared.put(1, Held("ghs_one", time.time() + 3600, {}), ttl=600)
    # Someone who can write Redis copies installation 1's value to installation 2's key.
    redis.set(
        f"{PREFIX}:{settings.github_app_id}:2",
        redis.get(f"{PREFIX}:{settings.github_app_id}:1") or b"",
    )
    assert shared.get(2) is None
    redis.set(f"{PREFIX}:{settings.github_app_id}:3", b"ghs_planted")
    assert shared.get(3) is None
    held = shared.get(1)
    assert held is not None and held.token == "ghs_one"


def test_redis_down_mints_as_before(github: GitHubServer, settings: Settings, redis: Redis) -> None:
    """The tokens' Redis refusing every connection: the App mints its token from GitHub,
    as without Redis, and keeps it in the process; the failure is logged, not raised."""
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    dead = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0))
    made = app(settings, redis)
    made._shared_tokens = SharedTokens(dead, settings.github_app_id, settings.private_key_pem())
    with capture_logs() as logs:
        token = made.installation_token(iid)
        assert made.installation_token(iid) == token  # the process's copy
    assert token.startswith("ghs_") and mints(github) == 1
    assert [e["event"] for e in logs].count("github.token_cache_failed") == 2  # get, put
    assert made.installation(iid).repo(REPO).full_name == REPO  # and it works
