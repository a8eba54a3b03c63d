"""Numbers as people read them in what loopbot writes: counts with their noun, and
durations in the unit that fits."""

from __future__ import annotations


def plural(n: int, word: str) -> str:
    """``1 turn``, ``2 turns``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def duration(seconds: float) -> str:
    """``0.4 s``, ``3 s``, ``4 min``, ``1.5 h``: seconds under 10 to a tenth, then whole
    seconds to 90 s, whole minutes to 90 min, hours to a tenth."""
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
