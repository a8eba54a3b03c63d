"""Files people attach to issues, as GitHub serves them.

On github.com an upload is written into the Markdown as a stable link
(``https://github.com/user-attachments/assets/<uuid>`` for an image,
``…/user-attachments/files/<id>/<name>`` for another file) that only a signed-in browser can
open. The API gives a reader the way in through the ``full`` media type
(``application/vnd.github.full+json``): the issue's ``body_html`` carries each attachment at
a signed, short-lived URL (``private-user-images.githubusercontent.com/…?jwt=…``, valid for
minutes). Here both kinds live on this server's own host: the Markdown link as on GitHub,
and in ``body_html`` a ``?jwt=`` signed URL that answers 404 once it has expired (after
``State.attachment_ttl`` seconds) and for any URL not signed by this server, which is how
GitHub answers them.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import dataclass

import cmarkgfm  # type: ignore[import-untyped]
import jwt
from cmarkgfm.cmark import Options  # type: ignore[import-untyped]
from flask import Flask, Response, request

from bot.standins.github.state import State
from bot.standins.github.wire import add_routes

_ASSET = "/user-attachments/assets/"
_FILE = "/user-attachments/files/"
_SIGNED_IMAGE = "/private-user-images/"


@dataclass(frozen=True)
class Upload:
    name: str
    data: bytes
    content_type: str  # what the uploader's browser said; never checked, as on GitHub
    ttl: float | None = None  # its signed URLs' life, when not the server's (a test's)


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("GET", f"{_SIGNED_IMAGE}<key>", signed_image),
            ("GET", f"{_FILE}<key>/<name>", attached_file),
            ("GET", f"{_ASSET}<key>", unsigned_asset),
        ],
    )


def is_attachment(path: str) -> bool:
    """The paths that take no API authentication: a signed URL is its own credential."""
    return path.startswith((_ASSET, _FILE, _SIGNED_IMAGE))


def upload(
    state: State,
    name: str,
    data: bytes,
    *,
    image: bool,
    content_type: str = "",
    ttl: float | None = None,
) -> str:
    """Store an upload as a person's browser does; the Markdown GitHub writes for it.
    ``ttl``: how long its signed URLs live (negative: expired when handed out)."""
    with state.lock:
        if image:
            key = str(uuid.uuid4())
            state.uploads[key] = Upload(name, data, content_type or "image/png", ttl)
            return f"![{name}]({state.url}{_ASSET}{key})"
        key = str(state.next_id())
        kind = content_type or "application/octet-stream"
        state.uploads[key] = Upload(name, data, kind, ttl)
        return f"[{name}]({state.url}{_FILE}{key}/{name})"


def _sign(state: State, key: str) -> str:
    found = state.uploads.get(key)
    ttl = found.ttl if found is not None and found.ttl is not None else state.attachment_ttl
    return jwt.encode(
        {"key": key, "exp": int(time.time() + ttl), "n": secrets.token_hex(4)},
        state.attachment_secret,
        algorithm="HS256",
    )


def _valid(state: State, key: str) -> bool:
    token = request.args.get("jwt", "")
    try:
        claims = jwt.decode(token, state.attachment_secret, algorithms=["HS256"])
    except jwt.PyJWTError:  # expired, unsigned, signed by someone else
        return False
    return bool(claims.get("key") == key)


def body_html(state: State, body: str) -> str:
    """The issue body as the ``full`` media type renders it: GitHub Flavored Markdown
    (raw ``<img>`` tags kept, as GitHub keeps them), each attachment of this server at a
    freshly signed URL; other URLs as written."""
    html = cmarkgfm.github_flavored_markdown_to_html(body or "", options=Options.CMARK_OPT_UNSAFE)
    base = re.escape(state.url)

    def image(m: re.Match[str]) -> str:
        key = m.group(1)
        return f"{state.url}{_SIGNED_IMAGE}{key}?jwt={_sign(state, key)}"

    def file(m: re.Match[str]) -> str:
        key = m.group(1)
        return f"{state.url}{_FILE}{key}/{m.group(2)}?jwt={_sign(state, key)}"

    html = re.sub(base + re.escape(_ASSET) + r"([0-9a-f-]{36})", image, html)
    return re.sub(base + re.escape(_FILE) + r"(\d+)/([^\"'\s?<>]+)", file, html)


def _serve(state: State, key: str) -> Response:
    found = state.uploads.get(key)
    if found is None or not _valid(state, key):
        return Response("Not Found", status=404, mimetype="text/plain")
    with state.lock:
        state.served.append(key)
        if request.headers.get("Authorization") or request.headers.get("Cookie"):
            state.served_with_credentials.append(key)
    return Response(found.data, mimetype=found.content_type)


def signed_image(state: State, key: str) -> Response:
    return _serve(state, key)


def attached_file(state: State, key: str, name: str) -> Response:
    upload_ = state.uploads.get(key)
    if upload_ is None or upload_.name != name:
        return Response("Not Found", status=404, mimetype="text/plain")
    return _serve(state, key)


def unsigned_asset(state: State, key: str) -> Response:
    """The Markdown's own link: a signed-in browser's page, never a reader's file."""
    return Response("Not Found", status=404, mimetype="text/plain")
