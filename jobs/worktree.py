"""Bare mirrors and per-issue worktrees, with git as the harness (never the agent) runs it.

Layout under ``LOOPBOT_DATA_DIR``::

    mirrors/{owner}/{repo}.git                 bare; remote branches in refs/remotes/origin/*
    worktrees/{owner}/{repo}/issue-{N}         the loop's checkout of branch loop/issue-N

The mirror keeps remote branches under ``refs/remotes/origin`` so that fetching never
collides with the loop branches checked out in worktrees.

Credentials: the installation token reaches git through a credential helper given on
the command line (``-c credential.helper=...``) that reads it from the environment of
that one git process. It is never in a URL, on disk, or in a log.

Everything in the worktree is hostile input to the harness: the repository's files and
whatever the agent wrote (``.gitconfig``, ``.gitattributes`` naming filters, a ``.git``
replaced by a directory, a FIFO or a pointer elsewhere, nested repositories with their
own config). So harness git never reads configuration from anywhere the agent can
write: no system or global config (``HOME`` and ``XDG_CONFIG_HOME`` point at nothing,
``GIT_CONFIG_GLOBAL=/dev/null``), only the mirror's own config, which the sandbox sees
read-only; every program-running key (hooks, fsmonitor, gpg, ssh, pagers, attributes
files, external diff) overridden on the command line. Worktree commands name their git
directory explicitly (``GIT_DIR``/``GIT_WORK_TREE``), so the worktree's ``.git`` is
never opened; before a commit the harness removes nested ``.git`` entries and special
files (FIFOs, sockets, devices) so git never descends into a repository the agent made.
Fetches and pushes go from the mirror, never from the worktree.

Mirrors are shared by every work horse on the machine (RQ forks one per job), so fetch,
worktree add/move, commits, pushes and ref updates hold a file lock per mirror.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.io.logs import get_logger

log = get_logger("loopbot.worktree")

GIT_TIMEOUT = 600
MAX_SPARES = 2  # finished worktrees kept per repository for reuse
_HELPER = (
    '!f() { test "$1" = get && echo username=x-access-token '
    '&& echo "password=$LOOPBOT_GIT_TOKEN"; }; f'
)
# Every key that makes git run a program or read a file named by configuration, pinned.
# Drivers named by .gitattributes (filter, diff, merge) need a config entry to run
# anything, and no config git reads here can define one.
_PINNED = {
    "core.hooksPath": "/dev/null",
    "core.fsmonitor": "false",
    "core.untrackedCache": "false",
    "core.attributesFile": "/dev/null",
    "core.excludesFile": "/dev/null",
    "core.sshCommand": "/bin/false",
    "core.askPass": "/bin/false",
    "core.pager": "cat",
    "core.editor": "/bin/false",
    "core.symlinks": "true",
    "commit.gpgSign": "false",
    "tag.gpgSign": "false",
    "gpg.program": "/bin/false",
    "gpg.ssh.program": "/bin/false",
    "gpg.x509.program": "/bin/false",
    "diff.external": "/bin/false",
    "diff.ignoreSubmodules": "all",
    "status.submoduleSummary": "false",
    "submodule.recurse": "false",
    "fetch.recurseSubmodules": "false",
    "push.recurseSubmodules": "no",
    "protocol.file.allow": "never",
    "protocol.ext.allow": "never",
    "maintenance.auto": "false",
    "gc.auto": "0",
    # The worktree belongs to the sandbox's uid; the git directory is ours and named.
    "safe.directory": "*",
    "credential.helper": "",
}
_SAFE = [arg for k, v in _PINNED.items() for arg in ("-c", f"{k}={v}")]
_SAFE += ["-c", f"credential.helper={_HELPER}"]
_NO_CONFIG_HOME = "/nonexistent/loopbot-git-home"
AUTHOR = {
    "GIT_AUTHOR_NAME": "loopbot",
    "GIT_AUTHOR_EMAIL": "loopbot@users.noreply.github.com",
    "GIT_COMMITTER_NAME": "loopbot",
    "GIT_COMMITTER_EMAIL": "loopbot@users.noreply.github.com",
}
_thread_locks: dict[str, threading.RLock] = {}
_held: dict[str, int] = {}
LOCK_TIMEOUT = GIT_TIMEOUT
MAX_GITFILE = 4096


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
    git_dir: Path | None = None,
) -> str:
    """Run git with loopbot's safety settings; a timeout on every call.

    ``git_dir`` names the repository explicitly (a worktree's admin directory in the
    mirror) so that git never discovers one from ``cwd``, where the agent writes.
    """
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": _NO_CONFIG_HOME,  # neither the operator's nor the worktree's .gitconfig
        "XDG_CONFIG_HOME": _NO_CONFIG_HOME,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "LANG": "C",
        **AUTHOR,
    }
    if git_dir is not None:
        env["GIT_DIR"] = str(git_dir)
        env["GIT_WORK_TREE"] = str(cwd)
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


@contextlib.contextmanager
def mirror_lock(mirror: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold the mirror's lock across processes (a file lock) and threads (re-entrant).

    RQ forks a work horse per job, so a ``threading.Lock`` guards nothing between two
    jobs on one machine; git's own ref locks then fail (``cannot lock ref``).
    """
    key = str(mirror)
    rlock = _thread_locks.setdefault(key, threading.RLock())
    if not rlock.acquire(timeout=timeout):
        raise GitError(f"timed out after {timeout:.0f}s waiting for the lock on {mirror.name}")
    fd = -1
    try:
        if _held.get(key, 0) == 0:
            mirror.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(str(mirror) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise GitError(
                            f"timed out after {timeout:.0f}s waiting for the lock on "
                            f"{mirror.name} (another worker process holds it)"
                        ) from None
                    time.sleep(0.05)
        _held[key] = _held.get(key, 0) + 1
        try:
            yield
        finally:
            _held[key] -= 1
    finally:
        if fd >= 0:
            os.close(fd)  # releases the flock
        rlock.release()


def _read_small_regular(path: Path, limit: int) -> str | None:
    """The text of ``path`` if it is a small regular file, without following a link or
    blocking on a FIFO; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    """Remove whatever is at ``path`` (file, link, FIFO, directory) without following it.

    Directories go through ``rm -rf``, which walks iteratively: Python's ``rmtree``
    recurses, and an agent can nest directories thousands of levels deep.
    """
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            path.unlink()
            return
        subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", str(path)],
            capture_output=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
        if path.exists() or path.is_symlink():
            raise GitError(f"could not remove {path}")


def defuse_tree(root: Path) -> list[str]:
    """Remove what harness git must never meet in the worktree: nested ``.git`` entries
    (repositories with their own config and hooks) and special files. Walks with lstat
    only, never opening a file or following a link. Returns the removed paths."""
    removed: list[str] = []
    todo = [root]
    while todo:
        current = todo.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if current == root and entry.name == ".git":
                continue  # the worktree's own pointer: _restore_gitfile rewrites it
            if entry.name == ".git" or not (
                stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)
            ):
                _remove(path)
                removed.append(str(path.relative_to(root)))
            elif stat.S_ISDIR(mode):
                todo.append(path)
    return removed


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

    def sync_mirror(self, repo: str, clone_url: str, token: str) -> Path:
        """Create the bare mirror once, then fetch into it before each use."""
        mirror = self.mirror_path(repo)
        with mirror_lock(mirror):
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

    def _git(self, path: Path, mirror: Path, *args: str, check: bool = True) -> str:
        """git on the worktree at ``path``, with its git directory named explicitly."""
        admin = self._admin_dir(path, mirror)
        if admin is None:
            raise GitError(f"{path} is not a worktree of {mirror}")
        return git(path, *args, git_dir=admin, check=check)

    def checkout(
        self, repo: str, issue: int, branch: str, default_branch: str, mirror: Path
    ) -> Checkout:
        """The loop's worktree: reused, recreated from the pushed branch, or new."""
        path = self.worktree_path(repo, issue)
        base_sha = self.remote_sha(mirror, default_branch)
        if base_sha is None:
            raise GitError(f"default branch {default_branch!r} not found on the remote")
        pushed = self.remote_sha(mirror, branch)
        with mirror_lock(mirror):
            if path.exists() and self._valid(path, mirror, branch):
                self._restore_gitfile(path, mirror)
                head = self.head(path, mirror)
                if pushed and head != pushed and self._is_ancestor(mirror, head, pushed):
                    # Another worker pushed further (we were presumed dead): move up to it.
                    defuse_tree(path)
                    self._git(path, mirror, "reset", "-q", "--hard", pushed)
                return Checkout(path, mirror, branch, base_sha, resumed=True)
            if path.exists() or path.is_symlink():
                _remove(path)
            git(mirror, "worktree", "prune")
            path.parent.mkdir(parents=True, exist_ok=True)
            start = f"refs/remotes/origin/{branch}" if pushed else base_sha
            spare = self._take_spare(repo, mirror, path)
            if spare:
                # Recycled (cleaned when released): only the files that differ are written.
                self._git(path, mirror, "checkout", "-q", "-f", "-B", branch, start)
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
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            # Free the loop branch and leave nothing of this loop behind: tracked files as
            # committed, untracked and ignored files (build output, caches) deleted.
            self._git(path, mirror, "checkout", "-q", "--detach")
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-ffdx")
            spares.mkdir(parents=True, exist_ok=True)
            target = spares / f"spare-{uuid.uuid4().hex[:12]}"
            git(mirror, "worktree", "move", str(path), str(target))

    def _take_spare(self, repo: str, mirror: Path, path: Path) -> bool:
        spares = self.spares_dir(repo)
        for spare in sorted(spares.glob("spare-*")) if spares.exists() else []:
            result = git(mirror, "worktree", "move", str(spare), str(path), check=False)
            if path.exists() and self._admin_dir(path, mirror) is not None:
                self._restore_gitfile(path, mirror)
                return True
            log.warning("worktree.spare_unusable", spare=str(spare), output=result[-200:])
            with contextlib.suppress(GitError, OSError):
                _remove(spare)
        return False

    def _valid(self, path: Path, mirror: Path, branch: str) -> bool:
        if self._admin_dir(path, mirror) is None:
            return False
        out = self._git(path, mirror, "rev-parse", "--abbrev-ref", "HEAD", check=False)
        return out.strip() == branch

    def _restore_gitfile(self, path: Path, mirror: Path) -> None:
        """Put back the ``.git`` file git wrote, for the agent's own git commands.

        The harness never reads it (it names the git directory itself), but the agent
        may have replaced it with a directory, a link, a FIFO or a pointer elsewhere.
        """
        gitfile = path / ".git"
        admin = self._admin_dir(path, mirror)
        if admin is None:
            raise GitError(f"{path} is not a worktree of {mirror}")
        expected = f"gitdir: {admin}\n"
        if _read_small_regular(gitfile, MAX_GITFILE) != expected:
            _remove(gitfile)
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
        try:
            git(mirror, "merge-base", "--is-ancestor", a, b)
        except GitError:
            return False
        return True

    def head(self, path: Path, mirror: Path | None = None) -> str:
        return self._git(path, mirror or self._mirror_of(path), "rev-parse", "HEAD").strip()

    def _mirror_of(self, path: Path) -> Path:
        # worktrees/{owner}/{repo}/issue-N and spares/{owner}/{repo}/spare-X alike
        return self.data_dir / "mirrors" / path.parent.parent.name / f"{path.parent.name}.git"

    def commit_all(self, checkout: Checkout, message: str) -> str | None:
        """Commit whatever the agent changed; None when nothing changed."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            removed = defuse_tree(path)
            if removed:
                log.warning("worktree.defused", removed=removed[:20], count=len(removed))
            self._restore_gitfile(path, mirror)
            self._git(path, mirror, "add", "-A")
            status = self._git(path, mirror, "status", "--porcelain", "--ignore-submodules=all")
            if not status.strip():
                return None
            self._git(path, mirror, "commit", "-q", "--no-verify", "-m", message)
            return self.head(path, mirror)

    def merge_base_in(self, checkout: Checkout, default_branch: str) -> list[str]:
        """Merge the default branch (as last fetched) into the loop branch.

        Returns the conflicted paths, with their conflict markers left in the worktree
        and the merge in progress: the agent resolves them and the turn's commit
        concludes the merge. An empty list means the merge committed cleanly.
        """
        path, mirror = checkout.path, checkout.mirror
        ref = f"refs/remotes/origin/{default_branch}"
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            merged = self._git(
                path,
                mirror,
                "merge",
                "--no-edit",
                "-m",
                f"loop: merge {default_branch}",
                ref,
                check=False,
            )
            conflicted = self._git(path, mirror, "diff", "--name-only", "--diff-filter=U").split()
            if not conflicted and not self._is_ancestor(mirror, ref, self.head(path, mirror)):
                raise GitError(f"merging {default_branch} failed: {merged.strip()[-500:]}")
        return conflicted

    def discard_uncommitted(self, checkout: Checkout) -> None:
        """Back to the last commit: uncommitted, untracked and ignored files removed."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-ffdx")

    def ignored_files(self, checkout: Checkout) -> dict[str, tuple[int, int, int]]:
        """Every file git ignores in the worktree, with (mtime_ns, size, mode): what
        verify sees but a commit never carries (dependencies, build output, caches)."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            out = self._git(
                path,
                mirror,
                "ls-files",
                "--others",
                "--ignored",
                "--exclude-standard",
                "--directory",
                "-z",
            )
        found: dict[str, tuple[int, int, int]] = {}
        for rel in (p for p in out.split("\0") if p):
            top = path / rel
            for file in _walk_lstat(top):
                st = file[1]
                found[str(file[0].relative_to(path))] = (st.st_mtime_ns, st.st_size, st.st_mode)
        return found

    def purge_ignored(
        self, checkout: Checkout, before: dict[str, tuple[int, int, int]]
    ) -> list[str]:
        """Remove the ignored files that are new or changed since ``before``: files the
        agent left where git does not look. verify would see them and the commit would
        not, so a verify that passes only because of them proves nothing about the
        commit (a ``calc/`` package in an ignored directory shadowing ``calc.py``)."""
        removed = []
        for rel, state in self.ignored_files(checkout).items():
            if before.get(rel) == state:
                continue
            target = checkout.path / rel
            with contextlib.suppress(FileNotFoundError):
                if target.is_dir() and not target.is_symlink():
                    _remove(target)
                else:
                    target.unlink()
            removed.append(rel)
            # Directories the removal emptied go too (an empty package dir can matter).
            parent = target.parent
            while parent != checkout.path and checkout.path in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent
        return sorted(removed)

    def changed_since_base(self, checkout: Checkout) -> bool:
        return self.head(checkout.path, checkout.mirror) != checkout.base_sha

    def fork_point(self, checkout: Checkout) -> str:
        """Where the branch's diff starts, as the pull request shows it: the merge base of
        its head and the default branch (the default branch after a merge of it)."""
        head = self.head(checkout.path, checkout.mirror)
        out = git(checkout.mirror, "merge-base", checkout.base_sha, head, check=False).strip()
        return out or checkout.base_sha

    def tree_changed(self, checkout: Checkout) -> bool:
        """Whether the committed tree differs from the base's: commits that add up to no
        change (an edit and its revert) are no change. Called after ``commit_all``, so
        the commit holds everything the agent left."""
        head = self.head(checkout.path, checkout.mirror)
        base = self.fork_point(checkout)
        trees = git(checkout.mirror, "rev-parse", f"{head}^{{tree}}", f"{base}^{{tree}}")
        ours, theirs = trees.split()
        return ours != theirs

    def changed_files(self, checkout: Checkout) -> list[str]:
        """Files the branch adds or changes against its fork point (deletions left out)."""
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--name-only",
            "--diff-filter=d",
            "-z",
            self.fork_point(checkout),
            self.head(checkout.path, checkout.mirror),
        )
        return [p for p in out.split("\0") if p]

    def files_with_added_lines(self, checkout: Checkout) -> list[str]:
        """Files where the branch adds at least one non-blank line against its fork point:
        an empty or whitespace-only test file captures nothing."""
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--numstat",
            "--ignore-blank-lines",
            "--ignore-all-space",
            "-z",
            self.fork_point(checkout),
            self.head(checkout.path, checkout.mirror),
        )
        found = []
        for item in (p for p in out.split("\0") if p):
            added, _, rest = item.partition("\t")
            _, _, path = rest.partition("\t")
            if added.isdigit() and int(added) > 0 and path:
                found.append(path)
        return found

    def is_clean(self, checkout: Checkout) -> bool:
        """Nothing uncommitted in the worktree (ignored files aside)."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            defuse_tree(path)
            self._restore_gitfile(path, mirror)
            status = self._git(
                path,
                mirror,
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--ignore-submodules=all",
            )
        return not status.strip()

    def restore_committed(self, checkout: Checkout) -> None:
        """Back to the last commit, keeping ignored files (caches, installed packages):
        undoes what a command run on a clean checkout wrote into tracked or new files."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-fd")

    def diff_stat(self, checkout: Checkout) -> str:
        return git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--stat",
            checkout.base_sha,
            self.head(checkout.path, checkout.mirror),
        )

    # -- milestones and post_action (jobs/loop.py) ------------------------------------------

    def diff_between(self, checkout: Checkout, base: str, head: str) -> str:
        """The diff from ``base`` to ``head`` (a section's work, for its audit)."""
        return git(checkout.mirror, "diff", "--no-ext-diff", "--no-textconv", base, head)

    def numstat_between(
        self, checkout: Checkout, base: str, head: str
    ) -> list[tuple[str, int | None]]:
        """Each path ``base``..``head`` touches (renames as delete and add), with its
        added plus deleted lines; None for a binary file, whose size no line count says."""
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--numstat",
            "-z",
            base,
            head,
        )
        found: list[tuple[str, int | None]] = []
        for item in (p for p in out.split("\0") if p):
            added, _, rest = item.partition("\t")
            deleted, _, path = rest.partition("\t")
            binary = not (added.isdigit() and deleted.isdigit())  # git says "-" "-"
            found.append((path, None if binary else int(added) + int(deleted)))
        return found

    def drop_to(self, checkout: Checkout, sha: str) -> None:
        """Put the branch and the worktree back at ``sha`` (an unpushed commit dropped),
        keeping ignored files."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            self._git(path, mirror, "reset", "-q", "--hard", sha)
            self._git(path, mirror, "clean", "-q", "-fd")

    # -- metric loops (jobs/metric_loop.py) --------------------------------------------------

    def tracked_files(self, checkout: Checkout) -> list[str]:
        """Every path git tracks at the head (phase 0: the scope must match one)."""
        out = git(
            checkout.mirror,
            "ls-tree",
            "-r",
            "-z",
            "--name-only",
            self.head(checkout.path, checkout.mirror),
        )
        return [p for p in out.split("\0") if p]

    def commit_paths(self, checkout: Checkout, sha: str) -> list[str]:
        """The paths commit ``sha`` adds, changes or deletes against its first parent
        (renames as a delete and an add): what the scope must allow."""
        out = git(
            checkout.mirror,
            "diff",
            "--no-ext-diff",
            "--no-textconv",
            "--no-renames",
            "--name-only",
            "-z",
            f"{sha}^",
            sha,
        )
        return [p for p in out.split("\0") if p]

    def revert_head(self, checkout: Checkout) -> str:
        """Undo the head commit with a new commit (``git revert --no-edit``): the history
        keeps what was tried. Uncommitted files (what a command wrote) go first."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-fd")
            self._git(path, mirror, "revert", "--no-edit", "HEAD")
            return self.head(path, mirror)

    def restore_tree(self, checkout: Checkout, sha: str, message: str) -> str | None:
        """A new commit whose tree is ``sha``'s (the commits after it undone, kept in the
        history); None when the tree is ``sha``'s already."""
        path, mirror = checkout.path, checkout.mirror
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            self._git(path, mirror, "reset", "-q", "--hard")
            self._git(path, mirror, "clean", "-q", "-fd")
            self._git(path, mirror, "read-tree", "-u", "--reset", sha)
            status = self._git(path, mirror, "status", "--porcelain", "--ignore-submodules=all")
            if not status.strip():
                return None
            self._git(path, mirror, "commit", "-q", "--no-verify", "-m", message)
            return self.head(path, mirror)

    def commit_file(self, checkout: Checkout, name: str, text: str, message: str) -> str | None:
        """Write ``name`` at the worktree's root and commit it alone, even where the
        repository ignores it; None when it is unchanged. Whatever the agent left at that
        path (a link to elsewhere) is removed first, never followed."""
        path, mirror = checkout.path, checkout.mirror
        target = path / name
        with mirror_lock(mirror):
            self._restore_gitfile(path, mirror)
            defuse_tree(path)
            if target.is_symlink() or target.exists():
                _remove(target)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            self._git(path, mirror, "add", "-f", "--", name)
            staged = self._git(path, mirror, "diff", "--cached", "--name-only")
            if not staged.strip():
                return None
            self._git(path, mirror, "commit", "-q", "--no-verify", "-m", message, "--", name)
            return self.head(path, mirror)

    def push(self, checkout: Checkout, token: str) -> str:
        """Push the loop branch from the mirror (fast-forward only: never clobber others)."""
        mirror, branch = checkout.mirror, checkout.branch
        with mirror_lock(mirror):
            sha = git(mirror, "rev-parse", f"refs/heads/{branch}").strip()
            git(
                mirror,
                "push",
                "-q",
                "origin",
                f"refs/heads/{branch}:refs/heads/{branch}",
                token=token,
            )
            git(mirror, "update-ref", f"refs/remotes/origin/{branch}", sha)
        return sha

    def remove(self, repo: str, issue: int) -> None:
        path = self.worktree_path(repo, issue)
        mirror = self.mirror_path(repo)
        if path.exists() or path.is_symlink():
            with contextlib.suppress(OSError):
                _remove(path)
        if mirror.exists():
            with mirror_lock(mirror):
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


MAX_READ_BYTES = 1 << 20  # files_at: larger files are not read


def files_at(
    mirror: Path, commit: str, paths: Sequence[str], max_bytes: int = MAX_READ_BYTES
) -> dict[str, str]:
    """The text of each of ``paths`` that is a regular file at ``commit``, read from the
    bare ``mirror``: never from a worktree, where the agent writes. Absent paths,
    directories, symbolic links, submodules and files over ``max_bytes`` are left out.
    Paths are literal (no pathspec magic or globs)."""
    wanted = set(paths)
    found: dict[str, str] = {}
    ordered = sorted(wanted)
    for start in range(0, len(ordered), 200):  # keeps each command line short
        listing = git(
            mirror,
            "--literal-pathspecs",
            "ls-tree",
            "-z",
            "--long",
            commit,
            "--",
            *ordered[start : start + 200],
        )
        for entry in (e for e in listing.split("\0") if e):
            meta, _, path = entry.partition("\t")
            fields = meta.split()
            if (
                path in wanted
                and len(fields) == 4
                and fields[0] in ("100644", "100755")
                and fields[1] == "blob"
                and fields[3].isdigit()
                and int(fields[3]) <= max_bytes
            ):
                found[path] = git(mirror, "cat-file", "blob", fields[2])
    return found


def _walk_lstat(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """``top`` and everything under it, without following links: (path, lstat)."""
    try:
        st = top.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield top, st
        return
    stack = [top]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(est.st_mode):
                stack.append(Path(entry.path))
            else:
                yield Path(entry.path), est
