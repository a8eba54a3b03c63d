"""What the other modules share: ``Json``, ids in the API's style (``new_id``), the API's error
shape (``Rejected``, raised by the checks and answered by the server) and reading a
request's body, compressed or not."""

from __future__ import annotations

import gzip
import itertools
import json
import secrets
import zlib
from typing import Any

from flask import Response, jsonify, request

Json = dict[str, Any]
_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A fresh id in the API's style (``resp_``, ``msg_``, ``fc_``, ``ctc_``, ``rs_``,
    ``call_``): a counter, for order when debugging, and random hex, for uniqueness."""
    return f"{prefix}_{next(_ids):06d}{secrets.token_hex(8)}"


class Rejected(Exception):
    """An answer in the API's error shape: raised by the checks, answered by the server."""

    def __init__(
        self,
        message: str,
        code: str | None = "invalid_value",
        param: str | None = None,
        status: int = 400,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.status = status
        self.kind = kind


def error_body(message: str, kind: str, code: str | None, param: str | None = None) -> Json:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _err(e: Rejected) -> tuple[Response, int]:
    return jsonify(error_body(e.message, e.kind, e.code, e.param)), e.status


def _decoded(raw: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    try:
        if encoding == "gzip":
            return gzip.decompress(raw)
        if encoding == "deflate":
            return zlib.decompress(raw)
    except (OSError, zlib.error) as exc:
        raise Rejected(f"Could not decode the {encoding} body: {exc}", None) from exc
    raise Rejected(f"Unsupported Content-Encoding: '{encoding}'.", None, status=415)


def _read_body() -> Any:
    raw = _decoded(request.get_data(), request.headers.get("Content-Encoding", ""))
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise Rejected(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON.)",
            None,
        ) from exc
