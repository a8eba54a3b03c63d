"""Harness git: how loopbot runs git (never the agent), and the file-system walks it
needs on trees the agent wrote.

Credentials: the installation token reaches git through a credential helper given on
the command line (``-c credential.helper=...``) that reads it from the environment of
that one git process. It is never in a URL, on disk, or in a log. Harness git never
reads configuration from anywhere the agent can write (see jobs/tree/worktree.py), and every
call has a timeout. Mirrors are shared by every work horse on the machine, so their
writers hold ``mirror_lock``. Trees are walked with lstat only (``walk_lstat``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

GIT_TIMEOUT = 600  # network operations (fetch, push) on the mirror
TREE_TIMEOUT = 120  # operations on a worktree the agent wrote: seconds, and CPU seconds
TREE_MEMORY = 2 << 30  # bytes of heap (RLIMIT_DATA) git may take on such a tree
# Ignore and attribute rules: git matches every pattern against every path, so their
# size is a cost the tree sets (250k patterns by 20k files: 30 s). Rule files past these
# sizes are refused, not read.
MAX_RULES_FILE = 256 * 1024
MAX_RULES_TOTAL = 1 << 20
RULE_FILES = (".gitignore", ".gitattributes")
# A path longer than this (bytes, from the worktree's root) is one git cannot see
# (PATH_MAX is 4096): a tree holding one is refused, never committed around.
MAX_PATH_BYTES = 3072
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
_lock_fds: set[int] = set()  # the file locks' descriptors open now (``mirror_lock``)
_fds_lock = threading.Lock()  # a fork waits while one is opened or closed: none is missed


def _forget_locks() -> None:
    """In a forked child (a work horse): none of the parent's mirror locks. A thread of
    the parent (the reconciler, reaping a worktree) may hold one as it forks: the child
    would wait on a thread lock whose owner it does not have, and its copy of the file
    lock's descriptor would keep the mirror locked against every process, itself
    included, for as long as it lives. Closing the copy leaves the parent's lock held."""
    for fd in _lock_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()
    _thread_locks.clear()
    _held.clear()
    global _fds_lock
    _fds_lock = threading.Lock()  # held by the forking thread: a fresh one


os.register_at_fork(
    before=lambda: _fds_lock.acquire(),
    after_in_parent=lambda: _fds_lock.release(),
    after_in_child=_forget_locks,
)
LOCK_TIMEOUT = GIT_TIMEOUT
MAX_GITFILE = 4096


class GitError(RuntimeError):
    pass


@dataclass(frozen=True)
class Checkout:
    """A loop's worktree (jobs/tree/worktree.py makes them)."""

    path: Path
    mirror: Path
    branch: str
    base_sha: str  # default branch head the loop started from
    resumed: bool  # created from the pushed branch


FileState = tuple[int, int, int, int]  # an ignored file's ctime_ns, inode, size, mode


def safe_path() -> str:
    """The worker's PATH without empty, ``.`` or relative entries: git runs with a
    worktree as its directory, where an empty entry would find the agent's ``./git``."""
    entries = [e for e in os.environ.get("PATH", "").split(":") if e.startswith("/")]
    return ":".join(entries) or "/usr/bin:/bin"


def git_binary() -> str:
    """git by absolute path, found on ``safe_path`` only."""
    found = shutil.which("git", path=safe_path())
    if found is None:
        raise GitError("git is not installed (apt-get install git)")
    return found


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def git(
    cwd: Path,
    *args: str,
    token: str | None = None,
    timeout: float = GIT_TIMEOUT,
    check: bool = True,
    git_dir: Path | None = None,
    errors: str = "replace",
    stderr: list[str] | None = None,
) -> str:
    """Run git with loopbot's safety settings; a timeout on every call.

    ``stderr``: a list that gets git's standard error (the token scrubbed), for the
    commands whose answer is there too (a push's ``remote:`` lines).

    ``git_dir`` names the repository explicitly (a worktree's admin directory in the
    mirror) so that git never discovers one from ``cwd``, where the agent writes.
    ``errors="surrogateescape"`` keeps file names that are not UTF-8 exactly as
    ``os.fsdecode`` gives them, to compare with the file system's.
    """
    env = {
        "PATH": safe_path(),
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
    bounded = git_dir is not None
    if git_dir is not None:
        env["GIT_DIR"] = str(git_dir)
        env["GIT_WORK_TREE"] = str(cwd)
        timeout = min(timeout, TREE_TIMEOUT)
    if token:
        env["LOOPBOT_GIT_TOKEN"] = token
    proc = subprocess.Popen(
        [git_binary(), *_SAFE, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if bounded:
        _bound(proc.pid)
    try:
        out, err_bytes = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        raise GitError(f"git {args[0]} timed out after {timeout:.0f}s") from None
    if stderr is not None:
        stderr.append(_scrub(err_bytes.decode(errors="replace"), token))
    if check and proc.returncode != 0:
        err = _scrub(err_bytes.decode(errors="replace").strip(), token)
        raise GitError(f"git {' '.join(args[:2])} failed: {err[-2000:]}")
    return _scrub(out.decode(errors=errors), token) if token else out.decode(errors=errors)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill a git that ran past its timeout, with everything it started, and stop reading.

    Killing git alone is not enough: its remote helper (``git-remote-http``, a child that
    holds git's stdout and stderr) waits on as long as the server holds the connection,
    and reading the pipes to their end waited with it, past any timeout: a push GitHub
    held on the wire stalled the loop for as long (issue 37, item 9). Each process is
    stopped before its children are read, so none forks one that escapes; then all die.
    Not a process group of its own: the work horse's group is what a cancel kills.
    """
    stopped: list[int] = []
    todo = [proc.pid]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in (task / "children").read_text().split()]
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a process outside the tree holds the pipes: leave it
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()  # killed above: it ends at once


def _bound(pid: int) -> None:
    """A tree the agent wrote: git on it is bounded as a sandboxed command is, in heap and
    CPU time (the wall-clock timeout alone leaves the memory unbounded). Set on the
    running process: ``preexec_fn`` is unsafe in a threaded worker and a ``prlimit``
    wrapper costs an exec a call; in the instant before, git has read no rule file. The
    rule files' size caps (``defuse_tree``) come first; this is the backstop."""
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        resource.prlimit(pid, resource.RLIMIT_DATA, (TREE_MEMORY, TREE_MEMORY))
        resource.prlimit(pid, resource.RLIMIT_CPU, (TREE_TIMEOUT, TREE_TIMEOUT))


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
            with _fds_lock:
                fd = os.open(str(mirror) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                _lock_fds.add(fd)
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
            _held[key] = _held.get(key, 1) - 1  # a fork inside the body cleared it there
    finally:
        with _fds_lock:
            if fd in _lock_fds:  # not when a fork inside the body closed it (the child's)
                _lock_fds.discard(fd)
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
        rm = ["rm", "-rf", "--one-file-system", "--", str(path)]
        subprocess.run(rm, capture_output=True, timeout=GIT_TIMEOUT, check=False)
        if path.exists() or path.is_symlink():
            # A directory without write or search permission (``chmod 555`` by its owner,
            # the sandbox's uid, which a non-root worker shares): give them back, again.
            chmod = ["chmod", "-R", "u+rwx", "--", str(path)]
            subprocess.run(chmod, capture_output=True, timeout=GIT_TIMEOUT, check=False)
            subprocess.run(rm, capture_output=True, timeout=GIT_TIMEOUT, check=False)
        if path.exists() or path.is_symlink():
            raise GitError(f"could not remove {path}")


def defuse_tree(root: Path) -> list[str]:
    """Remove what harness git must never meet in the worktree: nested ``.git`` entries
    (repositories with their own config and hooks) and special files. Walks with lstat
    only (``walk_lstat``), never opening a file or following a link. Returns the removed
    paths."""
    removed: list[str] = []
    rules = 0
    base = len(os.fsencode(root))
    for path, st in walk_lstat(root, descend=lambda p, s: p.name != ".git", strict=True):
        mode = st.st_mode
        if len(os.fsencode(path)) - base > MAX_PATH_BYTES:
            raise GitError(
                f"a path in the working tree is longer than {MAX_PATH_BYTES} bytes, "
                "which git cannot see: shorten or remove it"
            )
        if path.parent == root and path.name == ".git":
            continue  # the worktree's own pointer: _restore_gitfile rewrites it
        if path.name == ".git" or not (
            stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)
        ):
            _remove(path)
            removed.append(str(path.relative_to(root)))
        elif path.name in RULE_FILES and stat.S_ISREG(mode):
            rules += st.st_size
            if st.st_size > MAX_RULES_FILE or rules > MAX_RULES_TOTAL:
                raise GitError(
                    f"{path.relative_to(root)}: ignore and attribute files may hold at most "
                    f"{MAX_RULES_FILE // 1024} KiB each and {MAX_RULES_TOTAL // 1024} KiB in "
                    "all (git matches each rule against each path): shorten them"
                )
    return removed


MAX_READ_BYTES = 1 << 20  # files_at: larger files are not read


def has_file_named(mirror: Path, commit: str, name: str) -> bool:
    """Whether ``commit`` has a file called ``name`` anywhere below its root (the root's
    own left out), read from the bare ``mirror``."""
    listed = git(mirror, "ls-tree", "-r", "-z", "--name-only", commit)
    return any(p.endswith("/" + name) for p in listed.split("\0"))


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


def walk_lstat(
    top: Path,
    descend: Callable[[Path, os.stat_result], bool] | None = None,
    *,
    strict: bool = False,
) -> Iterator[tuple[Path, os.stat_result]]:
    """Everything under the directory ``top`` (not ``top`` itself), directories included,
    as (path, lstat): never a link followed, never a file opened. A directory is entered
    after it was yielded, when ``descend`` (asked then) says so: the caller may have
    removed it meanwhile. Iterative, so any depth."""
    stack = [top]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError as exc:
            if strict:
                raise GitError(f"{current} cannot be read ({exc.strerror})") from None
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield path, st
            if stat.S_ISDIR(st.st_mode) and (descend is None or descend(path, st)):
                stack.append(path)


def files_under(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """``top`` if it is not a directory, else every non-directory under it (lstat)."""
    try:
        st = top.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        yield top, st
        return
    yield from ((p, s) for p, s in walk_lstat(top) if not stat.S_ISDIR(s.st_mode))
