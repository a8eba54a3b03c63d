"""Milestones ("sections"): an issue worked in ordered parts, each audited before the next.

Pure: parsing the approved issue text into sections, and the decisions of a sectioned
loop (what follows a passing verify, what follows a section audit, where a restart
resumes). ``jobs/loop/job.py`` does the I/O; ``jobs/intake/plan.py`` proposes sections for an issue
that has none.

What counts as a section, read from the text a writer approved (never the live issue):

- ``Milestone`` headings (``## Milestone 1: parser``, any level from ``#`` to ``######``),
  two or more: each section is the heading and the text under it, up to the next heading
  of the same or a higher level. They take precedence over task lists.
- Otherwise top-level task-list items (``- [ ] …``, ``* [ ] …``, ``+ [ ] …`` at the start
  of a line), two or more: each item, with the indented lines under it, is a section.
  An item the writer ticked (``- [x]``) is a section already done: it is not worked on
  or audited on its own (the final audit still judges the whole issue against it).
- Anything inside a code fence (`````` or ``~~~``) is ignored: an example task list in a
  code block is not a plan.

Bounded: at most ``MAX_SECTIONS`` sections (the ones past it fold into the last, so no
text is lost), each section's text capped at ``MAX_SECTION_CHARS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bot.core.record import Reason, Status

MAX_SECTIONS = 12
MAX_SECTION_CHARS = 4000
MAX_TITLE_CHARS = 120

_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_MILESTONE = re.compile(r"^milestone\b", re.IGNORECASE)
_TASK = re.compile(r"^[-*+][ \t]+\[([ xX])\][ \t]+(\S.*)$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


@dataclass(frozen=True)
class Section:
    title: str
    text: str
    done: bool = False  # ticked by the writer in the issue: nothing left to do

    def as_record(self, start_sha: str = "") -> dict[str, Any]:
        """The record's entry (``LoopRecord.sections``)."""
        return {
            "title": self.title,
            "text": self.text,
            "done": self.done,
            "preticked": self.done,  # done by the writer, never audited on its own
            "audit_rounds": 0,
            "start_sha": start_sha,
        }


def _unfenced(lines: list[str]) -> list[bool]:
    """For each line, whether it is outside a code fence (fence lines count as inside)."""
    out: list[bool] = []
    fence = ""
    for line in lines:
        m = _FENCE.match(line)
        if fence:
            out.append(False)
            closing = m is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
            if closing and m is not None and not line.strip()[len(m.group(1)) :].strip():
                fence = ""
            continue
        if m:
            fence = m.group(1)
            out.append(False)
            continue
        out.append(True)
    return out


def _title(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= MAX_TITLE_CHARS else one[: MAX_TITLE_CHARS - 1] + "…"


def _capped(text: str) -> str:
    text = text.strip("\n")
    if len(text) <= MAX_SECTION_CHARS:
        return text
    return text[:MAX_SECTION_CHARS] + f"\n[… cut at {MAX_SECTION_CHARS:,} characters]"


def _milestones(lines: list[str], open_: list[bool]) -> list[Section]:
    heads: list[tuple[int, int, str]] = []  # (line index, level, heading text)
    all_heads: list[tuple[int, int]] = []
    for i, line in enumerate(lines):
        if not open_[i]:
            continue
        m = _HEADING.match(line)
        if m is None:
            continue
        level, text = len(m.group(1)), m.group(2).strip()
        all_heads.append((i, level))
        if _MILESTONE.match(text):
            heads.append((i, level, text))
    found = []
    for i, level, text in heads:
        end = next((j for j, lv in all_heads if j > i and lv <= level), len(lines))
        body = "\n".join(lines[i + 1 : end])
        found.append(Section(_title(text), _capped(f"{lines[i].strip()}\n{body}")))
    return found


def _tasks(lines: list[str], open_: list[bool]) -> list[Section]:
    found: list[Section] = []
    current: list[str] | None = None
    done = False
    title = ""

    def close() -> None:
        if current is not None:
            found.append(Section(_title(title), _capped("\n".join(current)), done))

    for i, line in enumerate(lines):
        m = _TASK.match(line) if open_[i] else None
        if m is not None:
            close()
            current, done, title = [line], m.group(1) in "xX", m.group(2)
            continue
        if current is None:
            continue
        if line.strip() and (line[:1] in (" ", "\t") or not open_[i]):
            current.append(line)  # the item's own indented lines (sub-items, details)
        elif not line.strip():
            current.append(line)
        else:
            close()
            current = None
    close()
    return found


def parse(body: str) -> list[Section]:
    """The sections of an approved issue body, or [] when it has fewer than two."""
    lines = (body or "").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    open_ = _unfenced(lines)
    for found in (_milestones(lines, open_), _tasks(lines, open_)):
        if len(found) >= 2:
            return _bounded(found)
    return []


def _bounded(found: list[Section]) -> list[Section]:
    if len(found) <= MAX_SECTIONS:
        return found
    keep, rest = found[: MAX_SECTIONS - 1], found[MAX_SECTIONS - 1 :]
    last = Section(
        _title(f"{rest[0].title} (and {len(rest) - 1} more)"),
        _capped("\n\n".join(s.text for s in rest)),
        all(s.done for s in rest),
    )
    return [*keep, last]


def from_plan(items: list[dict[str, Any]]) -> list[Section]:
    """Sections a planner proposed (``jobs/intake/plan.py``): titles and texts, bounded."""
    found = [
        Section(_title(str(i.get("title") or "")), _capped(str(i.get("text") or "")))
        for i in items
        if str(i.get("title") or "").strip()
    ]
    return _bounded(found) if len(found) >= 2 else []


_MILESTONE_PREFIX = re.compile(r"(?i)^\s*milestone\b[\s\d.:-]*")


def as_markdown(found: list[Section]) -> str:
    """Sections as ``## Milestone`` headings, the form ``parse`` reads back."""
    parts = []
    for n, s in enumerate(found, 1):
        # "Milestone 2: CLI" reads back as "CLI"; "2FA login" keeps its digit.
        title = _MILESTONE_PREFIX.sub("", s.title) or s.title
        parts.append(f"## Milestone {n}: {title}\n\n{s.text.strip()}")
    return "\n\n".join(parts)


# -- the state of a sectioned loop, as the record keeps it ---------------------------------------


def pending(sections: list[dict[str, Any]]) -> int:
    """How many sections are left to do."""
    return sum(1 for s in sections if not s.get("done"))


def current(sections: list[dict[str, Any]]) -> int | None:
    """The section to work on: the first not done (a restart resumes there), or None."""
    return next((i for i, s in enumerate(sections) if not s.get("done")), None)


def sectioned(sections: list[dict[str, Any]]) -> bool:
    """Whether the loop still works section by section (a section is left)."""
    return current(sections) is not None


def final(sections: list[dict[str, Any]]) -> bool:
    """Whether a sectioned loop has audited every section: its next review is the final
    audit, and its next coding turn a final-audit fix."""
    return bool(sections) and current(sections) is None


def carry_over(old: list[dict[str, Any]], new: list[Section]) -> list[dict[str, Any]]:
    """A writer edited the approved text: the new sections, keeping what was done for the
    leading sections that are word for word the same (and the audit rounds and start of
    the first one that changed nothing in), so a typo fix further down loses nothing."""
    out = []
    same = True
    # Where the work toward the first changed section began: its audit must see all of
    # it, not only what comes after the edit (nor an empty diff when the edit just ticks
    # a box the loop had ticked already).
    first_start = ""
    for i, s in enumerate(new):
        entry = s.as_record()
        if same and i < len(old) and (old[i].get("title"), old[i].get("text")) == (s.title, s.text):
            entry = dict(old[i])
        else:
            if same:
                first_start = next((str(o["start_sha"]) for o in old[i:] if o.get("start_sha")), "")
                entry["start_sha"] = first_start
            same = False
        out.append(entry)
    return out


@dataclass(frozen=True)
class Audit:
    """Verify passed on a section: audit it before going on."""

    index: int


@dataclass(frozen=True)
class OpenPull:
    """No section is left to audit: open (or update) the pull request."""


def after_verified(sections: list[dict[str, Any]]) -> Audit | OpenPull:
    index = current(sections)
    return OpenPull() if index is None else Audit(index)


@dataclass(frozen=True)
class Recode:
    """A sev1 in the section audit: back to coding on the same section."""

    index: int
    rounds: int  # audits of this section so far, this one included


@dataclass(frozen=True)
class NextSection:
    """The section is clean: tick it and go on to ``index``."""

    done: int
    index: int


@dataclass(frozen=True)
class AllSections:
    """The last section is clean: on to the pull request and the final audit."""

    done: int


@dataclass(frozen=True)
class StopLoop:
    status: Status
    reason: Reason
    detail: str


AfterAudit = Recode | NextSection | AllSections | StopLoop


def after_audit(
    sections: list[dict[str, Any]],
    index: int,
    *,
    verdict: str,
    sev1: int,
    max_rounds: int,
    repeated: tuple[str, str, int] | None = None,
) -> AfterAudit:
    """What follows the audit of section ``index`` (its ``audit_rounds`` not yet counted),
    with ``sev1`` blocking findings standing after it (the finding log's, dismissals
    left out): the critic's rules (``bot.core.rules.pull.review.plan_after_review``) on one
    section. A sev1 sends it back to coding, up to ``max_rounds`` audits (since a person
    last restarted the loop: ``round_base``), then a person decides; so does a sev1
    raised in ``REPEAT_LIMIT`` audits (``repeated``: its title, path and count) and a
    verdict that requests changes without any sev1; an audit that failed (``verdict``
    error) stops the loop; clean goes on."""
    rounds = int(sections[index].get("audit_rounds") or 0) + 1
    used = rounds - int(sections[index].get("round_base") or 0)
    title = sections[index].get("title", "")
    where = f"section {index + 1} of {len(sections)} ({title})"
    if verdict == "error":
        return StopLoop(
            Status.FAILED,
            Reason.CRITIC_ERROR,
            f"the audit of section {index + 1} ({title}) failed: its answer did not validate",
        )
    if sev1 and repeated is not None:
        what, path, count = repeated
        return StopLoop(
            Status.REFUSED,
            Reason.NEEDS_HUMAN,
            f"the same sev1 finding was raised in {count} audits of {where} and the agent "
            f"has not fixed it: {what} (`{path}`)",
        )
    if sev1:
        if used >= max_rounds:
            return StopLoop(
                Status.REFUSED,
                Reason.NEEDS_HUMAN,
                f"{where} still has {sev1} sev1 finding(s) after {used} audit(s) "
                f"(`critic.max_rounds` {max_rounds}): a person should look at it",
            )
        return Recode(index, rounds)
    if verdict == "request_changes":
        # Changes requested without a sev1: not blocking by definition, not an approval.
        return StopLoop(
            Status.REFUSED,
            Reason.NEEDS_HUMAN,
            f"the audit of {where} requested changes without a blocking finding",
        )
    return passed(sections, index)


def passed(sections: list[dict[str, Any]], index: int) -> NextSection | AllSections:
    """Section ``index`` is through: on to the next section not done, or the last one was."""
    later = next((i for i in range(index + 1, len(sections)) if not sections[i].get("done")), None)
    return AllSections(index) if later is None else NextSection(index, later)


def resume(
    sections: list[dict[str, Any]], *, head: str, verified: bool, sev1_open: int
) -> Audit | NextSection | AllSections | None:
    """Before a resumed loop's first turn (a killed worker, an audit that failed, a
    writer's dismissal, a restart): ``head`` is the worktree's head, ``verified`` whether
    verify passed on it, ``sev1_open`` the current section's sev1 findings still open.

    A verified head its section's audit has not judged is audited before any coding
    (the turn that verified it is done; coding on would leave it unaudited). A head the
    audit judged blocking whose sev1 findings writers have all dismissed since is
    through: the writers overrode the audit on this very commit. Otherwise None: code."""
    index = current(sections)
    if index is None or not verified:
        return None
    sec = sections[index]
    if sec.get("start_sha") == head:
        return None  # no work on this section yet: what verify passed on was the last one's
    if sec.get("audited_sha") != head:
        return Audit(index)
    if sec.get("dirty_sha") == head and sec.get("dirty_sev1") and not sev1_open:
        return passed(sections, index)
    return None


def tick(sections: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """``sections`` with ``index`` done and its audit counted."""
    out = [dict(s) for s in sections]
    out[index]["done"] = True
    out[index]["audit_rounds"] = int(out[index].get("audit_rounds") or 0) + 1
    return out


def count_round(sections: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    out = [dict(s) for s in sections]
    out[index]["audit_rounds"] = int(out[index].get("audit_rounds") or 0) + 1
    return out


def restarted(sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``sections`` as a person's restart leaves them: each section not done gets
    ``critic.max_rounds`` audits again (as the critic gets its rounds back), and its next
    audit is asked even on the head whose findings stood (the person chose to go on)."""
    out = [dict(s) for s in sections]
    for s in out:
        if not s.get("done"):
            s["round_base"] = int(s.get("audit_rounds") or 0)
            s.pop("dirty_sha", None)
    return out


def started(sections: list[dict[str, Any]], index: int, sha: str) -> list[dict[str, Any]]:
    """``sections`` with ``index`` starting at ``sha`` (kept if it started already: a
    restart resumes the section, and its audit still covers all of its work)."""
    out = [dict(s) for s in sections]
    if not out[index].get("start_sha"):
        out[index]["start_sha"] = sha
    return out


def label(sections: list[dict[str, Any]], index: int) -> str:
    """``section 2/3``, as the dashboard's phase shows it."""
    return f"section {index + 1}/{len(sections)}"
