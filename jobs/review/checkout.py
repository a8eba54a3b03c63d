"""The critic's checkout: the pull request's head in a worktree of its own, read-only to
the critic's tools, with a sandbox to run the tests in; reset after each test run and
swept when a worker died holding one."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bot.core.settings import Settings
from jobs.sandbox.bwrap import Network, Sandbox
from jobs.tree.git import _remove
from jobs.tree.worktree import Checkout, GitError, Worktrees, git, mirror_lock

STALE_SECONDS = 6 * 3600  # a review checkout older than this was left by a dead worker
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


@dataclass(frozen=True)
class ReviewCheckout:
    path: Path
    mirror: Path
    sha: str
    sandbox: Sandbox
    worktrees: Worktrees

    def reset(self) -> None:
        """Back to the reviewed commit exactly: whatever the tests wrote is removed."""
        self.worktrees.discard_uncommitted(Checkout(self.path, self.mirror, "", self.sha, False))
        self.sandbox.adopt()  # files git put back belong to the worker


@contextlib.contextmanager
def review_checkout(
    worktrees: Worktrees,
    repo: str,
    mirror: Path,
    sha: str,
    *,
    settings: Settings,
    network: Network = False,
    timeout: float = 600,
    token: str | None = None,
) -> Iterator[ReviewCheckout]:
    """A throwaway worktree of ``sha`` (detached, from the loop's mirror) and a sandbox
    on it, both removed on exit. ``sha`` missing from the mirror is fetched when a
    ``token`` is given (the mirror is normally synced just before)."""
    if not _SHA.fullmatch(sha):
        raise GitError(f"not a commit id: {sha[:80]!r}")
    owner, name = repo.split("/")
    parent = worktrees.data_dir / "reviews" / owner / name
    path = parent / f"{sha[:12]}-{uuid.uuid4().hex[:8]}"
    with mirror_lock(mirror):
        _sweep(parent)
        if not _has_commit(mirror, sha):
            if token is None:
                raise GitError(f"commit {sha[:12]} is not in the mirror of {repo}")
            git(mirror, "fetch", "-q", "--no-tags", "origin", sha, token=token)
            if not _has_commit(mirror, sha):
                raise GitError(f"commit {sha[:12]} could not be fetched for {repo}")
        parent.mkdir(parents=True, exist_ok=True)
        git(mirror, "worktree", "add", "-q", "-f", "--detach", str(path), sha)
    sandbox: Sandbox | None = None
    try:
        sandbox = Sandbox(
            path, settings=settings, network=network, timeout=timeout, readonly=(mirror,)
        )
        yield ReviewCheckout(path, mirror, sha, sandbox, worktrees)
    finally:
        if sandbox is not None:
            sandbox.close()
        _remove(path)
        with mirror_lock(mirror):
            git(mirror, "worktree", "prune", check=False)


def _has_commit(mirror: Path, sha: str) -> bool:
    return bool(git(mirror, "rev-parse", "--verify", "-q", f"{sha}^{{commit}}", check=False))


def _sweep(parent: Path) -> None:
    """Remove review checkouts a dead worker left behind (no review runs this long)."""
    if not parent.is_dir():
        return
    now = time.time()
    for old in parent.iterdir():
        with contextlib.suppress(OSError, GitError):
            if now - old.lstat().st_mtime > STALE_SECONDS:
                _remove(old)
