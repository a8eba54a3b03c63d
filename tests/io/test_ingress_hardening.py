"""The web app's edges under attack: dashboard sign-in and sessions, replayed and deeply
nested deliveries, and what /healthz says when Redis is down. Real app, real port, real
redis-server, real HTTP (httpx)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from redis import Redis
from werkzeug.serving import make_server

from bot.core import signature
from bot.core.settings import load_settings
from bot.io.queues import CONTROL_QUEUE, body_key
from bot.standins.redis_server import RedisServer
from bot.standins.serving import run_in_thread
from bot.web.app import create_app
from bot.web.dashboard import COOKIE, SESSION_PREFIX, session_key

TOKEN = "s3cret-token"
SECRET = "local-webhook-secret"  # the local GitHub server's default

Serve = Callable[..., str]


@pytest.fixture
def serve(env: dict[str, str], redis: Redis) -> Iterator[Serve]:
    """Start the app on a real port with extra environment; returns its base URL."""
    servers: list[Any] = []

    def start(redis_conn: Redis | None = None, **extra: str) -> str:
        s = load_settings({**env, **extra}, role="web")
        server = make_server("127.0.0.1", 0, create_app(s, redis_conn or redis), threaded=True)
        run_in_thread(server)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def http(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, follow_redirects=False, timeout=10)


def sessions(redis: Redis) -> list[bytes]:
    return list(redis.scan_iter(match=SESSION_PREFIX + "*"))


def cookie_header(resp: httpx.Response) -> str:
    values = resp.headers.get_list("set-cookie")
    assert len(values) == 1, values
    return values[0]


def cookie_attrs(header: str) -> set[str]:
    return {part.strip().split("=")[0].lower() for part in header.split(";")[1:]}


# --- dashboard --------------------------------------------------------------------------


def test_token_in_a_url_signs_nobody_in(serve: Serve, redis: Redis) -> None:
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN)
    with http(base) as c:
        for url in [f"/dashboard?token={TOKEN}", f"/dashboard/login?token={TOKEN}"]:
            resp = c.get(url)
            assert "set-cookie" not in resp.headers, url
            assert resp.status_code in (200, 401), url
            assert "method=post action=/dashboard/login" in resp.text
        assert c.get(f"/api/loops?token={TOKEN}").status_code == 401
        assert c.get("/dashboard").status_code == 401  # still not signed in
    assert sessions(redis) == []


def test_wrong_token_is_401_without_a_cookie(serve: Serve, redis: Redis) -> None:
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN)
    with http(base) as c:
        for wrong in ["nope", "", TOKEN + "x", TOKEN[:-1]]:
            resp = c.post("/dashboard/login", data={"token": wrong})
            assert resp.status_code == 401 and "set-cookie" not in resp.headers, wrong
        # The token itself as a cookie (what older versions stored) is no sign-in.
        c.cookies.set(COOKIE, TOKEN)
        assert c.get("/api/loops").status_code == 401
        c.cookies.set("loopbot_dashboard", TOKEN)
        assert c.get("/api/loops").status_code == 401
    assert sessions(redis) == []


def test_post_sign_in_gives_a_random_session_that_works_and_signs_out(
    serve: Serve, redis: Redis
) -> None:
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN)
    with http(base) as c:
        resp = c.post("/dashboard/login", data={"token": TOKEN})
        assert resp.status_code == 303 and resp.headers["location"] == "/dashboard"
        header = cookie_header(resp)
        sid = c.cookies[COOKIE]
        assert TOKEN not in header and sid != TOKEN and len(sid) >= 40
        attrs = cookie_attrs(header)
        assert {"httponly", "samesite", "max-age", "path"} <= attrs
        assert "samesite=strict" in header.lower().replace(" ", "")
        assert "secure" not in attrs  # plain http, no trusted proxy
        # Redis holds the session's hash, with an expiry; neither the id nor the token.
        [key] = sessions(redis)
        assert key.decode() == session_key(sid) and sid not in key.decode()
        assert 0 < int(redis.ttl(key)) <= 12 * 3600
        assert all(TOKEN.encode() not in (redis.get(k) or b"") for k in redis.keys("*"))
        assert c.get("/api/loops").status_code == 200
        assert c.get("/dashboard").status_code == 200
        # A second sign-in is another random session.
        other = http(base)
        other.post("/dashboard/login", data={"token": TOKEN})
        assert other.cookies[COOKIE] != sid and len(sessions(redis)) == 2
        other.close()
        # Sign-out deletes this session in Redis and in the browser.
        out = c.post("/dashboard/logout")
        assert out.status_code == 303
        assert "max-age=0" in cookie_header(out).lower().replace(" ", "")
        assert not redis.exists(session_key(sid)) and len(sessions(redis)) == 1
        assert c.get("/api/loops").status_code == 401
        # Even a browser that kept the cookie is out.
        c.cookies.set(COOKIE, sid)
        assert c.get("/api/loops").status_code == 401


def test_session_expires(serve: Serve, redis: Redis) -> None:
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN, LOOPBOT_DASHBOARD_SESSION_TTL="1")
    with http(base) as c:
        resp = c.post("/dashboard/login", data={"token": TOKEN})
        assert "max-age=1" in cookie_header(resp).lower().replace(" ", "")
        sid = c.cookies[COOKIE]
        assert c.get("/api/loops").status_code == 200
        time.sleep(1.6)
        c.cookies.set(COOKIE, sid)  # a client that ignores Max-Age
        assert c.get("/api/loops").status_code == 401
    assert sessions(redis) == []


def test_bearer_token_still_works_for_scripts(serve: Serve) -> None:
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN)
    with http(base) as c:
        assert c.get("/api/loops", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.get("/api/loops", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_secure_cookie_only_from_a_trusted_proxy(serve: Serve) -> None:
    https = {"X-Forwarded-Proto": "https"}
    untrusting = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN)
    with http(untrusting) as c:
        resp = c.post("/dashboard/login", data={"token": TOKEN}, headers=https)
        assert "secure" not in cookie_attrs(cookie_header(resp))  # anyone can send the header
    # With two proxies, the outer one (TLS) appended "https", the inner one "http".
    for trusted, proto in [("true", "https"), ("1", "https"), ("2", "https, http")]:
        base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN, LOOPBOT_TRUSTED_PROXY=trusted)
        with http(base) as c:
            headers = {"X-Forwarded-Proto": proto}
            resp = c.post("/dashboard/login", data={"token": TOKEN}, headers=headers)
            assert resp.status_code == 303
            attrs = cookie_attrs(cookie_header(resp))
            assert {"secure", "httponly", "samesite"} <= attrs, trusted
            plain = c.post("/dashboard/login", data={"token": TOKEN})
            assert "secure" not in cookie_attrs(cookie_header(plain)), trusted
    # Two trusted proxies: a client's own "https" in front of an inner http hop is not it.
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN, LOOPBOT_TRUSTED_PROXY="2")
    with http(base) as c:
        forged = {"X-Forwarded-Proto": "https, http, http"}
        resp = c.post("/dashboard/login", data={"token": TOKEN}, headers=forged)
        assert "secure" not in cookie_attrs(cookie_header(resp))
    base = serve(LOOPBOT_DASHBOARD_TOKEN=TOKEN, LOOPBOT_TRUSTED_PROXY="false")
    with http(base) as c:
        resp = c.post("/dashboard/login", data={"token": TOKEN}, headers=https)
        assert "secure" not in cookie_attrs(cookie_header(resp))


# --- webhook ----------------------------------------------------------------------------


def labeled() -> dict[str, Any]:
    return {
        "action": "labeled",
        "issue": {"number": 1},
        "label": {"name": "loop:ready"},
        "sender": {"login": "alice", "type": "User"},
        "installation": {"id": 5},
        "repository": {"full_name": "acme/widgets"},
    }


def deliver(c: httpx.Client, body: bytes, delivery: str, event: str = "issues") -> httpx.Response:
    return c.post(
        "/webhook",
        content=body,
        headers={
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signature.sign(SECRET, body),
            "Content-Type": "application/json",
        },
    )


def queued(redis: Redis) -> int:
    return int(redis.llen(f"rq:queue:{CONTROL_QUEUE}"))


def test_same_body_under_a_new_delivery_id_is_dropped(serve: Serve, redis: Redis) -> None:
    base = serve()
    body = json.dumps(labeled()).encode()
    with http(base) as c:
        first = deliver(c, body, "d-original")
        assert first.status_code == 202 and first.json()["status"] == "queued"
        for n in range(5):
            replay = deliver(c, body, f"d-replay-{n}")
            assert replay.status_code == 202 and replay.json()["status"] == "duplicate"
        # GitHub's own redelivery keeps the delivery id: still one job, still "duplicate".
        again = deliver(c, body, "d-original")
        assert again.status_code == 202 and again.json()["status"] == "duplicate"
        # A different body (another event) under a new id is enqueued as usual.
        other = labeled() | {"issue": {"number": 2}}
        assert deliver(c, json.dumps(other).encode(), "d-other").json()["status"] == "queued"
    assert queued(redis) == 2
    record = body_key(hashlib.sha256(body).hexdigest())
    assert redis.get(record) == b"cmd-d-original"
    # The body record lives as long as the delivery dedupe: days, not forever.
    assert 3 * 24 * 3600 < int(redis.ttl(record)) <= 4 * 24 * 3600


def test_a_delivery_refused_by_redis_can_be_redelivered(serve: Serve, redis: Redis) -> None:
    # The body record names the delivery: if that delivery's job is missing (it was never
    # written), the same delivery id gets through; only other ids are replays.
    body = json.dumps(labeled()).encode()
    redis.set(body_key(hashlib.sha256(body).hexdigest()), "cmd-d-lost", ex=60)
    with http(serve()) as c:
        assert deliver(c, body, "d-lost").json()["status"] == "queued"
        assert deliver(c, body, "d-evil").json()["status"] == "duplicate"
    assert queued(redis) == 1


def test_deeply_nested_signed_body_is_400(serve: Serve, redis: Redis) -> None:
    depth = 100_000
    with http(serve()) as c:
        for body in [b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth]:
            resp = deliver(c, body, "d-deep")
            assert resp.status_code == 400, resp.text
            assert "nested too deeply" in resp.json()["error"]
        assert deliver(c, json.dumps(labeled()).encode(), "d-after").status_code == 202
    assert queued(redis) == 1  # only the normal one


# --- healthz ----------------------------------------------------------------------------


def test_healthz_with_redis_down_says_503_and_nothing_internal(serve: Serve) -> None:
    password = "hunter2-redis-password"
    server = RedisServer(password=password).start()
    try:
        conn = Redis.from_url(server.url, socket_connect_timeout=0.5, socket_timeout=0.5)
        base = serve(redis_conn=conn)
        with http(base) as c:
            assert c.get("/healthz").status_code == 200
            server.stop()
            resp = c.get("/healthz")
    finally:
        server.stop()
    assert resp.status_code == 503
    answer = resp.json()
    assert answer["status"] == "unhealthy" and answer["reason"] == "redis unavailable"
    assert set(answer) == {"status", "reason", "error_id"}
    text = resp.text
    for leak in [password, str(server.port), "127.0.0.1", "Error", "Connection", "redis://"]:
        assert leak not in text, leak
