"""Red team of 3076c56: pushes transfer without the mirror's lock. Other loops of the
repository commit, push, fetch and collect a finished worktree (``prune --expire=now``)
while a push is on the wire; the loop itself commits its next turn meanwhile. Expected
to hold (it does)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bot.standins.github import GitHubServer
from jobs.tree.worktree import Worktrees, git
from tests.io.tree.test_worktree import REPO, setup  # noqa: F401 - the fixture


def test_redteam_push_mirror_survives_commits_fetches_and_collection_during_a_push(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, url, token, mirror = setup
    other = Worktrees(wt.data_dir)  # another job of the repository
    one = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    two = other.checkout(REPO, 2, "loop/issue-2", "main", mirror)
    (one.path / "a.py").write_text("x = 2\n")
    sha1 = wt.commit_all(one, "loop(turn-1): one")
    (two.path / "b.py").write_text("y = 2\n")
    sha2 = other.commit_all(two, "loop(turn-1): two")
    assert sha1 and sha2
    github.push_delay = 3.0
    errors: list[BaseException] = []

    def run(fn, *args) -> None:  # type: ignore[no-untyped-def]
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    pushes = [
        threading.Thread(target=run, args=(wt.push, one, token, sha1)),
        threading.Thread(target=run, args=(other.push, two, token, sha2)),
    ]
    for t in pushes:
        t.start()
    time.sleep(0.5)
    # Meanwhile: loop one's next turn commits; a third loop syncs; loop two's worktree
    # is released (its push is still on the wire) and collected.
    (one.path / "a.py").write_text("x = 3\n")
    next1 = wt.commit_all(one, "loop(turn-2): one")
    third = Worktrees(wt.data_dir)
    third.sync_mirror(REPO, url, token)
    three = third.checkout(REPO, 3, "loop/issue-3", "main", mirror)
    (three.path / "c.py").write_text("z = 1\n")
    assert third.commit_all(three, "loop(turn-1): three")
    four = third.checkout(REPO, 4, "loop/issue-4", "main", mirror)
    (four.path / "d.py").write_text("w = 1\n")
    assert third.commit_all(four, "loop(turn-1): four, never pushed")
    third.remove(REPO, 4)  # a finished loop collected: branch deleted, reflogs expired, pruned
    third.release(REPO, 3)  # and one recycled as a spare (its _collect too)
    for t in pushes:
        t.join(30)
    assert not errors, errors
    assert github.ref(REPO, "loop/issue-1") == sha1
    assert github.ref(REPO, "loop/issue-2") == sha2
    assert wt.remote_sha(mirror, "loop/issue-1") == sha1
    assert git(mirror, "rev-parse", "refs/heads/loop/issue-1").strip() == next1
    fsck = git(mirror, "fsck", "--no-dangling", "--connectivity-only")
    assert "error" not in fsck.lower() and "missing" not in fsck.lower(), fsck
    wt.push(one, token, next1)
    assert github.ref(REPO, "loop/issue-1") == next1
