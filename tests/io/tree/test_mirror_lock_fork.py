"""A work horse is forked from a slot whose reconciler thread may hold a mirror's lock at
that moment (reaping a finished loop's worktree). The horse must not inherit it: neither
the thread lock (held by a thread the horse does not have) nor the file lock's descriptor
(which would keep the mirror locked against every process for the horse's whole life).
Either stalled the horse, or other loops of the repository, for the lock's 600 s timeout
(issue 37, item 9: a hand-over that never finishes)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from jobs.tree.git import GitError, mirror_lock


def test_a_horse_forked_while_a_thread_holds_a_mirror_lock_inherits_none_of_it(
    tmp_path: Path,
) -> None:
    mirror = tmp_path / "mirrors" / "acme" / "r.git"
    held, release = threading.Event(), threading.Event()

    def reaper() -> None:  # the slot's reconciler thread, releasing a finished worktree
        with mirror_lock(mirror):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=reaper)
    thread.start()
    assert held.wait(10)
    told_r, told_w = os.pipe()  # the parent tells the horse when the reaper is done
    pid = os.fork()
    if pid == 0:  # the work horse
        code = 2
        try:
            os.close(told_w)
            os.read(told_r, 1)
            with mirror_lock(mirror, timeout=3):
                code = 0
        except GitError:
            code = 1
        finally:
            os._exit(code)
    os.close(told_r)
    problem = ""
    try:
        release.set()
        thread.join(10)
        # While the horse lives (it waits to be told), the slot takes the lock again: the
        # horse holds no copy of it.
        try:
            with mirror_lock(mirror, timeout=3):
                pass
        except GitError as exc:
            problem = f"the forked horse keeps the mirror locked: {exc}"
        os.write(told_w, b"x")
    finally:
        os.close(told_w)
        _, status = os.waitpid(pid, 0)
    assert not problem, problem
    assert os.waitstatus_to_exitcode(status) == 0, "the horse could not take the mirror's lock"
