"""GitHub's App manifest flow, as github.com does it: the "new GitHub App" page a browser
posts a manifest to (for an account or an organization), the redirect back with a
one-time ``code`` and the caller's ``state``, and ``POST /app-manifests/{code}/conversions``
that trades the code, once and within an hour, for the App's id, key and webhook secret.

The stand-in serves one App: registering a new one makes it the App the server knows
(its id, signing key, webhook secret and webhook URL), as if the operator had just set it
up. The real page asks the person to confirm the App's name; this one registers at once.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from html import escape
from typing import Any
from urllib.parse import urlencode, urlsplit

from flask import Flask, Response, jsonify, redirect, request
from flask.typing import ResponseReturnValue

from bot.standins.github import auth
from bot.standins.github.state import State
from bot.standins.github.wire import Json, add_routes, error, now

CODE_TTL = 3600.0  # GitHub: "complete all three steps ... within one hour"
_ACCESS = ("read", "write", "admin")


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("POST", "/settings/apps/new", new_app_for_user),
            ("POST", "/organizations/<org>/settings/apps/new", new_app_for_org),
            ("POST", "/app-manifests/<code>/conversions", conversion),
        ],
    )


def is_web_page(path: str) -> bool:
    """Browser pages: they take no API authentication (a signed-in session instead)."""
    return path == "/settings/apps/new" or bool(
        re.fullmatch(r"/organizations/[^/]+/settings/apps/new", path)
    )


def new_app_for_user(state: State) -> ResponseReturnValue:
    return _register(state, owner="operator")


def new_app_for_org(state: State, org: str) -> ResponseReturnValue:
    return _register(state, owner=org)


def _register(state: State, owner: str) -> ResponseReturnValue:
    raw = request.form.get("manifest")
    if raw is None:
        return _page(422, "Invalid GitHub App configuration: no manifest parameter")
    try:
        manifest = json.loads(raw)
    except ValueError:
        return _page(422, "Invalid GitHub App configuration: the manifest is not JSON")
    problems = _problems(manifest)
    if problems:
        return _page(422, "Invalid GitHub App configuration: " + "; ".join(problems))
    app_id = state.next_id()
    name = str(manifest.get("name") or f"app-{app_id}")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or f"app-{app_id}"
    pem, public_key = auth.new_app_key()
    webhook_secret = secrets.token_hex(20)
    html_url = f"{state.url}/apps/{slug}"
    app_json: Json = {
        "id": app_id,
        "slug": slug,
        "node_id": f"A_{app_id}",
        "owner": {"login": owner, "id": state.add_user(owner).id, "type": "User"},
        "name": name,
        "description": str(manifest.get("description") or ""),
        "external_url": manifest["url"],
        "html_url": html_url,
        "created_at": now(),
        "updated_at": now(),
        "permissions": dict(manifest.get("default_permissions") or {}),
        "events": list(manifest.get("default_events") or []),
        "client_id": f"Iv1.{secrets.token_hex(8)}",
        "client_secret": secrets.token_hex(20),
        "webhook_secret": webhook_secret,
        "pem": pem,
    }
    code = secrets.token_hex(20)
    with state.lock:
        state.replace_app(
            app_id=app_id,
            slug=slug,
            private_key_pem=pem,
            public_key=public_key,
            webhook_secret=webhook_secret,
            webhook_url=manifest["hook_attributes"]["url"],
            permissions=app_json["permissions"],
            events=app_json["events"],
        )
        state.manifest_codes[code] = (app_json, time.time() + CODE_TTL)
    target = manifest.get("redirect_url")
    if not target:
        return _page(200, f"Registered {slug}. (No redirect_url: nothing to hand the code to.)")
    query = {"code": code}
    if "state" in request.args:
        query["state"] = request.args["state"]
    sep = "&" if urlsplit(target).query else "?"
    return redirect(f"{target}{sep}{urlencode(query)}", code=302)


def _problems(manifest: Any) -> list[str]:
    if not isinstance(manifest, dict):
        return ["the manifest is not an object"]
    problems = []
    if not isinstance(manifest.get("url"), str) or not manifest["url"].startswith("http"):
        problems.append("url is required")
    hook = manifest.get("hook_attributes")
    if not isinstance(hook, dict) or not str(hook.get("url", "")).startswith("http"):
        problems.append("hook_attributes.url is required")
    if len(str(manifest.get("name") or "")) > 34:
        problems.append("name is too long (maximum is 34 characters)")
    perms = manifest.get("default_permissions") or {}
    if not isinstance(perms, dict) or any(v not in _ACCESS for v in perms.values()):
        problems.append("default_permissions must map names to read, write or admin")
    events = manifest.get("default_events") or []
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        problems.append("default_events must be a list of event names")
    return problems


def conversion(state: State, code: str) -> tuple[Response, int]:
    """One use, within the hour; any other code is GitHub's 404."""
    with state.lock:
        entry = state.manifest_codes.pop(code, None)
    if entry is None or entry[1] < time.time():
        return error(404, "Not Found"), 404
    return jsonify(entry[0]), 201


def _page(status: int, text: str) -> Response:
    resp = Response(f"<!doctype html><p>{escape(text)}</p>", mimetype="text/html")
    resp.status_code = status
    return resp
