"""Every benchmark runs once, small, so that none can silently break.

Each script in bench/ runs with ``--smoke`` (bench/_smoke.py: tiny inputs, durations of a
second, no target checked) in a subprocess with this venv's python. The figures it prints
mean nothing here (tiny inputs on a busy CI machine); the README's figures come from full
runs. What this checks is that each script still runs to the end against the current
code, exits 0 and prints its figures. The whole set takes about 40 s on a 2-core machine.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT

BENCH = ROOT / "bench"

# script -> a line of figures that a finished run prints (a number where the figure is).
NUM = r"[\d,]+(\.\d+)?"
SMOKE = {
    "loop_overhead.py": rf"median {NUM} ms\s+p90 {NUM} ms\s+max {NUM} ms",
    "loop_overhead.py --backend claude-code": rf"first model request \(claude-code\): median {NUM}",
    "loop_overhead.py --backend opencode": rf"first model request \(opencode\): median {NUM}",
    "loop_overhead.py --backend codex": rf"first model request \(codex\): median {NUM}",
    "first_request.py": rf"median {NUM} ms\s+max {NUM} ms",
    "scale.py": rf"/metrics scrape\s+{NUM}",
    "worktree.py": rf"loopbot, recycled spare\s+{NUM} ms",
    "webhook.py": rf"loopbot\s+{NUM}\s+{NUM}\s+{NUM}\n",
    "tokens.py": rf"cache share\s+{NUM}% on steps 2\+",
    "fleet.py": rf"merged {NUM}/{NUM}\n  time per loop .* p90 {NUM} s",
    "setup_cache.py": rf"second loop \(the first's cache\)\s+{NUM} s\s+\(0 downloads\)",
    "chaos.py": rf"chaos merged {NUM}/{NUM} .*\n(.*\n)*invariants: all held",
}

# Modules in bench/ that are not scripts, and the smoke runs that exercise them.
HELPERS = {
    "__init__.py": [],
    "_smoke.py": list(SMOKE),  # the --smoke option itself
    # servers, a runtime
    "_env.py": ["loop_overhead.py", "first_request.py", "tokens.py", "fleet.py", "chaos.py"],
    "bare_app.py": ["webhook.py"],  # the comparison apps, under gunicorn and in-process
}


def test_every_benchmark_has_a_smoke_run() -> None:
    """A new script in bench/ must be added to SMOKE (or to HELPERS, with its users)."""
    assert {p.name for p in BENCH.glob("*.py")} == {s.split()[0] for s in SMOKE} | set(HELPERS)


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SMOKE))
def test_benchmark_runs_in_smoke_mode(script: str) -> None:
    if script == "webhook.py" and shutil.which("wrk") is None:
        pytest.fail("wrk is missing: ./scripts/setup --dev installs it")
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script.split()[0]), *script.split()[1:], "--smoke"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The chaos soak starts a whole deployment (Sentinel, two webs, two workers) and
    # waits out its faults' recovery: about 80 s alone, more on a loaded machine.
    try:
        out, err = proc.communicate(timeout=480 if script == "chaos.py" else 120)
    except subprocess.TimeoutExpired:
        # SIGTERM first: a script stops what it started (a SIGKILL would leave it running).
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"{script} --smoke timed out: " + out[-3000:] + err[-3000:])
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert re.search(SMOKE[script], out), out[-3000:]
