"""One mirror fetch in a child process, for the multi-process mirror test.

Kept apart from the test module so a child started by the forkserver imports only this
and ``jobs.tree.worktree``, not the test module's servers and clients.
"""

from __future__ import annotations

from pathlib import Path

from jobs.tree.worktree import Worktrees


def fetch(args: tuple[str, str, str, str]) -> str:
    data_dir, repo, url, token = args
    try:
        Worktrees(Path(data_dir)).sync_mirror(repo, url, token)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return f"{type(exc).__name__}: {exc}"
