"""The dashboard: the list of loops, a page per loop and its session log, and the JSON
API behind them, protected by a token.

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
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from importlib.resources import files
from typing import Any

from flask import Blueprint, Response, abort, jsonify, make_response, redirect, request
from redis import Redis
from werkzeug.wrappers import Response as BaseResponse

from bot.core.ids import LoopId
from bot.core.record import SUMMARY_FIELDS, LoopRecord, Status
from bot.core.rules.loop import budget
from bot.core.settings import Settings
from bot.core.spend.report import parse_since, report
from bot.core.text import sessionlog
from bot.core.text.redact import Redactor, deep, settings_secrets
from bot.io import schedules
from bot.io.store import Store
from bot.web import spend_page as spend

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
    # Tool results can hold anything the agent printed: the log shows none of the
    # worker's own secrets, nor anything shaped like a token.
    redactor = Redactor(settings_secrets(settings))

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

    @bp.get("/dashboard/spend")
    def spend_page() -> tuple[str, int]:
        try:
            window = parse_since(request.args.get("since", "30d"))
        except ValueError as exc:
            return escape(str(exc)), 400
        return spend.page(redis, [*store.all(), *store.archived()], window), 200

    @bp.get("/api/spend")
    def api_spend() -> tuple[Response, int]:
        """``loopbot report --format json`` over HTTP (``?since=7d&repo=OWNER/NAME``)."""
        try:
            window = parse_since(request.args.get("since", "7d"))
        except ValueError as exc:
            return jsonify({"error": str(exc)}), 400
        loops = [*store.all(), *store.archived()]
        built = report(loops, time.time() - window, request.args.get("repo") or None)
        return Response(built.to_json(), mimetype="application/json"), 200

    @bp.get("/api/schedules")
    def api_schedules() -> tuple[Response, int]:
        return jsonify({"schedules": schedules.overview(redis, time.time())}), 200

    @bp.get("/dashboard/loops/<owner>/<repo>/<int:issue>/log")
    def log_page(owner: str, repo: str, issue: int) -> str:
        return LOG_PAGE

    @bp.get("/api/loops/<owner>/<repo>/<int:issue>")
    def api_loop(owner: str, repo: str, issue: int) -> Response:
        key = _key(owner, repo, issue)
        record = store.get(key)
        if record is None:
            abort(404)
        events = loop_events(store, key)
        rows = redacted(turn_rows(events, record), redactor)
        # Verify output, errors and findings quote what tools printed: redacted like the log.
        return jsonify(
            {
                "loop": redacted(record.model_dump(mode="json"), redactor),
                # The issue's whole-life budget, live: spent and limit per budget.
                "budget": budget.table(record),
                "budget_line": budget.line(record),
                "events": redacted(events[-500:], redactor),
                # Both tables come from the same rows, reconciled with the record, so a
                # verify row always sits beside the turn it judged.
                "turns": rows,
                "verify": [{"seq": r["seq"], **r["verify"]} for r in rows if r["verify"]],
                "turns_not_shown": max(0, record.total_turns - len(rows)),
            }
        )

    @bp.get("/api/loops/<owner>/<repo>/<int:issue>/log")
    def api_log(owner: str, repo: str, issue: int) -> tuple[Response, int]:
        """The session log: ``entries`` (bot/core/text/sessionlog.py) from index ``from``.

        A page following a running loop sends ``have`` (the entries it holds) and their
        ``digest``: unchanged, only the entries after them come back; changed (a turn's
        messages were saved since), all of them, from 0. ``full=1&entry=I``: one entry
        whole ("show all").
        """
        key = _key(owner, repo, issue)
        record = store.get(key)
        if record is None:
            abort(404)
        try:
            ask = parse_log_query(request.args)
        except ValueError as exc:
            return jsonify({"error": str(exc)}), 400
        events = loop_events(store, key)
        entries = sessionlog.build(
            store.conversation(key),
            events,
            redactor,
            max_chars=FULL_CHARS if ask.full else LOG_CHARS,
        )
        answer: dict[str, Any] = {
            "status": record.status.value,
            "active": record.active,
            "turn": record.turn,
            "last_event": events[-1]["id"] if events else None,
            "count": len(entries),
            "digest": entries_digest(entries),
        }
        if ask.entry is not None:
            if ask.entry >= len(entries):
                return jsonify({"error": f"no entry {ask.entry}: the log has {len(entries)}"}), 404
            return jsonify(answer | {"entry": entries[ask.entry]}), 200
        held = 0 < ask.have <= len(entries)
        start = ask.have if held and entries_digest(entries[: ask.have]) == ask.digest else 0
        return jsonify(answer | {"from": start, "entries": entries[start:]}), 200

    return bp


def _key(owner: str, repo: str, issue: int) -> str:
    try:
        return LoopId(f"{owner}/{repo}", issue).key
    except ValueError:
        abort(404)  # not a repository name or an issue number: no such loop


def redacted(value: Any, redact: Redactor) -> Any:
    """``value`` (JSON data) with every string in it redacted, dict keys included."""
    return deep(value, redact)


# -- the session log ----------------------------------------------------------------------

LOG_CHARS = 4000  # of one entry's body on the page; "show all" asks for the rest
FULL_CHARS = 200_000  # of one entry's body at most, even in full


@dataclass(frozen=True)
class LogQuery:
    """What the log page asks: ``have`` entries it holds, whose digest is ``digest``
    (only what follows them comes back, unless they changed: then all of it); ``full``
    text; one ``entry`` by its index."""

    have: int
    digest: str
    full: bool
    entry: int | None


def parse_log_query(args: Mapping[str, str]) -> LogQuery:
    def number(name: str) -> int | None:
        raw = args.get(name)
        if raw is None or raw == "":
            return None
        if not raw.isdigit() or len(raw) > 9:
            raise ValueError(f"{name} must be a whole number >= 0, got {raw[:20]!r}")
        return int(raw)

    return LogQuery(
        have=number("have") or 0,
        digest=args.get("digest", "")[:64],
        full=args.get("full") in ("1", "true"),
        entry=number("entry"),
    )


def entries_digest(entries: list[dict[str, Any]]) -> str:
    """What the page holds, in 16 hex digits: equal digests, same entries."""
    raw = json.dumps(entries, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _summary(d: dict[str, Any]) -> dict[str, Any]:
    # ``waiting_for``: what a waiting loop waits for (summaries written before it: none).
    return {k: d[k] for k in SUMMARY_FIELDS} | {"waiting_for": d.get("waiting_for") or ""}


# A loop's stream is capped (bot/io/store.py, about 5,000 events); read it whole, oldest
# first, in pages, never more than this.
EVENT_PAGE = 1000
MAX_EVENTS = 20_000


def loop_events(store: Store, key: str) -> list[dict[str, Any]]:
    """Every event the loop's stream still holds, oldest first."""
    out: list[dict[str, Any]] = []
    after = "-"
    while len(out) < MAX_EVENTS:
        page = store.events(key, after=after, count=EVENT_PAGE)
        out += page
        if len(page) < EVENT_PAGE:
            break
        after = page[-1]["id"]
    return out


# -- the turns table -------------------------------------------------------------------

NOT_KEPT = "earlier events not kept"
# What ends a turn that never completed, when it comes while the turn is open.
_CUT_BY = {
    "handoff": "handed over",
    "loop_resumed": "interrupted: worker lost",
    "error": "interrupted: error",
    "loop_cancelled": "cancelled",
}
_VERIFY_FIELDS = ("turn", "passed", "exit_code", "seconds", "timed_out", "sha")


def turn_rows(events: list[dict[str, Any]], record: LoopRecord) -> list[dict[str, Any]]:
    """One row per turn the loop ran, oldest first, each with its verify run (or None).

    A turn is opened by ``turn_started`` and ended by ``turn_completed``, ``turn_capped``
    or whatever cut it short; ``verify`` belongs to the open turn. Turn numbers start
    again after a review round or a restart, so rows are ordered by the stream, and
    ``seq`` counts turns over the issue's life (``record.total_turns``). What the record
    says and the stream no longer shows (trimmed, or written before these events
    existed) becomes a row too: the tables never contradict the record.
    """
    rows: list[dict[str, Any]] = []
    open_: dict[str, Any] | None = None  # the turn in progress
    for e in events:
        kind, data = e["kind"], e["data"]
        if kind == "turn_started":
            if open_ is not None:
                open_["state"] = "interrupted"
            open_ = _row(data.get("turn"), "running")
            rows.append(open_)
        elif open_ is None:
            if kind == "verify":  # its turn_started is gone from the stream
                _attach_verify(rows, None, data)
            elif kind == "turn_completed":
                _complete(_placeholder(rows, data.get("turn")), data)
        elif kind == "step":
            _count_step(open_, data)
        elif kind == "verify":
            _attach_verify(rows, open_, data)
        elif kind == "turn_completed":
            row = (
                open_ if open_["turn"] == data.get("turn") else _placeholder(rows, data.get("turn"))
            )
            _complete(row, data)
            open_ = None
        elif kind == "turn_capped":
            open_.update(state="cut short", end=str(data.get("reason") or ""))
            open_ = None
        elif kind in _CUT_BY or kind == "loop_finished":
            open_["state"] = _CUT_BY.get(kind) or f"stopped: {data.get('reason') or ''}"
            open_ = None
    if open_ is not None and record.status is not Status.RUNNING:
        open_["state"] = "interrupted"
    _reconcile(rows, record)
    earlier = max(0, record.total_turns - len(rows))
    for i, row in enumerate(rows):
        row["seq"] = earlier + i + 1
    return rows


def _row(turn: Any, state: str) -> dict[str, Any]:
    counted = 0 if state == "running" else None  # None: not known (the events are gone)
    return {
        "turn": turn,
        "state": state,
        "end": "",
        "steps": counted,
        "tool_calls": counted,
        "cost_usd": None,
        "verify": None,
    }


def _count_step(row: dict[str, Any], data: dict[str, Any]) -> None:
    # One event per tool call, with the model-call count so far; a stall is no tool call.
    row["steps"] = max(row["steps"], int(data.get("step") or 0))
    if not str(data.get("tool", "")).startswith("stall"):
        row["tool_calls"] += 1


def _complete(row: dict[str, Any], data: dict[str, Any]) -> None:
    row.update(
        state="completed",
        end=str(data.get("end") or ""),
        steps=data.get("steps", row["steps"]),
        tool_calls=data.get("tool_calls", row["tool_calls"]),
        cost_usd=data.get("cost_usd"),
    )


def _placeholder(rows: list[dict[str, Any]], turn: Any) -> dict[str, Any]:
    """The latest row of ``turn`` with nothing of its end yet, or a new one for it."""
    open_rows = (r for r in reversed(rows) if r["state"] in ("running", NOT_KEPT))
    row = next((r for r in open_rows if r["turn"] == turn), None)
    if row is None:
        row = _row(turn, NOT_KEPT)
        rows.append(row)
    return row


def _attach_verify(
    rows: list[dict[str, Any]], open_: dict[str, Any] | None, data: dict[str, Any]
) -> None:
    verify = {k: data[k] for k in _VERIFY_FIELDS if k in data}
    if open_ is not None and open_["turn"] == data.get("turn"):
        open_["verify"] = verify
        return
    # A verify of a turn whose start the stream lost: a row of its own, before the open
    # turn (it happened before that turn started).
    row = _row(data.get("turn"), NOT_KEPT)
    row["verify"] = verify
    at = rows.index(open_) if open_ is not None else len(rows)
    rows.insert(at, row)


def _reconcile(rows: list[dict[str, Any]], record: LoopRecord) -> None:
    """Rows for what the record says that the stream does not show."""
    if record.turn and not (rows and rows[-1]["turn"] == record.turn):
        rows.append(_row(record.turn, NOT_KEPT))
    last = record.last_verify
    if not last or any(_same_verify(r["verify"], last) for r in rows):
        return
    # The record is written just before the event: a poll in between, or a trimmed
    # stream, still shows the record's verify beside its turn.
    turn = last.get("turn")
    row = next((r for r in reversed(rows) if r["turn"] == turn and not r["verify"]), None)
    if row is None:
        row = _row(turn, NOT_KEPT)
        # Before the turn in progress, which started after this verify ran.
        later = bool(rows) and rows[-1]["turn"] != turn and not rows[-1]["verify"]
        rows.insert(len(rows) - 1 if later else len(rows), row)
    row["verify"] = {k: last[k] for k in _VERIFY_FIELDS if k in last}


def _same_verify(shown: dict[str, Any] | None, last: dict[str, Any]) -> bool:
    return shown is not None and all(shown.get(k) == last.get(k) for k in ("turn", "sha"))


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
LOG_PAGE = _page("log.html")
STYLE = _page("style.css")
