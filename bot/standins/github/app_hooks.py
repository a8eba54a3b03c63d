"""The App's own webhook, as GitHub shows it to the App (JWT only): its configuration
(``/app/hook/config``) and the record of deliveries (``/app/hook/deliveries``), newest
first, paged by cursor, each failure with the status GitHub writes."""

from __future__ import annotations

from flask import Flask, Response, jsonify, request

from bot.standins.github.state import State
from bot.standins.github.wire import Json, add_routes, error

MAX_PER_PAGE = 100  # GitHub's limit for this endpoint


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("GET", "/app/hook/config", hook_config),
            ("GET", "/app/hook/deliveries", list_deliveries),
            ("GET", "/app/hook/deliveries/<int:delivery_id>", get_delivery),
        ],
    )


def hook_config(state: State) -> Response:
    state.need("app")
    return jsonify(
        {
            "url": state.webhook_url or "",
            "content_type": "json",
            # GitHub never shows the secret back, only that one is set.
            "secret": "********" if state.webhook_secret else None,
            "insecure_ssl": "0",
        }
    )


def delivery_json(record: Json) -> Json:
    """A delivery as GitHub lists it (``hook-delivery-item``)."""
    code = int(record.get("status_code", 0))
    if record.get("error"):
        status = f"We couldn't deliver this payload: {record['error']}"
    elif 200 <= code < 300:
        status = "OK"
    else:
        status = f"Invalid HTTP Response: {code}"
    return {
        "id": record["id"],
        "guid": record["delivery"],
        "delivered_at": record["delivered_at"],
        "redelivery": False,
        "duration": record.get("duration", 0.0),
        "status": status,
        "status_code": code,
        "event": record["event"],
        "action": record.get("action"),
        "installation_id": record.get("installation_id"),
        "repository_id": record.get("repository_id"),
        "throttled_at": None,
    }


def list_deliveries(state: State) -> Response:
    state.need("app")
    try:
        per_page = int(request.args.get("per_page", 30))
    except ValueError:
        return error(422, "per_page must be an integer")
    if not 1 <= per_page <= MAX_PER_PAGE:
        return error(422, f"per_page must be between 1 and {MAX_PER_PAGE}")
    wanted = request.args.get("status")
    if wanted not in (None, "success", "failure"):
        return error(422, "status must be success or failure")
    with state.lock:
        items = [delivery_json(r) for r in reversed(state.deliveries) if "id" in r]
    if wanted:
        items = [d for d in items if (d["status"] == "OK") == (wanted == "success")]
    cursor = request.args.get("cursor")
    if cursor:  # the cursor is the id the previous page stopped after
        try:
            after = int(cursor.removeprefix("v1_"))
        except ValueError:
            return error(422, "cursor is not valid")
        items = [d for d in items if d["id"] < after]
    shown = items[:per_page]
    resp = jsonify(shown)
    if len(items) > per_page:
        nxt = f"{request.base_url}?per_page={per_page}&cursor=v1_{shown[-1]['id']}"
        if wanted:
            nxt += f"&status={wanted}"
        resp.headers["Link"] = f'<{nxt}>; rel="next"'
    return resp


def get_delivery(state: State, delivery_id: int) -> Response:
    state.need("app")
    with state.lock:
        for record in state.deliveries:
            if record.get("id") == delivery_id:
                return jsonify(delivery_json(record))
    return error(404, "Not Found")
