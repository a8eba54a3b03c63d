"""Who is calling: the App's signing key, its JWTs, installation and user tokens, and the
App endpoints that list installations and mint installation tokens."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from flask import Flask, Response, abort, g, jsonify, request

from bot.standins.github.shapes import repo_json
from bot.standins.github.state import State
from bot.standins.github.wire import Json, add_routes, error, now, page


def new_app_key() -> tuple[str, rsa.RSAPublicKey]:
    """A fresh App private key (PEM, for the bot's settings) and its public half."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    return pem, key.public_key()


def authenticate(state: State) -> tuple[str, Any]:
    """``(kind, who)`` for the request's Authorization header, or GitHub's 401: ``("app",
    app_id)`` for a JWT, ``("installation", id)`` or ``("user", login)`` for a token."""
    header = request.headers.get("Authorization", "")
    scheme, _, cred = header.partition(" ")
    if scheme.lower() == "bearer" and cred.count(".") == 2:
        try:
            claims = jwt.decode(cred, state.public_key, algorithms=["RS256"])
        except jwt.PyJWTError as exc:
            abort(error(401, f"A JSON web token could not be decoded: {exc}"))
        if str(claims.get("iss")) != str(state.app_id):
            abort(error(401, "JWT issuer is not this App"))
        return ("app", state.app_id)
    if scheme.lower() in ("token", "bearer") and cred:
        with state.lock:
            entry = state.tokens.get(cred)
        if entry is None or entry[2] < time.time():
            abort(error(401, "Bad credentials"))
        return (entry[0], entry[1])
    abort(error(401, "Requires authentication"))


def mint_installation_token(state: State, installation_id: int) -> tuple[str, datetime]:
    """A new installation token and when it expires."""
    token = f"ghs_{secrets.token_hex(16)}"
    expires = datetime.now(UTC) + state.token_ttl
    with state.lock:
        state.tokens[token] = ("installation", installation_id, expires.timestamp())
    return token, expires


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("GET", "/app", get_app),
            ("GET", "/app/installations", list_installations),
            ("POST", "/app/installations/<int:iid>/access_tokens", access_token),
            ("GET", "/installation/repositories", installation_repos),
        ],
    )


def get_app(state: State) -> Response:
    state.need("app")
    permissions, events = state.registered()
    return jsonify(
        {
            "id": state.app_id,
            "slug": state.app_slug,
            "name": state.app_slug,
            "owner": {"login": "local"},
            "permissions": permissions,
            "events": events,
        }
    )


def installation_json(state: State, iid: int) -> Json:
    """One installation as ``GET /app/installations`` shows it: what its owner granted."""
    account = state.users.get(state.installations[iid])
    grant = state.grants.get(iid) or {}
    permissions, events = state.registered()
    return {
        "id": iid,
        "account": account.json() if account else {"login": state.installations[iid]},
        "repository_selection": "selected",
        "access_tokens_url": f"{state.url}/app/installations/{iid}/access_tokens",
        "repositories_url": f"{state.url}/installation/repositories",
        "html_url": f"{state.url}/settings/installations/{iid}",
        "app_id": state.app_id,
        "app_slug": state.app_slug,
        "target_id": account.id if account else iid,
        "target_type": account.type if account else "User",
        "permissions": grant.get("permissions", permissions),
        "events": grant.get("events", events),
        "created_at": grant.get("created_at", now()),
        "updated_at": grant.get("created_at", now()),
        "single_file_name": None,
        "suspended_by": None,
        "suspended_at": grant.get("suspended_at"),
    }


def list_installations(state: State) -> Response:
    state.need("app")
    with state.lock:
        return jsonify(page([installation_json(state, i) for i in state.installations]))


def access_token(state: State, iid: int) -> tuple[Response, int]:
    state.need("app")
    if iid not in state.installations:
        abort(error(404, "Not Found"))
    token, expires = mint_installation_token(state, iid)
    with state.lock:
        # The token holds what the installation's owner granted (no narrowing asked).
        granted = installation_json(state, iid)["permissions"]
    return jsonify(
        {
            "token": token,
            "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "permissions": granted,
            "repository_selection": "all",
        }
    ), 201


def installation_repos(state: State) -> Response:
    kind, iid = g.auth
    if kind != "installation":
        abort(error(403, "installation token required"))
    repos = [repo_json(state, r) for r in state.repos.values() if r.installation_id == iid]
    return jsonify({"total_count": len(repos), "repositories": page(repos)})
