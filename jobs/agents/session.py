"""A backend CLI's session files, saved with the loop after each turn and restored on any
worker: a bounded tar.gz of what the agent wrote to HOME, whichever backend wrote it.

HOME is the sandbox's (``jobs.sandbox.home``): the agent owns everything in it, so
``pack`` reads it through a descriptor, every directory on the way opened relative to the
one before with ``O_NOFOLLOW`` (a link the agent planted at ``~/.codex``, or deeper, is
never followed: the red team's led the worker, as root, into another loop's worktree), and
only regular files, opened ``O_NOFOLLOW | O_NONBLOCK`` and checked again once open.
``unpack`` writes into the harness's seed the same way: each file made new, never through
a link, and nothing but regular files and directories with plain names."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

from jobs.sandbox.safefs import open_dirs

# Members of a packed session that the harness writes (the agent's files never have these
# names at the top: a planted one is not saved).
META = "loopbot-"
CWD_MEMBER = "loopbot-cwd"  # in a packed session: the working directory it ran in
MAX_SESSION = 64 << 20  # bytes of session files saved with the loop (Redis holds them)
MAX_SESSION_ENTRIES = 10_000  # files and directories in a saved session
MAX_SESSION_DEPTH = 16  # directory levels in a saved session
MAX_META = 1 << 20  # bytes of one of the harness's own members
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class SessionTooLarge(Exception):
    pass


class BadSession(Exception):
    """A saved session that is not what ``pack`` writes (a forged archive)."""


def parts_of(path: str) -> tuple[str, ...]:
    """A path relative to HOME as its components (``.codex/sessions``)."""
    return tuple(p for p in path.split("/") if p not in ("", "."))


def pack(
    home: int,
    root: str,
    cwd: str,
    *,
    pick: Callable[[str], bool] | None = None,
    limit: int = MAX_SESSION,
    meta: dict[str, bytes] | None = None,
) -> bytes:
    """What is under ``root`` (a path relative to the HOME open at ``home``; with
    ``pick``, only the entries of ``root`` whose name it takes) as a tar.gz, with the
    working directory the session ran in and the harness's own ``meta``
    (``loopbot-<name>`` members, read back by ``unpack``). A ``root`` that is missing, or
    not a directory, or has a link anywhere on its way, holds nothing. Raises
    ``SessionTooLarge`` past ``limit`` bytes of files, ``MAX_SESSION_ENTRIES`` entries or
    ``MAX_SESSION_DEPTH`` levels: the agent writes HOME, and what is packed sits in the
    worker's memory and then in Redis. Only regular files and directories, never a link,
    a FIFO or a device, and never through a link."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        # Where the session ran, for the next worker; and what the harness keeps with it.
        for member, data in {CWD_MEMBER: cwd.encode(), **(meta or {})}.items():
            info = tarfile.TarInfo(member if member.startswith(META) else META + member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        try:
            top = open_dirs(home, parts_of(root))
        except (OSError, ValueError):
            top = None  # nothing there, or a link on the way: never followed
        if top is not None:
            try:
                _walk(tar, top, pick, limit)
            finally:
                os.close(top)
    return buf.getvalue()


def _walk(tar: tarfile.TarFile, top: int, pick: Callable[[str], bool] | None, limit: int) -> None:
    """Every directory and regular file below ``top`` into ``tar``: a walk of its own (no
    recursion a deep tree could exhaust, no descriptor held per directory waiting its
    turn), each directory opened again from ``top`` one component at a time with
    ``O_NOFOLLOW``, and listed as it is read (a million names are never held)."""
    total = entries = 0
    todo: list[tuple[str, ...]] = [()]
    while todo:
        parts = todo.pop()
        try:
            fd = open_dirs(top, parts)
        except OSError:
            continue  # turned into a link or a file meanwhile: not followed
        try:
            with os.scandir(fd) as listing:
                for entry in listing:
                    name = entry.name
                    if not parts and pick is not None and not pick(name):
                        continue
                    if not parts and name.startswith(META):
                        continue  # the harness's name: a file the agent planted is not saved
                    entries += 1
                    if entries > MAX_SESSION_ENTRIES or len(parts) >= MAX_SESSION_DEPTH:
                        raise SessionTooLarge(
                            f"the agent's session files passed {MAX_SESSION_ENTRIES} entries "
                            f"or {MAX_SESSION_DEPTH} levels"
                        )
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    member = "/".join((*parts, name))
                    if stat.S_ISDIR(st.st_mode):
                        tar.addfile(_info(member, st, tarfile.DIRTYPE))
                        todo.append((*parts, name))
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
                        if total > limit:
                            raise SessionTooLarge(
                                f"the agent's session files passed {limit >> 20} MiB"
                            )
                        _add_file(tar, fd, name, member, st)
                    # never a link, a device or a FIFO the agent planted
        finally:
            os.close(fd)


def _add_file(
    tar: tarfile.TarFile, dir_fd: int, name: str, member: str, st: os.stat_result
) -> None:
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError:
        return  # a link or gone: not followed
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return  # swapped between the look and the open: not this one
        if now.st_nlink > 1:
            return  # its other names may be anywhere (no CLI saves a hard link)
        if now.st_size != st.st_size:
            raise SessionTooLarge("a session file changed while it was saved")
        tar.addfile(_info(member, now, tarfile.REGTYPE), f)


def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    info.mode = st.st_mode & 0o755
    info.mtime = int(st.st_mtime)
    return info


def unpack(
    data: bytes,
    home: Path,
    root: str,
    meta: dict[str, bytes] | None = None,
) -> str | None:
    """``pack``'s archive back under ``root`` (relative to ``home``, the harness's seed
    of a fresh HOME). Returns the working directory the session ran in before (None: not
    recorded); the harness's other members go into ``meta`` (by name, without the
    prefix), never into HOME. Raises ``BadSession`` for what ``pack`` never writes: a
    link, a device, an absolute or climbing name, more than its limits."""
    before = None
    total = entries = 0
    base = os.open(home, _DIR)
    try:
        top = open_dirs(base, parts_of(root), create=True)
    except (OSError, ValueError) as exc:
        raise BadSession(f"the session's directory cannot be made: {exc}") from None
    finally:
        os.close(base)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                entries += 1
                total += max(member.size, 0)
                if entries > MAX_SESSION_ENTRIES + 64 or total > MAX_SESSION + 64 * MAX_META:
                    raise BadSession("the saved session is larger than a session can be")
                name = member.name
                if name.startswith(META) and "/" not in name:
                    if member.isreg() and member.size <= MAX_META:
                        got = tar.extractfile(member)
                        text = got.read() if got is not None else b""
                        if name == CWD_MEMBER:
                            before = text[:4096].decode(errors="replace")
                        elif meta is not None:
                            meta[name.removeprefix(META)] = text
                    continue
                parts = tuple(name.split("/"))
                if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                    raise BadSession(f"a saved session names {name[:100]!r}")
                if len(parts) > MAX_SESSION_DEPTH + 1:
                    raise BadSession("the saved session is deeper than a session can be")
                if member.isdir():
                    os.close(open_dirs(top, parts, create=True))
                elif member.isreg():
                    _write(tar, member, top, parts)
                else:
                    raise BadSession(f"a saved session holds {name[:100]!r}, not a file")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BadSession(f"the saved session cannot be read: {exc}") from None
    finally:
        os.close(top)
    return before


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, top: int, parts: tuple[str, ...]) -> None:
    parent = open_dirs(top, parts[:-1], create=True)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(parts[-1], flags, member.mode & 0o700 | 0o600, dir_fd=parent)
    finally:
        os.close(parent)
    with os.fdopen(fd, "wb") as out:
        got = tar.extractfile(member)
        if got is not None:
            while chunk := got.read(1 << 20):
                out.write(chunk)
        out.flush()
        os.utime(out.fileno(), (member.mtime, member.mtime))


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
