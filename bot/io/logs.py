"""Structured logging: JSON lines in production, readable lines on a terminal."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
from typing import Any, Literal

import structlog


def _fallback(obj: Any) -> Any:
    """What JSONRenderer writes for a value JSON has no type for: ``__structlog__()``, or
    the repr."""
    try:
        return obj.__structlog__()
    except AttributeError:
        return repr(obj)


# The text JSONRenderer writes by default (json.dumps with that fallback), from one
# encoder for every line: json.dumps with any keyword argument builds a new JSONEncoder
# per call, a cost every webhook delivery paid.
_ENCODER = json.JSONEncoder(default=_fallback)


def _encode(event_dict: Any, **_: Any) -> str:
    return _ENCODER.encode(event_dict)


def configure(fmt: Literal["json", "console"] = "json", level: int = logging.INFO) -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer(_encode)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Library loggers (rq, werkzeug, githubkit) go to stderr at WARNING and above.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)


def log_from_signal_handler(event: str, **fields: Any) -> None:
    """One JSON line straight to stderr's descriptor, for a signal handler: structlog's
    writer takes a lock that the code the signal interrupted may hold (the handler runs on
    the same thread), and a second write would wait on it for ever. One ``os.write`` takes
    no lock; at worst the line lands in the middle of one being written."""
    line = _ENCODER.encode({"event": event, "level": "info", "timestamp": _now_iso(), **fields})
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


def _now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
