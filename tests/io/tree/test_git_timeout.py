"""A harness git call ends at its timeout, whatever git started: a push whose transfer
GitHub holds on the wire (git's remote helper, a child of git, keeps the pipes open) must
not keep the loop waiting past the timeout (issue 37, item 9)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.standins.github import GitHubServer
from jobs.tree.worktree import GitError, Worktrees, git
from tests.io.tree.test_worktree import REPO, setup  # noqa: F401 - the fixture


def _holding(token: str) -> list[int]:
    """Processes whose environment holds ``token`` (only harness git gets it)."""
    needle = f"LOOPBOT_GIT_TOKEN={token}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_a_push_held_on_the_wire_ends_at_its_timeout_with_everything_it_started(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, url, token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("x = 2\n")
    sha = wt.commit_all(co, "loop(turn-1): change")
    assert sha is not None
    github.push_delay = 25.0  # GitHub receives the push and answers 25 s later
    started = time.monotonic()
    with pytest.raises(GitError, match="timed out after 2s"):
        git(mirror, "push", "-q", url, f"{sha}:refs/heads/loop/issue-1", token=token, timeout=2)
    took = time.monotonic() - started
    assert took < 15, f"the push returned after {took:.0f}s, not at its 2 s timeout"
    assert _holding(token) == [], "a process of the timed-out push runs on"
