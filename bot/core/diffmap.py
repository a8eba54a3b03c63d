"""Where a review comment may go: the new-side lines of a unified diff. Pure."""

from __future__ import annotations


def right_side_lines(diff_text: str) -> dict[str, set[int]]:
    """For each file in ``diff_text``, the new-side line numbers inside its hunks.

    GitHub accepts an inline review comment (``side: RIGHT``) only on those lines:
    added lines and the context lines around them.
    """
    lines: dict[str, set[int]] = {}
    path: str | None = None
    new_line = 0
    for raw in diff_text.splitlines():
        if raw.startswith("+++ "):
            path = raw[6:] if raw.startswith("+++ b/") else None  # "+++ /dev/null": deleted
            if path is not None:
                lines.setdefault(path, set())
        elif raw.startswith("diff --git"):
            path = None
        elif raw.startswith("@@") and path is not None:
            # "@@ -a,b +c,d @@ ..." : the new side starts at line c
            new = raw.split("+", 1)[1].split(" ", 1)[0]
            new_line = int(new.split(",")[0])
        elif path is not None and raw[:1] in (" ", "+"):
            lines[path].add(new_line)
            new_line += 1
    return lines


def changed_line_count(diff_text: str) -> int:
    """Added plus removed lines, headers excluded."""
    return sum(
        1
        for raw in diff_text.splitlines()
        if raw[:1] in ("+", "-") and not raw.startswith(("+++ ", "--- "))
    )
