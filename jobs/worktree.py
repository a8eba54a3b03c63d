"""Bare mirrors and per-issue worktrees, with git as the harness (never the agent) runs it.

Layout under ``LOOPBOT_DATA_DIR``::

    mirrors/{owner}/{repo}.git                 bare; remote branches in refs/remotes/origin/*
    worktrees/{owner}/{repo}/issue-{N}         the loop's checkout of branch loop/issue-N

The mirror keeps remote branches under ``refs/remotes/origin`` so that fetching never
collides with the loop branches checked out in worktrees.

Credentials: the installation token reaches git through a credential helper given on
the command line (``-c credential.helper=...``) that reads it from the environment of
that one git process. It is never in a URL, on disk, or in a log.

The agent can write anything inside the worktree, including its ``.git`` file. So the
harness restores that file before each git command, disables hooks and fsmonitor, and
fetches and pushes from the mirror, never from the worktree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from bot.logs import get_logger

log = get_logger("loopbot.worktree")

GIT_TIMEOUT = 600
MAX_SPARES = 2  # finished worktrees kept per repository for reuse
_HELPER = (
    '!f() { test "$1" = get && echo username=x-access-token '
    '&& echo "password=$LOOPBOT_GIT_TOKEN"; }; f'
)
_SAFE = [
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "protocol.file.allow=never",
    "-c",
    "credential.helper=",
    "-c",
    f"credential.helper={_HELPER}",
]
AUTHOR = {
    "GIT_AUTHOR_NAME": "loopbot",
    "GIT_AUTHOR_EMAIL": "loopbot@users.noreply.github.com",
    "GIT_COMMITTER_NAME": "loopbot",
    "GIT_COMMITTER_EMAIL": "loopbot@users.noreply.github.com",
}
_locks: dict[str, threading.Lock] = {}


class GitError(RuntimeError):
    pass


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def git(
    cwd: Path,
    *args: str,
    token: str | None = None,
    timeout: float = GIT_TIMEOUT,
    check: bool = True,
) -> str:
    """Run git with loopbot's safety settings; a timeout on every call."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),  # no operator ~/.gitconfig
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "LANG": "C",
        **AUTHOR,
    }
    if token:
        env["LOOPBOT_GIT_TOKEN"] = token
    try:
        proc = subprocess.run(
            ["git", *_SAFE, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} timed out after {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        err = _scrub(proc.stderr.decode(errors="replace").strip(), token)
        raise GitError(f"git {' '.join(args[:2])} failed: {err[-2000:]}")
    return proc.stdout.decode(errors="replace")


@dataclass(frozen=True)
class Checkout:
    path: Path
    mirror: Path
    branch: str
    base_sha: str  # default branch head the loop started from
    resumed: bool  # created from the pushed branch


class Worktrees:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def mirror_path(self, repo: str) -> Path:
        owner, name = repo.split("/")
        return self.data_dir / "mirrors" / owner / f"{name}.git"

    def worktree_path(self, repo: str, issue: int) -> Path:
        owner, name = repo.split("/")
        return self.data_dir / "worktrees" / owner / name / f"issue-{issue}"

    def _lock(self, repo: str) -> threading.Lock:
        return _locks.setdefault(repo, threading.Lock())

    def sync_mirror(self, repo: str, clone_url: str, token: str) -> Path:
        """Create the bare mirror once, then fetch into it before each use."""
        mirror = self.mirror_path(repo)
        with self._lock(repo):
            if not (mirror / "HEAD").exists():
                mirror.mkdir(parents=True, exist_ok=True)
                git(mirror, "init", "--bare", "-q")
                git(mirror, "remote", "add", "origin", clone_url)
                git(mirror, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
                git(mirror, "config", "gc.auto", "0")  # gc would stall a loop; run it apart
            else:
                git(mirror, "remote", "set-url", "origin", clone_url)
            git(mirror, "fetch", "--prune", "--no-tags", "-q", "origin", token=token)
        return mirror

    def remote_sha(self, mirror: Path, branch: str) -> str | None:
        out = git(
            mirror, "rev-parse", "--verify", "-q", f"refs/remotes/origin/{branch}", check=False
        )
        return out.strip() or None

    def checkout(
        self, repo: str, issue: int, branch: str, default_branch: str, mirror: Path
    ) -> Checkout:
        """The loop's worktree: reused, recreated from the pushed branch, or new."""
        path = self.worktree_path(repo, issue)
        base_sha = self.remote_sha(mirror, default_branch)
        if base_sha is None:
            raise GitError(f"default branch {default_branch!r} not found on the remote")
        pushed = self.remote_sha(mirror, branch)
        if path.exists() and self._valid(path, mirror, branch):
            self._restore_gitfile(path, mirror)
            if (
                pushed
                and self.head(path) != pushed
                and self._is_ancestor(mirror, self.head(path), pushed)
            ):
                # Another worker pushed further (we were presumed dead): move up to it.
                git(path, "reset", "-q", "--hard", pushed)
            return Checkout(path, mirror, branch, base_sha, resumed=True)
        if path.exists():
            shutil.rmtree(path)
        git(mirror, "worktree", "prune")
        path.parent.mkdir(parents=True, exist_ok=True)
        start = f"refs/remotes/origin/{branch}" if pushed else base_sha
        spare = self._take_spare(repo, mirror, path)
        if spare:
            # Recycled (cleaned when released): only the files that differ are written.
            git(path, "checkout", "-q", "-f", "-B", branch, start)
        else:
            git(mirror, "worktree", "add", "-q", "-f", "-B", branch, str(path), start)
        return Checkout(path, mirror, branch, base_sha, resumed=pushed is not None)

    # -- spares: finished worktrees kept for reuse ---------------------------------------

    def spares_dir(self, repo: str) -> Path:
        owner, name = repo.split("/")
        return self.data_dir / "spares" / owner / name

    def release(self, repo: str, issue: int) -> None:
        """A finished loop's worktree becomes a spare for the next loop (or is removed)."""
        path = self.worktree_path(repo, issue)
        mirror = self.mirror_path(repo)
        spares = self.spares_dir(repo)
        if (
            not path.exists()
            or self._admin_dir(path, mirror) is None
            or (spares.exists() and len(list(spares.iterdir())) >= MAX_SPARES)
        ):
            self.remove(repo, issue)
            return
        self._restore_gitfile(path, mirror)
        # Free the loop branch and leave nothing of this loop behind: tracked files as
        # committed, untracked and ignored files (build output, caches) deleted.
        git(path, "checkout", "-q", "--detach")
        git(path, "reset", "-q", "--hard")
        git(path, "clean", "-q", "-ffdx")
        spares.mkdir(parents=True, exist_ok=True)
        git(mirror, "worktree", "move", str(path), str(spares / f"spare-{uuid.uuid4().hex[:12]}"))

    def _take_spare(self, repo: str, mirror: Path, path: Path) -> bool:
        spares = self.spares_dir(repo)
        for spare in sorted(spares.glob("spare-*")) if spares.exists() else []:
            result = git(mirror, "worktree", "move", str(spare), str(path), check=False)
            if path.exists() and self._admin_dir(path, mirror) is not None:
                self._restore_gitfile(path, mirror)
                return True
            log.warning("worktree.spare_unusable", spare=str(spare), output=result[-200:])
            shutil.rmtree(spare, ignore_errors=True)
        return False

    def _valid(self, path: Path, mirror: Path, branch: str) -> bool:
        if self._admin_dir(path, mirror) is None:
            return False
        self._restore_gitfile(path, mirror)
        out = git(path, "rev-parse", "--abbrev-ref", "HEAD", check=False).strip()
        return out == branch

    def _restore_gitfile(self, path: Path, mirror: Path) -> None:
        # The agent may have rewritten .git to point at a gitdir it controls (with hooks or
        # config that would run as the harness). Put back the one git wrote.
        gitfile = path / ".git"
        admin = self._admin_dir(path, mirror)
        if admin is None:
            raise GitError(f"{path} is not a worktree of {mirror}")
        expected = f"gitdir: {admin}\n"
        if gitfile.is_dir() or gitfile.is_symlink():
            shutil.rmtree(gitfile) if gitfile.is_dir() else gitfile.unlink()
        if not gitfile.exists() or gitfile.read_text(errors="replace") != expected:
            gitfile.write_text(expected)

    def _admin_dir(self, path: Path, mirror: Path) -> Path | None:
        """The worktree's directory under ``mirror/worktrees`` (trusted: the agent cannot
        write the mirror). Usually named after the path; a recycled spare keeps its name.
        """
        target = str(path / ".git")
        named = mirror / "worktrees" / path.name
        candidates = [named, *sorted((mirror / "worktrees").glob("*"))]
        for admin in candidates:
            gitdir = admin / "gitdir"
            if gitdir.is_file() and gitdir.read_text().strip() == target:
                return admin
        return None

    def _is_ancestor(self, mirror: Path, a: str, b: str) -> bool:
        return (
            subprocess.run(
                ["git", "merge-base", "--is-ancestor", a, b],
                cwd=mirror,
                capture_output=True,
                timeout=GIT_TIMEOUT,
            ).returncode
            == 0
        )

    def head(self, path: Path) -> str:
        return git(path, "rev-parse", "HEAD").strip()

    def commit_all(self, checkout: Checkout, message: str) -> str | None:
        """Commit whatever the agent changed; None when nothing changed."""
        self._restore_gitfile(checkout.path, checkout.mirror)
        git(checkout.path, "add", "-A")
        if not git(checkout.path, "status", "--porcelain").strip():
            return None
        git(checkout.path, "commit", "-q", "--no-verify", "-m", message)
        return self.head(checkout.path)

    def merge_base_in(self, checkout: Checkout, default_branch: str) -> list[str]:
        """Merge the default branch (as last fetched) into the loop branch.

        Returns the conflicted paths, with their conflict markers left in the worktree
        and the merge in progress: the agent resolves them and the turn's commit
        concludes the merge. An empty list means the merge committed cleanly.
        """
        self._restore_gitfile(checkout.path, checkout.mirror)
        ref = f"refs/remotes/origin/{default_branch}"
        merged = git(
            checkout.path,
            "merge",
            "--no-edit",
            "-m",
            f"loop: merge {default_branch}",
            ref,
            check=False,
        )
        conflicted = git(checkout.path, "diff", "--name-only", "--diff-filter=U").split()
        if not conflicted and not self._is_ancestor(checkout.mirror, ref, self.head(checkout.path)):
            raise GitError(f"merging {default_branch} failed: {merged.strip()[-500:]}")
        return conflicted

    def changed_since_base(self, checkout: Checkout) -> bool:
        return self.head(checkout.path) != checkout.base_sha

    def diff_stat(self, checkout: Checkout) -> str:
        return git(checkout.path, "diff", "--stat", checkout.base_sha, "HEAD")

    def push(self, checkout: Checkout, token: str) -> str:
        """Push the loop branch from the mirror (fast-forward only: never clobber others)."""
        sha = git(checkout.mirror, "rev-parse", f"refs/heads/{checkout.branch}").strip()
        git(
            checkout.mirror,
            "push",
            "-q",
            "origin",
            f"refs/heads/{checkout.branch}:refs/heads/{checkout.branch}",
            token=token,
        )
        git(checkout.mirror, "update-ref", f"refs/remotes/origin/{checkout.branch}", sha)
        return sha

    def remove(self, repo: str, issue: int) -> None:
        path = self.worktree_path(repo, issue)
        mirror = self.mirror_path(repo)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        if mirror.exists():
            git(mirror, "worktree", "prune", check=False)

    def owned_worktrees(self) -> list[tuple[str, int, Path]]:
        """Every worktree on disk as (repo, issue, path), for the reaper."""
        root = self.data_dir / "worktrees"
        out = []
        if root.exists():
            for p in root.glob("*/*/issue-*"):
                try:
                    out.append(
                        (
                            f"{p.parent.parent.name}/{p.parent.name}",
                            int(p.name.removeprefix("issue-")),
                            p,
                        )
                    )
                except ValueError:
                    continue
        return out
