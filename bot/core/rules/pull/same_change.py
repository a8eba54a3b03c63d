"""A review that carries to a new head when the change is the same: the harness merged
the default branch in (another loop merged first) and the pull request's own diff did
not change. GitHub keeps a person's approval then too (a stale approval is dismissed
only for a reviewable commit: a merge of the base that leaves the diff as it was is
not one), and verify ran again on the merged head. Without it, every loop behind
another in one repository paid a second review: a model call, a review, two check-run
writes (bench/fleet.py, issue 43). Pure."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bot.core.rules.pull import findings as flog

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def patch_digest(diff: str) -> str:
    """The change a unified diff makes, as a digest that a move of its hunks leaves
    alone: the ``index`` lines (blob ids, which any change of the base's file changes)
    and the hunks' line numbers are left out; every line the change adds or removes, and
    its context, counts. Context the base changed makes another digest: reviewed again."""
    kept = []
    for line in diff.splitlines():
        if line.startswith("index "):
            continue
        kept.append(_HUNK.sub("@@", line))
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def carried_from(
    *,
    sha: str,
    digest: str,
    catch_up: Mapping[str, str],
    patches: Mapping[str, str],
    verdicts: Mapping[str, str],
    finding_log: Sequence[dict[str, Any]],
    own_sev1: bool,
    kind: str,
) -> str | None:
    """The reviewed head whose approval the head ``sha`` carries, or None (the critic
    reviews it). Only for the harness's own catch-up (``catch_up``: the default branch
    merged cleanly into the head ``from``, verified with no turn, giving ``to``): any
    other head may hold a change its diff's text does not show (a binary file's bytes),
    or one nobody reviewed. Only an approval of ``from`` carries, only when the diff is
    the same, and only while nothing blocks: a sev1 standing, loopbot's own evidence
    finding on this head (``own_sev1``), or a metric loop (its results table changes with
    every head, and is what the critic judges)."""
    if kind == "metric" or own_sev1 or flog.blocking(finding_log):
        return None
    reviewed = catch_up.get("from", "")
    if catch_up.get("to") != sha or not reviewed:
        return None
    if patches.get(reviewed) == digest and verdicts.get(reviewed) == "approve":
        return reviewed
    return None
