"""File access from the harness to a directory an untrusted party writes (the worktree).

The harness runs with the worker's privileges, so each read or write of a worktree path
here:

- stays inside ``root``: a path is normalised lexically (``..`` never climbs a symlink),
  then walked one component at a time with ``lstat``. A symlink is followed only when its
  whole target (``realpath``) stays inside ``root`` and outside ``root/.git``; for a write
  the last component must not be a symlink at all (edit its target instead).
- opens only what it checked: the walk is done again with ``openat`` and ``O_NOFOLLOW``
  on every component from ``root``, so a symlink swapped in meanwhile fails to open
  instead of being followed.
- never blocks or has side effects on special files: files are opened ``O_NONBLOCK``
  (a FIFO opens at once) and ``O_NOCTTY``, after an ``lstat`` that refuses anything but
  a regular file, and ``fstat`` checks the file again once open.
- never writes a file with other hard links (its other names may be anywhere), and gives
  every file and directory it creates to ``owner``, the sandbox's user, when asked.
- reads at most what it will use, and writes a bounded amount; a directory listing
  stops after a bounded number of entries.

Errors the caller should show to whoever gave the path are :class:`AccessError`;
unexpected ``OSError`` can still escape and should be reported the same way.
Pure standard library, no loopbot imports.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_WRITE = 4 * 1024 * 1024
LIST_LIMIT = 1000  # entries shown by list_dir
LIST_SCAN = 50_000  # entries list_dir looks at, shown or counted, before it stops

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class AccessError(Exception):
    """A refused or failed access, worded for whoever asked for the path."""


class TooLarge(AccessError):
    """More to write than the limit allows."""


@dataclass(frozen=True)
class Read:
    data: bytes
    size: int  # the file's size when it was opened; more than len(data) when cut

    @property
    def truncated(self) -> bool:
        return self.size > len(self.data)


@dataclass(frozen=True)
class Listing:
    entries: list[str]  # paths relative to the listed directory, directories end in "/"
    omitted: int  # entries seen but not shown
    incomplete: bool  # the scan stopped early: there are more than ``omitted`` left out


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _in_git(root: str, path: str) -> bool:
    return _inside(os.path.join(root, ".git"), path)


def resolve(root: Path, raw: str, *, write: bool = False) -> Path:
    """The real path inside ``root`` that ``raw`` (relative to ``root``, or absolute)
    names, with no symlink left in it. Refuses paths outside ``root``, ``root/.git`` and
    anything under it, and symlinks leading out of either; with ``write``, also a
    symlink as the last component. Components that do not exist yet are kept as given.
    """
    base = os.path.realpath(root)
    if "\0" in raw:
        raise AccessError("a path cannot contain a NUL byte")
    joined = os.path.normpath(raw if os.path.isabs(raw) else os.path.join(base, raw))
    if not _inside(base, joined):
        raise AccessError(f"{raw} is outside the repository at {base}")
    parts = [p for p in os.path.relpath(joined, base).split("/") if p not in ("", ".")]
    if write and not parts:
        raise AccessError("the repository's root directory is not a file")
    cur = base
    for i, part in enumerate(parts):
        nxt = os.path.join(cur, part)
        if _in_git(base, nxt):
            raise AccessError("the .git directory is managed by the harness")
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return Path(cur, *parts[i:])
        except NotADirectoryError:
            raise AccessError(f"{os.path.relpath(cur, base)} is not a directory") from None
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        shown = os.path.relpath(nxt, base)
        target = os.path.realpath(nxt)
        if not _inside(base, target):
            raise AccessError(f"{shown} is a symbolic link that leads outside the repository")
        if _in_git(base, target):
            raise AccessError(f"{shown} is a symbolic link into .git, which the harness manages")
        if write and i == len(parts) - 1:
            raise AccessError(
                f"{shown} is a symbolic link to {os.path.relpath(target, base)}; "
                "edit that path instead"
            )
        cur = target
    return Path(cur)


def _open_parent(
    path: Path, root: Path | None, *, create: bool = False, owner: tuple[int, int] | None = None
) -> int:
    """An fd on ``path``'s parent directory. With ``root``, walked down from it with
    ``O_NOFOLLOW`` on every component (``create``: making missing ones, given to
    ``owner``); without, the parent is trusted and opened by name."""
    if root is None:
        return os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    base = Path(os.path.realpath(root))
    try:
        parts = path.parent.relative_to(base).parts
    except ValueError:
        raise AccessError(f"{path} is outside {base}") from None
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    done = base
    try:
        for part in parts:
            done = done / part
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise AccessError(f"{done.relative_to(base)} does not exist") from None
                made = True
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    made = False  # someone else made it: the open below checks what it is
                nfd = _open_dir(part, fd, done.relative_to(base))
                if made and owner is not None:
                    os.fchown(nfd, *owner)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise AccessError(
                    f"{done.relative_to(base)} is not a directory (or is a symbolic link)"
                ) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dirs(
    dir_fd: int,
    parts: tuple[str, ...] | list[str],
    *,
    create: bool = False,
    owner: tuple[int, int] | None = None,
) -> int:
    """An fd on the directory ``parts`` below ``dir_fd``, each component opened relative
    to the one before with ``O_NOFOLLOW``: a symlink or a non-directory anywhere on the
    way fails (ELOOP, ENOTDIR), it is never followed. ``create``: missing components are
    made (0700, given to ``owner``). Raises ``OSError``; a bad name is ``ValueError``."""
    fd = os.dup(dir_fd)
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part or "\0" in part:
                raise ValueError(f"not a name: {part!r}")
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                if owner is not None:
                    os.fchown(nfd, *owner)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(name: str, dir_fd: int, shown: Path | str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise AccessError(f"{shown} is not a directory (or is a symbolic link)") from None


def _shown(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.relative_to(os.path.realpath(root)).as_posix() or "."
        except ValueError:
            pass
    return str(path)


def _check_regular(mode: int, shown: str) -> None:
    if not stat.S_ISREG(mode):
        raise AccessError(f"{shown} is {_kind(mode)}; only regular files can be used here")


def read_file(path: Path, max_bytes: int, *, root: Path | None = None, whole: bool = False) -> Read:
    """At most ``max_bytes`` from the start of the regular file ``path`` (never a symlink,
    FIFO, socket, device or directory), and the file's size. With ``whole``, a file
    larger than ``max_bytes`` is refused (:class:`TooLarge`) without reading any of it."""
    shown = _shown(path, root)
    parent = _open_parent(path, root)
    try:
        try:
            st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            raise AccessError(f"{shown} does not exist") from None
        _check_regular(st.st_mode, shown)  # before open: opening a device can do things
        try:
            fd = os.open(path.name, _READ_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise AccessError(f"{shown} is a symbolic link") from None
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        _check_regular(st.st_mode, shown)
        if whole and st.st_size > max_bytes:
            raise TooLarge(f"{shown} is {st.st_size} bytes, more than the limit of {max_bytes}")
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return Read(data, max(st.st_size, len(data)))
    finally:
        os.close(fd)


def write_file(
    path: Path,
    data: bytes,
    owner: tuple[int, int] | None = None,
    *,
    root: Path | None = None,
    max_bytes: int = MAX_WRITE,
) -> bool:
    """Replace the contents of the regular file ``path`` with ``data``, creating it (and,
    with ``root``, its missing parent directories) if needed; every file and directory
    made is given to ``owner`` (uid, gid) when that is not None. Never follows a symlink,
    opens a FIFO or device, or writes a file with other hard links. True if it created
    the file."""
    shown = _shown(path, root)
    if len(data) > max_bytes:
        raise TooLarge(
            f"refusing to write {len(data)} bytes to {shown}: the limit is {max_bytes} bytes"
        )
    parent = _open_parent(path, root, create=root is not None, owner=owner)
    try:
        try:
            st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
            _check_regular(st.st_mode, shown)
        except FileNotFoundError:
            pass
        created = True
        try:
            fd = os.open(path.name, _WRITE_FLAGS | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=parent)
        except FileExistsError:
            created = False
            try:
                fd = os.open(path.name, _WRITE_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                    raise
                raise AccessError(f"{shown} is not a regular file") from None
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        _check_regular(st.st_mode, shown)
        if st.st_nlink > 1:
            raise AccessError(f"{shown} has other hard links; refusing to write through them")
        if created and owner is not None:
            os.fchown(fd, *owner)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return created


def read_text(
    path: Path,
    max_bytes: int,
    *,
    root: Path | None = None,
    whole: bool = False,
    errors: str = "replace",
) -> tuple[str, Read]:
    """The first ``max_bytes`` of ``path`` decoded as UTF-8 (see :func:`read_file`)."""
    got = read_file(path, max_bytes, root=root, whole=whole)
    return got.data.decode("utf-8", errors), got


def write_text(
    path: Path,
    content: str,
    owner: tuple[int, int] | None = None,
    *,
    root: Path | None = None,
    max_bytes: int = MAX_WRITE,
) -> bool:
    """:func:`write_file` with ``content`` encoded as UTF-8 (lone surrogates from a
    ``surrogateescape`` decode become the bytes they stood for)."""
    if len(content) > max_bytes:  # never encode something far too big
        raise TooLarge(
            f"refusing to write {len(content)} characters to {_shown(path, root)}: "
            f"the limit is {max_bytes} bytes"
        )
    try:
        data = content.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise AccessError(f"the text is not valid Unicode: {exc.reason}") from None
    return write_file(path, data, owner, root=root, max_bytes=max_bytes)


@dataclass
class _Entry:
    parts: tuple[str, ...]  # path below the listed directory
    is_dir: bool
    link: str | None  # the target, for a symlink
    shown: bool
    children: list[_Entry]


def list_dir(
    path: Path,
    *,
    root: Path | None = None,
    depth: int = 2,
    limit: int = LIST_LIMIT,
    scan: int = LIST_SCAN,
) -> Listing:
    """Entries of the directory ``path`` up to ``depth`` levels deep, skipping any
    ``.git`` and never following a symlink (shown as ``name -> target``). Shallower
    entries are chosen first, so a crowded subdirectory cannot hide the top level; the
    result is depth first, sorted by name in each directory. Shows at most ``limit``
    entries and looks at no more than ``scan``: a huge tree costs a bounded amount."""
    if root is not None and str(path) == os.path.realpath(root):
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        parent = _open_parent(path, root)
        try:
            top = _open_dir(path.name, parent, _shown(path, root))
        finally:
            os.close(parent)
    tree = _Entry((), True, None, True, [])
    seen = shown = omitted = 0
    incomplete = False
    try:
        level = [tree]
        for _ in range(depth):
            below: list[_Entry] = []
            for d in level:
                if incomplete:
                    break
                try:
                    fd = _open_below(top, d.parts)
                except OSError:
                    continue  # changed meanwhile, or unreadable: listed, not entered
                try:
                    found: list[tuple[str, bool, bool]] = []
                    with os.scandir(fd) as it:
                        for e in it:
                            if e.name == ".git":
                                continue
                            if seen >= scan:
                                incomplete = True
                                break
                            seen += 1
                            found.append((e.name, e.is_dir(follow_symlinks=False), e.is_symlink()))
                    found.sort()
                    for name, is_dir, is_link in found:
                        link = _readlink(name, fd) if is_link else None
                        child = _Entry((*d.parts, name), is_dir, link, shown < limit, [])
                        if child.shown:
                            shown += 1
                            d.children.append(child)
                        else:
                            omitted += 1
                        if is_dir:
                            below.append(child)
                finally:
                    os.close(fd)
            level = below
    finally:
        os.close(top)
    entries: list[str] = []

    def render(d: _Entry) -> None:
        for c in d.children:
            name = "/".join(c.parts)
            if c.link is not None:
                entries.append(f"{name} -> {c.link}")
            else:
                entries.append(name + ("/" if c.is_dir else ""))
            render(c)

    render(tree)
    return Listing(entries, omitted, incomplete)


def _open_below(top: int, parts: tuple[str, ...]) -> int:
    fd = os.dup(top)
    for part in parts:
        try:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def _readlink(name: str, dir_fd: int) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)[:200]
    except OSError:
        return "?"
