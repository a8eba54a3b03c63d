"""Structured logging: JSON lines in production, readable lines on a terminal."""

from __future__ import annotations

import json
import logging
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


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
