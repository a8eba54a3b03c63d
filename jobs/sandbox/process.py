"""A sandbox command's process, seen from the worker: its output through a pipe (a bounded
head and tail), the deadline and checks that kill its group, its orphans reaped. Blind to
what the command runs in."""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

WATCH_INTERVAL = 1.0  # seconds between disk checks while a command runs

# -- orphans: bwrap's processes whose parent exits first ---------------------------------

_PR_SET_CHILD_SUBREAPER = 36
_subreaper_pid = 0


def become_subreaper() -> None:
    """Make this process the reaper of its descendants' orphans. A sandbox command's
    bwrap processes can outlive their parent by an instant; without this they are
    reparented to PID 1, which in a container may be a worker that never reaps them, and
    pile up as zombies. Here they come back to us and ``reap_orphans`` collects them."""
    global _subreaper_pid
    if _subreaper_pid == os.getpid():
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            _subreaper_pid = os.getpid()


def reap_orphans() -> int:
    """Reap this process's zombie children that are orphaned sandbox processes (named
    ``bwrap``). A child that a ``Popen`` still waits for is never one of them: sandbox
    commands run one at a time on the thread that calls this, after its own wait."""
    reaped = 0
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            name = fields[fields.find("(") + 1 : fields.rfind(")")]
            state = fields[fields.rfind(")") + 2 :].split(" ", 1)[0]
            if state == "Z" and name == "bwrap":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(pid), os.WNOHANG)
                    reaped += 1
    return reaped


# -- output and the deadline -------------------------------------------------------------


class HeadTail:
    """The first quarter and the last three quarters of a stream, never more in memory."""

    def __init__(self, limit: int) -> None:
        self.head_max = limit // 4
        self.tail_max = limit - self.head_max
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_max:  # trim in batches, not per chunk
                del self.tail[: len(self.tail) - self.tail_max]

    @property
    def truncated(self) -> bool:
        return self.total > self.head_max + self.tail_max

    def text(self) -> str:
        if len(self.tail) > self.tail_max:
            del self.tail[: len(self.tail) - self.tail_max]
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if not self.truncated:
            return head + tail
        skipped = self.total - len(self.head) - len(self.tail)
        return head + f"\n[... {skipped} bytes of output omitted ...]\n" + tail


def pump(
    proc: subprocess.Popen[bytes],
    out: HeadTail,
    deadline: float,
    watch: Callable[[], str | None] = lambda: None,
    on_output: Callable[[bytes], object] | None = None,
) -> tuple[bool, str | None]:
    """Read the command's output until it ends or the deadline, asking ``watch`` about
    once a second whether a limit is exceeded (it then kills the command), and at once
    when ``on_output`` returns true (it saw what may cross a limit).

    Returns (timed out, the limit it exceeded).
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    timed_out, over = False, None
    next_watch, interval = time.monotonic() + WATCH_INTERVAL, WATCH_INTERVAL
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            left = deadline - now
            if left <= 0 and not (timed_out or over):
                timed_out = True
                kill_group(proc)
                deadline = time.monotonic() + 5  # drain what is left, briefly
                continue
            if left <= 0:
                break  # something outside the group still holds the pipe: stop reading
            if now >= next_watch and not (timed_out or over):
                over = watch()
                took = time.monotonic() - now
                # A slow walk (a huge tree) is not repeated too often: at most 10% of time.
                interval = max(WATCH_INTERVAL, 10 * took)
                next_watch = time.monotonic() + interval
                if over is not None:
                    kill_group(proc)
                    deadline = time.monotonic() + 5
                    continue
            if not sel.select(min(left, max(next_watch - now, 0.01))):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out.feed(chunk)
            if on_output is not None and on_output(chunk):
                next_watch = time.monotonic()
    proc.stdout.close()
    try:
        proc.wait(None if not (timed_out or over) else 10)
    except subprocess.TimeoutExpired:
        kill_group(proc)
    return timed_out, over


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
