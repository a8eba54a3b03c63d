"""The dashboard: two pages and the JSON API behind them, protected by a token.

No token configured (``LOOPBOT_DASHBOARD_TOKEN``) means no dashboard: every route
answers 404, never an open page. With a token, a request carries either
``Authorization: Bearer <token>`` (scripts) or a session cookie from signing in with a
POST to ``/dashboard/login`` (browsers). The token never travels in a URL and never
sits in a cookie: the cookie holds a random session id, Redis holds only its SHA-256
with an expiry (``LOOPBOT_DASHBOARD_SESSION_TTL``), and ``/dashboard/logout`` deletes it.
The cookie is HttpOnly, SameSite=Strict, and Secure whenever the request came over TLS
(directly, or through a proxy the operator trusts: ``LOOPBOT_TRUSTED_PROXY``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from flask import Blueprint, Response, abort, jsonify, make_response, redirect, request
from redis import Redis
from werkzeug.wrappers import Response as BaseResponse

from bot.core.ids import LoopId
from bot.core.record import SUMMARY_FIELDS, Status
from bot.core.rules import budget
from bot.core.settings import Settings
from bot.io.store import Store

COOKIE = "loopbot_session"
SESSION_PREFIX = "loopbot:dashboard:session:"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def session_key(session_id: str) -> str:
    """Redis keeps the hash of a session id: reading Redis does not give a sign-in."""
    return SESSION_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


def blueprint(settings: Settings, store: Store, redis: Redis) -> Blueprint:
    bp = Blueprint("dashboard", __name__)
    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else ""
    token_digest = _digest(token)
    ttl = settings.dashboard_session_ttl

    def token_ok(given: str) -> bool:
        # Equal-length digests, compared in constant time: no timing on the token itself.
        return bool(given) and hmac.compare_digest(_digest(given), token_digest)

    def session_ok() -> bool:
        sid = request.cookies.get(COOKIE, "")
        if not sid or len(sid) > 100:
            return False
        return bool(redis.exists(session_key(sid)))

    def authorized() -> bool:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            return token_ok(header.removeprefix("Bearer ").strip())
        return session_ok()

    def login_page(code: int) -> Response:
        resp = make_response(LOGIN_PAGE, code)
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @bp.before_request
    def guard() -> Response | tuple[Response, int] | None:
        if not token:
            abort(404)
        if request.endpoint in ("dashboard.login", "dashboard.logout", "dashboard.style"):
            return None
        if authorized():
            return None
        if request.path.startswith("/api/"):
            return jsonify({"error": "unauthorized: sign in or send Authorization: Bearer"}), 401
        return login_page(401)

    @bp.get("/dashboard/login")
    def login_form() -> Response:
        # Never signs in: a token in a URL ends up in proxy logs and browser history.
        return login_page(200)

    @bp.post("/dashboard/login")
    def login() -> BaseResponse:
        if not token_ok(request.form.get("token", "")):
            return login_page(401)
        sid = secrets.token_urlsafe(32)
        redis.set(session_key(sid), "1", ex=ttl)
        resp = redirect("/dashboard", code=303)
        resp.set_cookie(
            COOKIE,
            sid,
            max_age=ttl,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.is_secure,  # https, directly or from a trusted proxy
        )
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @bp.post("/dashboard/logout")
    def logout() -> BaseResponse:
        sid = request.cookies.get(COOKIE, "")
        if sid and len(sid) <= 100:
            redis.delete(session_key(sid))
        resp = redirect("/dashboard/login", code=303)
        resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="Strict")
        return resp

    @bp.get("/dashboard/static/style.css")
    def style() -> Response:
        return Response(STYLE, mimetype="text/css")

    @bp.get("/dashboard")
    def index() -> str:
        return LIST_PAGE

    @bp.get("/dashboard/loops/<owner>/<repo>/<int:issue>")
    def loop_page(owner: str, repo: str, issue: int) -> str:
        return LOOP_PAGE

    @bp.get("/api/loops")
    def api_loops() -> tuple[Response, int]:
        try:
            page = parse_page(request.args)
        except ValueError as exc:
            return jsonify({"error": str(exc)}), 400
        rows, total = store.recent(page.limit, page.offset, page.status)
        return jsonify(
            {
                "loops": [_summary(r) for r in rows],
                "total": total,
                "limit": page.limit,
                "offset": page.offset,
                "status": page.status,
            }
        ), 200

    @bp.get("/api/loops/<owner>/<repo>/<int:issue>")
    def api_loop(owner: str, repo: str, issue: int) -> Response:
        try:
            key = LoopId(f"{owner}/{repo}", issue).key
        except ValueError:
            abort(404)  # not a repository name or an issue number: no such loop
        record = store.get(key)
        if record is None:
            abort(404)
        events = store.events(key, count=2000)
        return jsonify(
            {
                "loop": record.model_dump(mode="json"),
                # The issue's whole-life budget, live: spent and limit per budget.
                "budget": budget.table(record),
                "budget_line": budget.line(record),
                "events": events[-500:],
                "turns": [e["data"] for e in events if e["kind"] == "turn_completed"],
                "verify": [e["data"] for e in events if e["kind"] == "verify"],
            }
        )

    return bp


def _summary(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in SUMMARY_FIELDS}


DEFAULT_LIMIT = 50
MAX_LIMIT = 500


@dataclass(frozen=True)
class Page:
    limit: int
    offset: int
    status: str | None


def parse_page(args: Mapping[str, str]) -> Page:
    """``limit``, ``offset`` and ``status`` from a query string, or a ValueError that says
    which one is wrong."""

    def number(name: str, default: int, low: int, high: int) -> int:
        raw = args.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
        if not low <= value <= high:
            raise ValueError(f"{name} must be between {low} and {high}, got {value}")
        return value

    status = args.get("status") or None
    if status is not None and status not in {s.value for s in Status}:
        raise ValueError(
            f"status must be one of {', '.join(s.value for s in Status)}, got {status!r}"
        )
    return Page(
        limit=number("limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        offset=number("offset", 0, 0, 10**9),
        status=status,
    )


def _page(name: str) -> str:
    return (files("bot.web") / "static" / name).read_text(encoding="utf-8")


LOGIN_PAGE = _page("login.html")
LIST_PAGE = _page("loops.html")
LOOP_PAGE = _page("loop.html")
STYLE = _page("style.css")
