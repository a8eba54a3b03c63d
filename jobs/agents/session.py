"""A backend CLI's session files, saved with the loop after each turn and restored on any
worker: a bounded tar.gz of what the agent wrote to HOME, whichever backend wrote it."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path

# Members of a packed session that the harness writes (the agent's files never have these
# names at the top: a planted one is not saved).
META = "loopbot-"
CWD_MEMBER = "loopbot-cwd"  # in a packed session: the working directory it ran in
MAX_SESSION = 64 << 20  # bytes of session files saved with the loop (Redis holds them)
MAX_SESSION_ENTRIES = 10_000  # files and directories in a saved session
MAX_SESSION_DEPTH = 16  # directory levels in a saved session


class SessionTooLarge(Exception):
    pass


def pack(
    root: Path,
    paths: Iterable[Path],
    cwd: str,
    limit: int = MAX_SESSION,
    meta: dict[str, bytes] | None = None,
) -> bytes:
    """``paths`` (files or directories under ``root``, in the agent's HOME) as a tar.gz,
    with the working directory the session ran in and the harness's own ``meta``
    (``loopbot-<name>`` members, read back by ``unpack``). Raises ``SessionTooLarge`` past
    ``limit`` bytes of files, ``MAX_SESSION_ENTRIES`` entries or ``MAX_SESSION_DEPTH``
    levels: the agent writes HOME, and what is packed sits in the worker's memory and
    then in Redis. Only regular files and directories, never followed through a link."""
    buf = io.BytesIO()
    total = entries = 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        # Where the session ran, for the next worker; and what the harness keeps with it.
        for member, data in {CWD_MEMBER: cwd.encode(), **(meta or {})}.items():
            info = tarfile.TarInfo(member if member.startswith(META) else META + member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        todo = [(path, 0) for path in reversed(list(paths))]
        while todo:  # a walk of our own: no recursion a deep tree could exhaust
            path, depth = todo.pop()
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            entries += 1
            if entries > MAX_SESSION_ENTRIES or depth > MAX_SESSION_DEPTH:
                raise SessionTooLarge(
                    f"the agent's session files passed {MAX_SESSION_ENTRIES} entries or "
                    f"{MAX_SESSION_DEPTH} levels"
                )
            name = str(path.relative_to(root))
            if name.startswith(META) and "/" not in name:
                continue  # the harness's name: a file the agent planted is not saved
            if stat.S_ISDIR(st.st_mode):
                tar.addfile(_info(name, st, tarfile.DIRTYPE))
                todo += [(p, depth + 1) for p in sorted(path.iterdir(), reverse=True)]
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > limit:
                    raise SessionTooLarge(f"the agent's session files passed {limit >> 20} MiB")
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f:
                    now = os.fstat(f.fileno())
                    if not stat.S_ISREG(now.st_mode) or now.st_size != st.st_size:
                        raise SessionTooLarge("a session file changed while it was saved")
                    tar.addfile(_info(name, now, tarfile.REGTYPE), f)
            # never a link, a device or a FIFO the agent planted
    return buf.getvalue()


def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    info.mode = st.st_mode & 0o755
    info.mtime = int(st.st_mtime)
    return info


def unpack(
    data: bytes,
    root: Path,
    home: Path,
    owner: tuple[int, int] | None,
    meta: dict[str, bytes] | None = None,
) -> str | None:
    """``pack``'s archive back under ``root`` in a fresh ``home``. Returns the working
    directory the session ran in before (None: not recorded); the harness's other
    members go into ``meta`` (by name, without the prefix), never into HOME."""
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(root, filter="data")  # no absolute paths, links or devices
    before = None
    for marker in sorted(root.glob(META + "*")):
        if marker.is_file() and not marker.is_symlink():
            if marker.name == CWD_MEMBER:
                before = marker.read_text(errors="replace")[:4096]
            elif meta is not None:
                meta[marker.name.removeprefix(META)] = marker.read_bytes()[: 1 << 20]
            marker.unlink()
    give(home, owner)
    return before


def give(home: Path, owner: tuple[int, int] | None) -> None:
    """Everything under ``home`` to the sandbox's uid (the harness wrote it as root)."""
    if owner is not None:
        for path in [home, *home.rglob("*")]:
            os.chown(path, *owner, follow_symlinks=False)


def moved_note(before: str | None, cwd: str) -> str:
    """The first line of a resumed turn's prompt when the worktree moved (another worker
    with another data directory): the session's history names the old path, and a model
    that trusts it edits files that are not there."""
    if before is None or before == cwd:
        return ""
    return (
        f"(loopbot: the repository is now at {cwd}; in the turns before it was at "
        f"{before}. Use the new path.)\n\n"
    )
