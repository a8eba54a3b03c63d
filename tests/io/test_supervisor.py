"""The supervisor of ``loopbot worker --loops N`` (``bot/ops/supervisor.py``) with plain
children, in a process of its own: a stop is passed on once to every child, also when it
comes during start-up or twice; burst mode ends when the children do; the restart delay.
The slots as real RQ workers running loops: tests/e2e/test_worker_loops.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bot.ops.supervisor import FIRST_DELAY, HEALTHY_AFTER, MAX_DELAY, restart_delay
from tests.helpers import ROOT

SCRIPT = """
import os, signal, sys, time, functools
from pathlib import Path
from bot.ops.supervisor import Child, Supervisor

out = Path(sys.argv[1])
n = int(sys.argv[2])
restart = sys.argv[3] == "restart"
kill_parent_first = sys.argv[4] == "yes"
signal_in_log = len(sys.argv) > 5 and sys.argv[5] == "signal-in-log"

if signal_in_log:
    # The stop lands while the supervisor is writing a log line (holding the logger's
    # lock): delivered to itself from inside the write.
    import structlog

    class Stderr:
        sent = False

        def write(self, text):
            if "supervisor.started" in text and not Stderr.sent:
                Stderr.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
            sys.stderr.write(text)

        def flush(self):
            sys.stderr.flush()

    structlog.configure(logger_factory=structlog.WriteLoggerFactory(Stderr()))

def child(i):
    told = []
    def on_term(s, f):
        told.append(1)
        (out / f"c{i}").open("a").write("TERM\\n")

    signal.signal(signal.SIGTERM, on_term)
    (out / f"started-{i}").write_text(str(os.getpid()))
    if i == 0 and kill_parent_first:
        os.kill(os.getppid(), signal.SIGTERM)  # a stop while the others are still starting
    deadline = time.monotonic() + (30 if restart else 0.3)
    while time.monotonic() < deadline and not told:
        time.sleep(0.02)
    time.sleep(1.5 if told else 0)  # room for a second signal, which must not come
    sys.exit(0)

children = [Child(f"c{i}", functools.partial(child, i)) for i in range(n)]
print("ready", flush=True)
sys.exit(Supervisor(children, restart=restart).run())
"""


def run(
    tmp_path: Path, n: int, restart: bool, kill_first: bool, *extra: str
) -> subprocess.Popen[str]:
    script = tmp_path / "sup.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(tmp_path),
            str(n),
            "restart" if restart else "burst",
            "yes" if kill_first else "no",
            *extra,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def told(tmp_path: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().splitlines()) for p in tmp_path.glob("c*") if p.is_file()}


def test_a_stop_during_start_up_reaches_every_started_child_once(tmp_path: Path) -> None:
    proc = run(tmp_path, 12, restart=True, kill_first=True)
    assert proc.wait(30) == 0, proc.stdout.read() if proc.stdout else ""
    pids = [int(p.read_text()) for p in tmp_path.glob("started-*")]
    # Every child started was stopped (a child told before it set its handler dies of
    # it, which is a clean stop too), none twice, and none is left running.
    assert pids and all(not Path(f"/proc/{pid}").exists() for pid in pids)
    assert set(told(tmp_path).values()) <= {1}, told(tmp_path)


def test_a_stop_that_lands_while_a_log_line_is_written_still_stops(tmp_path: Path) -> None:
    # The handler used to log and poll the children itself: landing inside a log write,
    # it waited for the logger's lock its own thread held, and the supervisor hung
    # (CI saw it as the test above timing out).
    proc = run(tmp_path, 3, True, False, "signal-in-log")
    try:
        code = proc.wait(20)
    finally:
        proc.kill()
    out = proc.stdout.read() if proc.stdout else ""
    assert code == 0, out
    assert "supervisor.stopping" in out
    assert set(told(tmp_path).values()) <= {1}, told(tmp_path)


def test_a_second_signal_is_not_passed_on(tmp_path: Path) -> None:
    proc = run(tmp_path, 3, restart=True, kill_first=False)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(list(tmp_path.glob("started-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)  # an impatient operator
    assert proc.wait(30) == 0
    assert told(tmp_path) == {"c0": 1, "c1": 1, "c2": 1}
    assert "already_stopping" in (proc.stdout.read() or "")


def test_burst_mode_ends_when_the_children_do(tmp_path: Path) -> None:
    proc = run(tmp_path, 3, restart=False, kill_first=False)
    assert proc.wait(30) == 0
    assert len(list(tmp_path.glob("started-*"))) == 3
    assert told(tmp_path) == {}  # nobody was stopped: they finished


def test_the_restart_delay_doubles_while_a_child_dies_young() -> None:
    assert restart_delay(0.0, 0.5) == FIRST_DELAY
    assert restart_delay(FIRST_DELAY, 0.5) == 2 * FIRST_DELAY
    assert restart_delay(40.0, 0.5) == MAX_DELAY
    assert restart_delay(MAX_DELAY, HEALTHY_AFTER) == 0.0  # it lived: start again at once
