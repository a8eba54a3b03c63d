"""Every benchmark runs once, small, so that none can silently break.

The figures they print here mean nothing (tiny inputs on a busy CI machine); the README's
figures come from full runs. What this checks is that each script still runs to the end
against the current code and prints its result line.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SMOKE = [
    ("loop_overhead.py", ["--turns", "3"], "orchestration overhead per turn"),
    ("first_request.py", ["--rounds", "2"], "ms"),
    ("scale.py", ["--loops", "50"], "ms"),
    ("worktree.py", ["--files", "1000", "--commits", "20", "--rounds", "1"], "ms"),
    ("webhook.py", ["--seconds", "1", "--rate", "50"], "req/s"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "expect"), SMOKE, ids=[s[0] for s in SMOKE])
def test_benchmark_runs_in_smoke_mode(script: str, args: list[str], expect: str) -> None:
    if script == "webhook.py" and shutil.which("wrk") is None:
        pytest.fail("wrk is missing: ./scripts/setup --dev installs it")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert expect in proc.stdout, proc.stdout[-3000:]
