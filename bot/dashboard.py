"""The dashboard: two pages and the JSON API behind them, protected by a token.

No token configured (``LOOPBOT_DASHBOARD_TOKEN``) means no dashboard: every route
answers 404, never an open page. With a token, requests carry it as
``Authorization: Bearer <token>`` or in the cookie set by ``/dashboard/login``.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from flask import Blueprint, Response, abort, jsonify, make_response, redirect, request

from bot.loopstate import SUMMARY_FIELDS, Status
from bot.settings import Settings
from bot.store import Store

COOKIE = "loopbot_dashboard"


def blueprint(settings: Settings, store: Store) -> Blueprint:
    bp = Blueprint("dashboard", __name__)
    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else ""

    def authorized() -> bool:
        header = request.headers.get("Authorization", "")
        given = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        given = given or request.cookies.get(COOKIE, "")
        return bool(given) and hmac.compare_digest(given.encode(), token.encode())

    @bp.before_request
    def guard() -> Response | tuple[Response, int] | None:
        if not token:
            abort(404)
        if request.endpoint in ("dashboard.login", "dashboard.style") or authorized():
            return None
        if request.path.startswith("/api/"):
            return jsonify({"error": "unauthorized: send Authorization: Bearer <token>"}), 401
        return make_response(LOGIN_PAGE, 401)

    @bp.route("/dashboard/login", methods=["GET", "POST"])
    def login() -> Any:
        given = request.values.get("token", "")
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            return make_response(LOGIN_PAGE, 401)
        resp = redirect("/dashboard")
        resp.set_cookie(
            COOKIE,
            given,
            httponly=True,
            samesite="Strict",
            secure=request.is_secure,
            max_age=7 * 24 * 3600,
        )
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
        key = f"{owner}/{repo}#{issue}"
        record = store.get(key)
        if record is None:
            abort(404)
        events = store.events(key, count=2000)
        return jsonify(
            {
                "loop": record.model_dump(mode="json"),
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
    return (files("bot") / "static" / name).read_text(encoding="utf-8")


LOGIN_PAGE = _page("login.html")
LIST_PAGE = _page("loops.html")
LOOP_PAGE = _page("loop.html")
STYLE = _page("style.css")
