"""The Messages API's JSON as every module reads and answers it: ``Json``, a message's
content blocks (``_blocks``) and the API's error answer (``_err``)."""

from __future__ import annotations

from typing import Any

from flask import Response, jsonify

Json = dict[str, Any]


def _blocks(msg: Json) -> list[Json]:
    if not isinstance(msg, dict):
        return []
    content = msg.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _err(status: int, kind: str, message: str) -> tuple[Response, int]:
    return jsonify({"type": "error", "error": {"type": kind, "message": message}}), status
