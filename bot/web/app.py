"""The Flask app: verify, dedupe, route, enqueue, answer. Nothing slow in a request."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any, assert_never

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST
from redis import Redis
from redis.exceptions import RedisError
from werkzeug.middleware.proxy_fix import ProxyFix

from bot.core import signature
from bot.core.rules.routing import Enqueue, Ignore, Malformed, route
from bot.core.settings import Settings, SettingsError
from bot.io.logs import get_logger
from bot.io.metrics import WEBHOOK_SECONDS
from bot.io.metrics import render as render_metrics
from bot.io.queues import CommandEnqueuer, Duplicate, Replay, control_queue
from bot.io.redis import connect
from bot.io.store import Store
from bot.web import dashboard

MAX_BODY_BYTES = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB

log = get_logger("loopbot.web")


class _JSON(Response):
    default_mimetype = "application/json"


def _answer(code: int, **body: Any) -> tuple[Response, int]:
    # json.dumps, not jsonify: the app's JSON provider (sorting, indent checks) cost more
    # per delivery than the checks themselves. Answers are small flat dicts of strings.
    return _JSON(json.dumps(body)), code


def _queued(job_id: str) -> tuple[Response, int]:
    """``_answer(202, status="queued", job=job_id)``, the answer to nearly every delivery."""
    return _JSON(f'{{"status": "queued", "job": {json.dumps(job_id)}}}'), 202


def create_app(settings: Settings, redis: Redis | None = None) -> Flask:
    """Build the web app around ``settings``; ``redis`` defaults to ``settings.redis_url``."""
    app = Flask("loopbot")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    proxies = int(settings.trusted_proxy)  # true is one proxy
    if proxies < 0:
        raise SettingsError(["LOOPBOT_TRUSTED_PROXY: must be true, false or a count >= 0"])
    if proxies:
        # Only then is X-Forwarded-Proto (https: Secure cookies) and -For believed, and
        # only the values the trusted proxies appended, never what a client sent them.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=proxies, x_proto=proxies)  # type: ignore[method-assign]
    # Few retries: a webhook request must answer fast; a 503 makes GitHub's redeliver usable.
    conn = redis or connect(settings.redis_url, retries=2, timeout=2)
    secret = settings.github_webhook_secret.get_secret_value().encode()
    enqueuer = CommandEnqueuer(control_queue(conn))
    app.extensions["loopbot.redis"] = conn
    app.extensions["loopbot.settings"] = settings

    @app.post("/webhook")
    def webhook() -> tuple[Response, int]:
        started = time.perf_counter()
        body = request.get_data(cache=False)  # raises 413 past MAX_CONTENT_LENGTH
        # The WSGI environ, not request.headers: the same values, one dict lookup each.
        environ = request.environ
        if not signature.verify(secret, body, environ.get("HTTP_X_HUB_SIGNATURE_256")):
            log.warning("webhook.bad_signature", remote=request.remote_addr)
            return _answer(401, error="bad or missing X-Hub-Signature-256")
        event = environ.get("HTTP_X_GITHUB_EVENT", "")
        delivery = environ.get("HTTP_X_GITHUB_DELIVERY", "")
        if not event or not delivery:
            return _answer(400, error="missing X-GitHub-Event or X-GitHub-Delivery")
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return _answer(400, error="body is not JSON")
        except RecursionError:
            log.warning("webhook.too_deep", delivery=delivery, gh_event=event)
            return _answer(400, error="body is JSON nested too deeply")
        if event == "ping":
            return _answer(200, status="pong")

        # Every line about this delivery starts with these fields, in this order.
        about = {"delivery": delivery, "gh_event": event, "action": _action(payload)}
        decision = route(event, payload, app_id=settings.github_app_id, delivery=delivery)
        match decision:
            case Malformed(reason=reason):
                log.warning("webhook.malformed", **about, reason=reason)
                return _answer(400, error=reason)
            case Ignore(reason=reason):
                # Nothing is stored for ignored deliveries: a repeat is ignored again.
                log.debug("webhook.ignored", **about, reason=reason)
                return _answer(202, status="ignored", reason=reason)
            case Enqueue(command=cmd):
                pass
            case _:
                assert_never(decision)
        try:
            job_id = enqueuer.enqueue(cmd, hashlib.sha256(body).hexdigest())
        except Replay:
            # The same signed body under a new delivery id: GitHub's own redeliveries
            # keep the id, and two real events never have byte-identical bodies.
            log.warning("webhook.replay", **about)
            return _answer(202, status="duplicate", reason="this body was delivered before")
        except Duplicate:
            log.info("webhook.duplicate", **about)
            return _answer(202, status="duplicate")
        elapsed = time.perf_counter() - started
        WEBHOOK_SECONDS.observe(elapsed)
        log.info(
            "webhook.enqueued",
            **about,
            kind=cmd.kind,
            repo=cmd.repo,
            issue=cmd.issue,
            actor=cmd.actor,
            job=job_id,
            ms=round(elapsed * 1000, 2),
        )
        return _queued(job_id)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(render_metrics(conn), mimetype=CONTENT_TYPE_LATEST)

    app.register_blueprint(dashboard.blueprint(settings, Store(conn), conn))

    @app.get("/healthz")
    def healthz() -> tuple[Response, int]:
        try:
            conn.ping()
        except RedisError as exc:
            # The details (host, port, the client's message) go to the log, under an id
            # the answer gives; the answer itself is fixed text.
            error_id = secrets.token_hex(6)
            log.error("healthz.redis_unavailable", error_id=error_id, error=repr(exc))
            return _answer(503, status="unhealthy", reason="redis unavailable", error_id=error_id)
        return _answer(200, status="ok")

    @app.errorhandler(RedisError)
    def redis_down(exc: RedisError) -> tuple[Response, int]:
        error_id = secrets.token_hex(6)
        log.error("redis.unavailable", error_id=error_id, error=repr(exc))
        return _answer(503, error="queue unavailable; redeliver later", error_id=error_id)

    return app


def _action(payload: Any) -> str | None:
    return payload.get("action") if isinstance(payload, dict) else None
