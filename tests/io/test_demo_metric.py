"""``loopbot demo --story metric``: a metric loop keeps one change and discards two,
offline, in well under a minute (the default story is tests/io/test_operator.py's)."""

from __future__ import annotations

import time

from tests.io.test_operator import cli


def test_demo_metric_story_keeps_one_change_and_discards_two() -> None:
    started = time.monotonic()
    out = cli("demo", "--story", "metric", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert time.monotonic() - started < 60
    text = out.stdout
    for step in [
        "added the label loop:optimize",
        "phase 0 on the base: metric 8",
        "iteration 1: keep (metric 5)",
        "iteration 2: discard (metric 6, worse)",
        "iteration 3: discard (metric 2, guard failed (exit 1))",
        "1 kept of 3; loop-results.tsv committed",
        "critic verdict: approve",
        "loop completed: merged",
        "non-blank lines of src/report.py: 8 -> 5",
        "iteration  commit",
        "Remove the unused helper",
    ]:
        assert step in text, (step, text)
