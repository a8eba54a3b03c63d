"""The status comment's timeline: the short checklist of what a loop did (a line per
turn, review round, section, merge...), built event by event and carried from one status
update to the next (``Timeline.to_json``). Apart from the session log: its own events,
its own lines, read by jobs/status_comment.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bot.core.text.defuse import safe_text
from bot.core.text.events import (
    _clip,
    _event_order,
    _int,
    _is_int,
    _severities,
    _short,
    _tail,
    failing_test,
)
from bot.core.text.redact import deep

TIMELINE_CHARS = 99  # a checklist line stays on one line of the comment


@dataclass
class _Line:
    text: str
    turn: int | None = None
    review: int | None = None
    # The turn's number over the whole life (``turn`` starts at 1 again after a
    # review round sends the loop back to coding): what people read.
    label: int | None = None


# The kinds the timeline has a line for. Every other event (each agent step, each
# command) is skipped before anything is redacted: most of a loop's events are those.
TIMELINE_KINDS = frozenset(
    {
        "turn_started", "turn_capped", "verify", "no_change", "test_requested",
        "pr_opened", "review_started", "section_audit_started", "section_audited",
        "section_done", "post_action", "triage", "triage_failed", "spec_accepted",
        "split", "metric_iteration", "reviewed", "review_skipped", "review_carried",
        "back_to_coding",
        "handoff", "loop_resumed", "loop_restarted", "loop_cancelled", "shrink",
        "hidden_text_removed",
        "context_shrunk", "base_merged", "merge_refused", "merged", "branch_kept",
        "loop_finished",
    }
)  # fmt: skip
# Why a merged branch stayed (jobs/review/gate.py ``_delete_branch``).
KEPT = {
    "moved": "a push after the merge moved it",
    "refused": "GitHub refused its deletion (a rule)",
}
# Lines a Timeline keeps: the comment shows 12, and an event updates a line of its own
# turn or review round, a few lines back at most. What it drops is counted.
TIMELINE_WINDOW = 24
TIMELINE_FORMAT = 1


@dataclass
class Timeline:
    """The status comment's checklist, built event by event: ``add`` the events written
    since ``last_id``, ``render`` the newest lines. It keeps the newest
    ``TIMELINE_WINDOW`` lines and a count of the rest, so neither its size nor an
    update's cost grows with the loop's history; ``to_json``/``from_json`` carry it from
    one status update to the next."""

    lines: list[_Line] = field(default_factory=list)
    dropped: int = 0
    last_id: str = "-"  # the newest event seen (a stream id), "-" for none

    def add(self, events: list[dict[str, Any]], redact: Callable[[str], str] | None = None) -> None:
        """Apply ``events`` (newer than ``last_id``), redacting each one that makes or
        changes a line before any of its text is clipped or defused (see build)."""
        ordered = sorted(events, key=_event_order)
        shown = [e for e in ordered if str(e.get("kind", "")) in TIMELINE_KINDS]
        if redact is not None:
            shown = deep(shown, redact)
        for event in shown:
            _timeline_event(self.lines, str(event.get("kind", "")), event.get("data") or {})
        if ordered and "id" in ordered[-1]:
            self.last_id = str(ordered[-1]["id"])
        excess = len(self.lines) - TIMELINE_WINDOW
        if excess > 0:
            del self.lines[:excess]
            self.dropped += excess

    def render(self, limit: int = 12) -> list[str]:
        """The newest lines, oldest first; more than ``limit`` fold the oldest into one
        "… N earlier steps" line. A step under way ends with "…"."""
        texts = [_clip(line.text, TIMELINE_CHARS) for line in self.lines]
        total = self.dropped + len(texts)
        if total <= limit and not self.dropped:
            return texts
        keep = min(max(limit - 1, 0), len(texts))
        return [f"… {total - keep} earlier steps", *(texts[-keep:] if keep else [])]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TIMELINE_FORMAT,
            "last_id": self.last_id,
            "dropped": self.dropped,
            "lines": [[ln.text, ln.turn, ln.review, ln.label] for ln in self.lines],
        }

    @classmethod
    def from_json(cls, data: Any) -> Timeline | None:
        """The timeline saved by ``to_json``; None for anything else (another format, a
        damaged value): the caller builds it again from the events."""
        try:
            if data.get("format") != TIMELINE_FORMAT:
                return None
            lines = [
                _Line(str(text), _opt_int(turn), _opt_int(review), _opt_int(label))
                for text, turn, review, label in data["lines"]
            ]
            return cls(lines, int(data["dropped"]), str(data["last_id"]))
        except (AttributeError, KeyError, TypeError, ValueError):
            return None


def _opt_int(v: Any) -> int | None:
    return int(v) if v is not None else None


def timeline(
    events: list[dict[str, Any]],
    *,
    limit: int = 12,
    redact: Callable[[str], str] | None = None,
) -> list[str]:
    """The status comment's checklist from ``events`` (a whole stream), oldest first."""
    built = Timeline()
    built.add(events, redact)
    return built.render(limit)


def _timeline_event(lines: list[_Line], kind: str, data: dict[str, Any]) -> None:
    turn = _int(data["turn"]) if _is_int(data.get("turn")) else None
    match kind:
        case "turn_started":
            label = _int(data["total"]) if _is_int(data.get("total")) else turn
            lines.append(_Line(f"turn {label} — coding…", turn=turn, label=label))
        case "turn_capped":
            _set_turn(lines, turn, f"turn {turn} — stopped ({_word(data.get('reason'))})")
        case "verify":
            _set_turn(lines, turn, f"turn {turn} — {_verify_words(data)}")
        case "no_change":
            _set_turn(lines, turn, None, suffix=", no change")
        case "test_requested":
            lines.append(_Line("asked the agent for a test"))
        case "pr_opened":
            lines.append(_Line(f"PR #{_int(data.get('pr'))} opened"))
        case "review_started":
            n = _int(data.get("round"))
            what = "final audit" if data.get("final_audit") else "review"
            lines.append(_Line(f"{what} round {n} — reviewing…", review=n))
        case "section_audit_started":  # milestones (bot/core/rules/loop/sections.py)
            lines.append(
                _Line(
                    f"section {_int(data.get('section'))} audit round {_int(data.get('round'))}"
                    " — auditing…"
                )
            )
        case "section_audited":
            n, outcome = _int(data.get("section")), f"— {_severities(data)}"
            if lines and lines[-1].text.startswith(f"section {n} audit"):
                lines[-1].text = lines[-1].text.replace(" — auditing…", " " + outcome)
            else:
                lines.append(_Line(f"section {n} audit {outcome}"))
        case "section_done":
            lines.append(
                _Line(f"section {_int(data.get('section'))} done: {_word(data.get('title'))}")
            )
        case "post_action":
            lines.append(_Line(f"post-action {_word(data.get('status'))}"))
        case "triage" if data.get("verdict") != "ready":  # the usual way needs no line
            lines.append(_Line(f"triage — {_word(data.get('verdict'))}"))
        case "triage_failed":
            lines.append(_Line("triage failed — coding anyway"))
        case "spec_accepted":
            what = "issue worked as one" if data.get("whole") else "spec accepted"
            lines.append(_Line(f"{what} by {_who(data.get('actor'))}"))
        case "split":
            lines.append(_Line(f"split into sub-issues by {_who(data.get('actor'))}"))
        case "metric_iteration":  # metric loops (bot/core/rules/loop/metric.py)
            lines.append(
                _Line(
                    f"iteration {_int(data.get('iteration'))} — {_word(data.get('status'))}"
                    + (f" ({_word(data.get('reason'))})" if data.get("reason") else "")
                )
            )
        case "reviewed":
            _set_review(lines, f"— {_severities(data)}")
        case "review_skipped":
            lines.append(_Line(f"head already reviewed ({_word(data.get('verdict'))})"))
        case "review_carried":
            lines.append(_Line("same change as the reviewed head: its approval carries"))
        case "back_to_coding":
            lines.append(_Line(f"back to coding ({_word(data.get('reason'))})"))
        case "hidden_text_removed":  # bot/core/text/visible.py
            lines.insert(max(len(lines) - 1, 0), _Line(hidden_words(data)))
        case "handoff":
            lines.append(_Line("handed over (worker shutting down)"))
        case "loop_resumed":
            lines.append(_Line(f"resumed ({_word(data.get('reason'))})"))
        case "loop_restarted":
            lines.append(_Line(f"restarted by {_who(data.get('actor'))}"))
        case "loop_cancelled":
            lines.append(_Line(f"cancelled by {_who(data.get('actor'))}"))
        case "shrink" | "context_shrunk":
            lines.append(_Line("context shrunk"))
        case "base_merged":
            lines.append(_Line("merged the base branch in"))
        case "merge_refused":
            lines.append(_Line(f"merge refused ({_word(data.get('reason'))})"))
        case "merged":
            lines.append(_Line(f"merged as {_short(data.get('sha'))}"))
        case "branch_kept":
            why = KEPT.get(str(data.get("cause")), "not deleted")
            lines.append(_Line(f"branch {_word(data.get('branch'))} kept: {why}"))
        case "loop_finished":
            _finished(lines, data)


def _set_turn(lines: list[_Line], turn: int | None, text: str | None, suffix: str = "") -> None:
    """Update the newest line of ``turn`` (a restart counts turns from 1 again)."""
    for line in reversed(lines):
        if line.turn is not None and line.turn == turn:
            if text is not None and line.label is not None:
                text = text.replace(f"turn {turn} ", f"turn {line.label} ", 1)
            line.text = (text or line.text) + suffix
            return
    if text is not None:
        lines.append(_Line(text + suffix, turn=turn))


def _set_review(lines: list[_Line], outcome: str) -> None:
    for line in reversed(lines):
        if line.review is not None:
            what = "final audit" if line.text.startswith("final audit") else "review"
            line.text = f"{what} round {line.review} {outcome}"
            return
    lines.append(_Line(f"review {outcome}"))


def _finished(lines: list[_Line], data: dict[str, Any]) -> None:
    status, reason = _word(data.get("status")), _word(data.get("reason"))
    if status == "completed" and lines and lines[-1].text.startswith("merged as"):
        return  # the merge line says it
    if status == "cancelled" and lines and lines[-1].text.startswith("cancelled"):
        return
    lines.append(_Line(f"{status} ({reason})" if reason else status))


def hidden_words(data: dict[str, Any]) -> str:
    """What was taken out of the issue before the agent saw it: what GitHub's page did
    not show the writer who approved it."""
    parts = []
    if n := _int(data.get("comments")):
        parts.append(f"{n} hidden comment{'s' if n != 1 else ''}")
    if n := _int(data.get("chars")):
        parts.append(f"{n} invisible character{'s' if n != 1 else ''}")
    return f"not sent to the agent: {' and '.join(parts) or 'hidden text'} in the issue"


def _verify_words(data: dict[str, Any]) -> str:
    if data.get("passed"):
        return "verify passed"
    if data.get("timed_out"):
        return "verify failed (timed out)"
    test = failing_test(_tail(data))
    # The test's name came from the repository: defused like any text loopbot posts.
    return f"verify failed ({safe_text(_clip(test, 60))})" if test else "verify failed"


def _word(value: Any) -> str:
    """A short value from an event, safe in a comment."""
    return safe_text(_clip(" ".join(str(value or "").split()), 40))


def _who(actor: Any) -> str:
    # No "@": the timeline names people without notifying them on every edit.
    return _word(str(actor or "someone").lstrip("@"))
