"""Findings that persist across review rounds: pure functions over ``record.finding_log``.

One log for the critic's rounds and a sectioned loop's section audits (an audit's
findings carry ``section``, the section's index; its rounds are named ``S2.1``: section 2,
audit 1). Every finding gets an id (``F1``, ``F2``...) and a fingerprint (path, category and the
title with case and punctuation folded). Each round the critic answers, for every open
finding it was shown, whether it is resolved; a finding it raises again (same
fingerprint) is the same finding and keeps its id, reopening it if it was resolved. A
finding a writer dismissed stays dismissed, however often the critic raises it again:
the writer's word is what a person said, the critic's repetition is not new evidence.

No I/O: the critic job (``jobs.review.critic``) and ``/loop-dismiss`` (``jobs.dispatch``) read
the record, call these, and write the result back.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Entry = dict[str, Any]
AnswerStatus = Literal["resolved", "open"]
# A review round: the critic's count (1, 2...), or a section audit's name ("S2.1").
Round = int | str

OPEN, RESOLVED, DISMISSED = "open", "resolved", "dismissed"
_ID = re.compile(r"^F[1-9][0-9]*$")


class Raised(Protocol):
    """A finding as the critic reports it (``bot.core.rules.pull.review.Finding`` is one)."""

    @property
    def severity(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def line(self) -> int | None: ...
    @property
    def title(self) -> str: ...
    @property
    def body(self) -> str: ...


def fingerprint(path: str, category: str, title: str) -> str:
    """The same problem across rounds. Reworded titles do not match: then it counts as a
    new finding, and the critic was still asked about the old one by id."""
    return f"{path}|{category}|{fold(title)}"


def fold(title: str) -> str:
    """A title with case and punctuation folded away."""
    return re.sub(r"[^a-z0-9]+", " ", title.lower()).strip()


def is_id(text: str) -> bool:
    return bool(_ID.match(text))


@dataclass(frozen=True)
class RoundResult:
    """The log after one round, and what the round did, by finding id."""

    log: list[Entry]
    next_id: int
    new: list[str]
    recurring: list[str]  # resolved before, raised again: open again
    still_open: list[str]  # open before, and still open (by answer or raised again)
    resolved: list[str]
    dismissed: list[str]  # dismissed by a writer before, raised again: stays dismissed

    def entry(self, fid: str) -> Entry:
        return next(e for e in self.log if e["id"] == fid)


def open_entries(log: Sequence[Entry]) -> list[Entry]:
    return [e for e in log if e.get("status") == OPEN]


def of_section(log: Sequence[Entry], index: int) -> list[Entry]:
    """The open findings a section's audits raised (the next audit answers for them)."""
    return [e for e in open_entries(log) if e.get("section") == index]


def blocking(log: Sequence[Entry]) -> list[Entry]:
    """What stands in the way of a merge: open sev1 findings (dismissed ones do not)."""
    return [e for e in open_entries(log) if e.get("severity") == "sev1"]


def merge_round(
    log: Sequence[Entry],
    next_id: int,
    raised: Sequence[Raised],
    answers: Mapping[str, tuple[AnswerStatus, str]],
    *,
    round_: Round,
    sha: str,
    section: int | None = None,
) -> RoundResult:
    """Fold one round into ``log``: ``answers`` (id -> status, why) for the open findings
    the critic was shown, ``raised`` the findings it reported this round. ``section``:
    the round is that section's audit (its new findings say so).

    A finding raised again wins over an answer that called it resolved in the same round:
    of two contradictory statements, the one that blocks is kept.
    """
    out = copy.deepcopy(list(log))
    before = {e["id"]: e.get("status") for e in out}
    by_fp = {e["fingerprint"]: e for e in out}
    seen: set[str] = set()  # ids open and counted in this round
    new: list[str] = []
    recurring: list[str] = []
    dismissed: list[str] = []
    nid = next_id
    for entry in out:
        answer = answers.get(entry["id"])
        if entry.get("status") != OPEN or answer is None:
            continue
        status, why = answer
        entry["why"] = why
        if status == RESOLVED:
            entry.update(status=RESOLVED, resolved_round=round_, resolved_sha=sha)
        else:
            _seen(entry, round_, sha, seen)
    for f in raised:
        fp = fingerprint(f.path, f.category, f.title)
        known = by_fp.get(fp)
        if known is None:
            created = by_fp[fp] = _new(f"F{nid}", fp, f, round_, sha)
            if section is not None:
                created["section"] = section
            nid += 1
            out.append(created)
            new.append(created["id"])
            seen.add(created["id"])
            continue
        if known["status"] == DISMISSED and _rank(f.severity) <= _rank(known["severity"]):
            # A writer dismissed it at this severity or a worse one: it stays dismissed.
            # Raised again as more severe, it is a new judgement and reopens (below): a
            # dismissed nit must not silence a later sev1 with the same fingerprint.
            _seen(known, round_, sha, seen)
            if known["id"] not in dismissed:
                dismissed.append(known["id"])
            continue
        if section is not None:
            known["section"] = section  # raised in this section's audit: it answers for it
        known.update(
            status=OPEN,
            severity=f.severity,
            line=f.line,
            title=f.title,
            body=f.body,
            resolved_round=None,
            resolved_sha=None,
        )
        _seen(known, round_, sha, seen)
        if before.get(known["id"]) == RESOLVED and known["id"] not in recurring:
            recurring.append(known["id"])
    still_open = [
        e["id"]
        for e in out
        if e["status"] == OPEN and e["id"] in seen and e["id"] not in new + recurring
    ]
    resolved = [
        e["id"]
        for e in out
        if e["status"] == RESOLVED and before.get(e["id"]) == OPEN and e["resolved_round"] == round_
    ]
    return RoundResult(out, nid, new, recurring, still_open, resolved, dismissed)


def dismiss(
    log: Sequence[Entry], fid: str, *, by: str, reason: str, sha: str, at: float
) -> list[Entry]:
    """``log`` with finding ``fid`` dismissed by a writer. Raises ``ValueError`` with a
    sentence for the reply when there is no such open finding or no reason."""
    if not reason.strip():
        raise ValueError(f"a reason is required: `/loop-dismiss {fid} <why it does not apply>`")
    out = copy.deepcopy(list(log))
    entry = next((e for e in out if e["id"] == fid), None)
    if entry is None:
        known = ", ".join(e["id"] for e in open_entries(out)) or "none"
        raise ValueError(f"there is no finding {fid} (open findings: {known})")
    if entry["status"] != OPEN:
        raise ValueError(f"finding {fid} is already {entry['status']}")
    entry.update(
        status=DISMISSED,
        dismissed_by=by,
        dismissed_reason=reason.strip(),
        dismissed_at=at,
        dismissed_sha=sha,
    )
    return out


def _seen(entry: Entry, round_: Round, sha: str, seen: set[str]) -> None:
    """Count ``entry`` as raised (or kept open) in this round, once per round."""
    if entry["id"] not in seen and entry.get("last_round") != round_:
        entry["rounds"] = int(entry.get("rounds", 1)) + 1
    entry.update(last_round=round_, last_sha=sha)
    seen.add(entry["id"])


def _rank(severity: str) -> int:
    """sev1 = 3 (most severe) … sev3 = 1."""
    return {"sev1": 3, "sev2": 2, "sev3": 1}.get(severity, 3)


def _new(fid: str, fp: str, f: Raised, round_: Round, sha: str) -> Entry:
    return {
        "id": fid,
        "fingerprint": fp,
        "severity": f.severity,
        "category": f.category,
        "path": f.path,
        "line": f.line,
        "title": f.title,
        "body": f.body,
        "status": OPEN,
        "first_round": round_,
        "last_round": round_,
        "first_sha": sha,
        "last_sha": sha,
        "rounds": 1,
        "resolved_round": None,
        "resolved_sha": None,
        "why": "",
        "dismissed_by": "",
        "dismissed_reason": "",
    }
