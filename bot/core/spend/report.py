"""What loops cost, per repository and in total: the figures ``loopbot report`` prints and
the dashboard's spend page shows. Pure: loop records in, figures out.

A loop counts in the window when it was labelled (its record created) within it; its
figures are its whole life's (every turn, review and restart). Dollars and tokens are the
record's usage, as each call was charged (``bot.core.pricing``): the agent's calls under
the loop's backend, loopbot's own (critic, triage, planner) under ``builtin``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bot.core.record import ACTIVE, LoopRecord, Reason, Status

TOTAL = "(total)"
OUTCOMES = ("started", "merged", "refused", "failed", "cancelled", "unmerged_done", "active")
TOKEN_KINDS = ("input", "output", "cache_read", "cache_write")


def outcome(record: LoopRecord) -> str:
    """Which of ``OUTCOMES`` (besides "started") a loop ended with."""
    if record.status in ACTIVE:
        return "active"
    if record.status is Status.COMPLETED:
        return "merged" if record.reason == Reason.MERGED.value else "unmerged_done"
    if record.status is Status.REFUSED:
        return "refused"
    if record.status is Status.CANCELLED:
        return "cancelled"
    return "failed"  # failed, stalled


def backend_of(record: LoopRecord, role: str) -> str:
    """The backend a call of ``role`` went through: the agent's calls through the loop's,
    loopbot's own calls through its built-in client."""
    return (record.backend or "builtin") if role == "agent" else "builtin"


@dataclass
class Spend:
    usd: float = 0.0
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    calls: int = 0

    @property
    def tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write


@dataclass
class Figures:
    """One repository's figures, or the total's."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    spend: Spend = field(default_factory=Spend)
    by_model: dict[tuple[str, str], Spend] = field(default_factory=dict)  # (backend, model)
    merged_cost: list[float] = field(default_factory=list)
    merged_turns: list[int] = field(default_factory=list)
    merge_hours: list[float] = field(default_factory=list)  # label to merge
    critic_rounds: int = 0
    unmerged_usd: float = 0.0  # spent on loops that ended without a merge

    def add(self, record: LoopRecord) -> None:
        ended = outcome(record)
        self.counts["started"] += 1
        self.counts[ended] += 1
        self.critic_rounds += record.critic_round
        for slot, used in record.usage.items():
            model, _, role = slot.rpartition("/")
            key = (backend_of(record, role), model)
            for target in (self.spend, self.by_model.setdefault(key, Spend())):
                target.usd += used.cost_usd
                target.input += used.input_tokens
                target.output += used.output_tokens
                target.cache_read += used.cache_read_tokens
                target.cache_write += used.cache_write_tokens
                target.calls += used.messages
        if ended == "merged":
            self.merged_cost.append(record.cost_usd)
            self.merged_turns.append(record.total_turns)
            self.merge_hours.append(max(0.0, record.updated_at - record.created_at) / 3600)
        elif ended != "active":
            self.unmerged_usd += record.cost_usd

    def row(self) -> dict[str, Any]:
        """The figures as one flat row (the CSV's, the JSON's)."""
        return {
            **{f"loops_{k}": v for k, v in self.counts.items()},
            "usd": round(self.spend.usd, 6),
            **{f"{k}_tokens": getattr(self.spend, k) for k in TOKEN_KINDS},
            "calls": self.spend.calls,
            "merged_usd_median": _r(percentile(self.merged_cost, 50)),
            "merged_usd_p90": _r(percentile(self.merged_cost, 90)),
            "merged_turns_median": _r(percentile(self.merged_turns, 50)),
            "merged_turns_p90": _r(percentile(self.merged_turns, 90)),
            "label_to_merge_hours_median": _r(percentile(self.merge_hours, 50)),
            "label_to_merge_hours_p90": _r(percentile(self.merge_hours, 90)),
            "critic_rounds": self.critic_rounds,
            "unmerged_usd": round(self.unmerged_usd, 6),
            "unmerged_share": _r(self.unmerged_usd / self.spend.usd if self.spend.usd else None),
        }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile (the smallest value with ``p`` percent at or below
    it); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass
class Report:
    since: float  # epoch seconds: loops labelled from then on
    repos: dict[str, Figures]  # by repository, and ``TOTAL``

    def to_json(self) -> str:
        out = {
            "since": self.since,
            "repos": {
                repo: {
                    **f.row(),
                    "by_model": [
                        {"backend": b, "model": m, **asdict(s)}
                        for (b, m), s in sorted(f.by_model.items())
                    ],
                }
                for repo, f in self.repos.items()
            },
        }
        return json.dumps(out, indent=2)

    def to_csv(self) -> str:
        """One row per repository (``kind`` "repo", the total last), then one per
        repository, backend and model (``kind`` "model")."""
        buf = io.StringIO()
        head = ["kind", "repo", "backend", "model", *Figures().row().keys()]
        writer = csv.DictWriter(buf, fieldnames=head, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for repo, f in self.repos.items():
            writer.writerow({"kind": "repo", "repo": repo, "backend": "", "model": "", **f.row()})
        for repo, f in self.repos.items():
            for (b, m), s in sorted(f.by_model.items()):
                row = {
                    "kind": "model",
                    "repo": repo,
                    "backend": b,
                    "model": m,
                    "usd": round(s.usd, 6),
                    "calls": s.calls,
                    **{f"{k}_tokens": getattr(s, k) for k in TOKEN_KINDS},
                }
                writer.writerow(row)
        return buf.getvalue()

    def to_table(self) -> str:
        lines = []
        for repo, f in self.repos.items():
            row = f.row()
            c = f.counts
            lines.append(f"{repo}")
            lines.append(
                f"  loops: {c['started']} started · {c['merged']} merged · {c['refused']} "
                f"refused · {c['failed']} failed · {c['cancelled']} cancelled · "
                f"{c['unmerged_done']} done unmerged · {c['active']} active"
            )
            lines.append(
                f"  spend: ${f.spend.usd:.2f} · tokens {f.spend.tokens:,} (input "
                f"{f.spend.input:,}, output {f.spend.output:,}, cache read "
                f"{f.spend.cache_read:,}, cache write {f.spend.cache_write:,})"
            )
            for (b, m), s in sorted(f.by_model.items()):
                lines.append(
                    f"    {b} · {m}: ${s.usd:.2f} · {s.calls} calls · in {s.input:,} · out "
                    f"{s.output:,} · cache read {s.cache_read:,} · cache write {s.cache_write:,}"
                )
            lines.append(
                "  per merged PR: cost median "
                f"{_usd(row['merged_usd_median'])} p90 {_usd(row['merged_usd_p90'])} · turns "
                f"median {_n(row['merged_turns_median'])} p90 {_n(row['merged_turns_p90'])} · "
                f"label to merge median {_h(row['label_to_merge_hours_median'])} p90 "
                f"{_h(row['label_to_merge_hours_p90'])}"
            )
            share = row["unmerged_share"]
            lines.append(
                f"  critic rounds: {f.critic_rounds} · spent on loops that did not merge: "
                f"${f.unmerged_usd:.2f}" + (f" ({share:.0%})" if share is not None else "")
            )
        return "\n".join(lines)


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:.2f}"


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"


def _h(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} h"


def report(records: Iterable[LoopRecord], since: float, repo: str | None = None) -> Report:
    """The figures of loops labelled at or after ``since`` (of ``repo`` alone, if given),
    per repository (sorted) and in total."""
    repos: dict[str, Figures] = {}
    total = Figures()
    for r in sorted(records, key=lambda r: (r.repo, r.issue)):
        if r.created_at < since or (repo is not None and r.repo != repo):
            continue
        repos.setdefault(r.repo, Figures()).add(r)
        total.add(r)
    return Report(since, {**repos, TOTAL: total})


def parse_since(text: str) -> float:
    """``7d``, ``12h``, ``30m`` (or plain seconds) as seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    text = text.strip().lower()
    try:
        unit = units.get(text[-1:], 0)
        value = float(text[:-1]) * unit if unit else float(text)
    except ValueError:
        raise ValueError(f"expected a duration like 7d, 12h or 30m, got {text!r}") from None
    if value <= 0 or math.isinf(value) or math.isnan(value):
        raise ValueError(f"expected a positive duration, got {text!r}")
    return value
