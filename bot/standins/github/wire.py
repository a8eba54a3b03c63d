"""HTTP plumbing the resource modules share: GitHub's error body, its pagination and
timestamps, and the route tables each module registers."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, jsonify, request
from flask.typing import ResponseReturnValue

Json = dict[str, Any]

# (methods, rule, view): the view is called with the state first, then the URL's variables.
Route = tuple[str, str, Callable[..., ResponseReturnValue]]


def add_routes(app: Flask, state: object, routes: Iterable[Route]) -> None:
    """Register each view with ``state`` bound; the view's name is its endpoint, as with
    ``@app.get``. ``methods`` is one or more names separated by spaces."""
    for methods, rule, view in routes:
        app.add_url_rule(
            rule,
            endpoint=view.__name__,
            view_func=functools.partial(view, state),
            methods=methods.split(),
        )


def error(status: int, message: str) -> Response:
    resp = jsonify({"message": message, "documentation_url": "https://docs.github.com/rest"})
    resp.status_code = status
    return resp


def page(items: list[Any]) -> list[Any]:
    """The page of ``items`` the request asks for (``per_page`` 30 unless told, as GitHub)."""
    per_page = int(request.args.get("per_page", 30))
    page = int(request.args.get("page", 1))
    return items[(page - 1) * per_page : page * per_page]


def public(d: Json) -> Json:
    """``d`` without the bookkeeping keys (those starting with ``_``)."""
    return {k: v for k, v in d.items() if not k.startswith("_")}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
