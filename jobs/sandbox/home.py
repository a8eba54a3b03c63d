"""A sandboxed command's private HOME, as the harness reaches it: a directory in the
sandbox's own size-bounded ``/tmp`` tmpfs, never a directory on the worker's disk.

A backend CLI's HOME holds its session, which the harness restores before a turn and
saves after it. It used to be a host directory bound in, in the host's ``/tmp``: the
kernel bounded nothing there (``fallocate`` put 8 GiB in it between two checks of a
once-a-second walk), and the harness read it by path, so a symlink the agent planted
(``~/.codex -> <another loop's worktree>``) was followed by the worker (issue 37, items 4
and 7). Now:

- HOME is ``/tmp/home`` inside the sandbox, on the tmpfs of ``LOOPBOT_SANDBOX_TMP_MB``:
  the file system refuses what passes it (ENOSPC), and its pages are the sandbox's memory
  (its cgroup's, where it has one). Nothing of it is on the host's disk.
- Before the command starts, the sandbox says it is ready and waits; the harness opens
  ``/proc/<sandbox pid>/root/tmp/home`` one component at a time (``O_NOFOLLOW``) and
  copies in the *seed*: a harness-private directory under ``LOOPBOT_DATA_DIR`` that no
  sandbox ever sees (the restored session, the prompt, the backend's config). Then the
  command runs.
- The harness keeps that directory's descriptor: it holds the tmpfs after the sandbox's
  last process is gone (killed, cancelled, stalled), so the session is read from it after
  the run, with every component opened relative to its parent and ``O_NOFOLLOW``
  (``jobs.agents.session``), and freed when the descriptor is closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from jobs.sandbox.safefs import open_dirs

SEED_PARENT = "sandbox-homes"  # under LOOPBOT_DATA_DIR: the seeds, the harness's own
INSIDE_PARTS = ("tmp", "home")  # HOME inside the sandbox (bwrap.INSIDE_HOME)
_COPY_CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HomeUnreachable(OSError):
    """The sandbox's HOME could not be opened from the harness."""


class HomeLink:
    """One command's HOME: the seed written before it starts (``seed``, a host directory
    under the data directory) and, once the sandbox is up, a descriptor on the HOME
    itself (``fd``), valid until ``close`` even after the sandbox ended."""

    def __init__(self, data_dir: Path, owner: tuple[int, int] | None) -> None:
        parent = data_dir / SEED_PARENT
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _sweep(parent)
        self.seed = Path(tempfile.mkdtemp(prefix=f"seed-{os.getpid()}-", dir=parent))
        self.owner = owner
        self.fd: int | None = None

    def reach(self, pid: int) -> None:
        """Open the HOME of the sandbox whose (host) process ``pid`` is set up and waiting,
        and copy the seed into it. The seed is removed then: nothing of HOME stays on
        disk. Raises ``HomeUnreachable``."""
        try:
            root = os.open(f"/proc/{pid}/root", _DIR & ~os.O_NOFOLLOW)  # a magic link
            try:
                self.fd = open_dirs(root, INSIDE_PARTS)
            finally:
                os.close(root)
            self._copy_in(self.fd)
        except HomeUnreachable:
            raise
        except OSError as exc:
            raise HomeUnreachable(exc.errno, f"the sandbox's HOME: {exc.strerror}") from None
        finally:
            self.drop_seed()

    def _copy_in(self, home: int) -> int:
        """The seed into ``home``; the bytes copied."""
        seed = os.open(self.seed, _DIR)
        try:
            if self.owner is None:
                return copy_tree(seed, home)
            # The tmpfs belongs to the sandbox's user namespace, where root is not mapped
            # (its files would be EOVERFLOW): this thread writes as the sandbox's uid,
            # from a seed that uid can read.
            for path in [self.seed, *self.seed.rglob("*")]:
                os.chown(path, *self.owner, follow_symlinks=False)
            with _as(self.owner):
                return copy_tree(seed, home)
        finally:
            os.close(seed)

    def drop_seed(self) -> None:
        shutil.rmtree(self.seed, ignore_errors=True)

    def close(self) -> None:
        self.drop_seed()
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def __enter__(self) -> HomeLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sweep(parent: Path) -> None:
    """Seeds left by a process that is gone (a worker killed between staging and the
    sandbox's start): they would stay on the disk for good."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            pid = entry.name.split("-")[1] if entry.name.startswith("seed-") else ""
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(entry.path, ignore_errors=True)


@contextlib.contextmanager
def _as(owner: tuple[int, int]) -> Iterator[None]:
    """This thread's file-system uid and gid as ``owner``'s (Linux keeps them per
    thread: the worker's other threads keep theirs), back to what they were after."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = owner
    old_gid = libc.setfsgid(gid)
    old_uid = libc.setfsuid(uid)
    try:
        if libc.setfsuid(-1) != uid or libc.setfsgid(-1) != gid:
            raise HomeUnreachable(errno.EPERM, "the sandbox's HOME: cannot write as its user")
        yield
    finally:
        libc.setfsuid(old_uid)
        libc.setfsgid(old_gid)


def copy_tree(src: int, dst: int) -> int:
    """The regular files and directories under the directory ``src`` (the harness's
    seed) into the directory ``dst``, each made new (``O_EXCL``, never through a link),
    owned by who writes them. Returns the bytes copied."""
    total = 0
    flags = _DIR
    stack = [(os.dup(src), os.dup(dst))]
    try:
        while stack:
            sfd, dfd = stack.pop()
            try:
                for name in sorted(os.listdir(sfd)):
                    st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        os.mkdir(name, 0o700, dir_fd=dfd)
                        child = os.open(name, flags, dir_fd=dfd)
                        stack.append((os.open(name, flags, dir_fd=sfd), child))
                    elif stat.S_ISREG(st.st_mode):
                        total += _copy_file(name, sfd, dfd, st.st_mode & 0o700 | 0o600)
            finally:
                os.close(sfd)
                os.close(dfd)
    except BaseException:
        for sfd, dfd in stack:
            os.close(sfd)
            os.close(dfd)
        raise
    return total


def _copy_file(name: str, sfd: int, dfd: int, mode: int) -> int:
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        dst = os.open(name, flags, mode, dir_fd=dfd)
        try:
            n = 0
            while chunk := os.read(src, _COPY_CHUNK):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(dst, view) :]
                n += len(chunk)
            st = os.fstat(src)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
            return n
        finally:
            os.close(dst)
    finally:
        os.close(src)
