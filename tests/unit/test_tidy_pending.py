"""When a merged loop's tidy-up is unfinished (``bot.core.record.tidy_pending``): the
gate's retry and the reconciler finish it; a loop that is not merged, or whose tidy-up
is done, or from before the merged head was kept, is left alone. Pure."""

from __future__ import annotations

import pytest

from bot.core.record import LoopRecord, Reason, Status, summarize, tidy_pending


def merged(**fields: object) -> LoopRecord:
    base: dict[str, object] = {
        "repo": "acme/w",
        "issue": 1,
        "installation_id": 1,
        "status": Status.COMPLETED,
        "reason": Reason.MERGED,
        "pr_number": 2,
        "merge_sha": "m" * 40,
    }
    return LoopRecord.model_validate(base | fields)


@pytest.mark.parametrize(
    ("fields", "pending"),
    [
        ({"receipt_text": "held"}, True),  # the receipt's post failed
        ({"merged_head": "h" * 40}, True),  # the branch not tried yet (a queue's merge)
        ({"merged_head": "h" * 40, "branch_tidied": True}, False),  # all done
        ({"merged_head": "h" * 40, "branch_tidied": True, "receipt_text": "held"}, True),
        ({}, False),  # merged before the head was kept: nothing known to do
        ({"merged_head": "h" * 40, "pr_number": None}, False),
        ({"merged_head": "h" * 40, "status": Status.FAILED, "reason": Reason.GATE_ERROR}, False),
    ],
)
def test_tidy_pending(fields: dict[str, object], pending: bool) -> None:
    record = merged(**fields)
    assert tidy_pending(record) is pending
    assert summarize(record)["tidy_pending"] is pending  # what the reconciler reads
