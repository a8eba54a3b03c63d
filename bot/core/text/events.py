"""What the session log (bot/core/text/sessionlog.py) and the status comment's timeline
(bot/core/text/timeline.py) both read of a loop's events: their order, a verify's output
tail and the failing test it names, a review's counts, and the clipping and coercion of
an event's fields. Below both, so neither imports the other."""

from __future__ import annotations

import re
from typing import Any


def _event_order(event: dict[str, Any]) -> tuple[int, int]:
    """Stream ids (``ms-seq``) sort the events as Redis wrote them."""
    ms, _, seq = str(event.get("id", "0-0")).partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return int(float(event.get("at") or 0) * 1000), 0


def _tail(data: dict[str, Any]) -> str:
    """A verify event's output tail (its field has been called both)."""
    return str(data.get("tail") or data.get("output") or "")


def _severities(data: dict[str, Any]) -> str:
    counts = [f"{data[s]} {s}" for s in ("sev1", "sev2", "sev3") if data.get(s)]
    return ", ".join(counts) or "no findings"


# -- failing tests ---------------------------------------------------------------------------

_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?::\S+)", re.MULTILINE)
_UNITTEST = re.compile(r"^(?:FAIL|ERROR): (\w+) \(", re.MULTILINE)
_GO = re.compile(r"^\s*--- FAIL: (\S+)", re.MULTILINE)
_CARGO = re.compile(r"^test (\S+) \.\.\. FAILED", re.MULTILINE)
_ERROR_LINE = re.compile(r"^(?:E\s+)?(.*(?:Error\b|Error:|\bassert\b).*)$", re.MULTILINE)


def failing_test(output: str) -> str:
    """The failing test that ``output`` names (``test_add``, ``test_add +2 more``), else
    its first error or assert line, else ""."""
    names = [m.rsplit("::", 1)[-1] for m in _PYTEST_FAILED.findall(output)]
    for pattern in (_UNITTEST, _GO, _CARGO):
        names = names or pattern.findall(output)
    names = list(dict.fromkeys(names))
    if names:
        more = f" +{len(names) - 1} more" if len(names) > 1 else ""
        return _clip(names[0], 60) + more
    for m in _ERROR_LINE.finditer(output):
        line = m.group(1).strip()
        if line:
            return _clip(line, 60)
    return ""


# -- small helpers ---------------------------------------------------------------------------


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _short(sha: Any) -> str:
    return str(sha or "?")[:7]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0
