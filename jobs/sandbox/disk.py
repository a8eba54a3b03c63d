"""The worktree's walk and its disk charge, and removing a tree however deep: how the harness
measures and removes what the sandbox wrote, with no command running."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

ENTRY_COST = 4096  # what every file or directory in the worktree is charged at least
MAX_DEPTH = 256  # directory levels in a worktree; deeper is a resource limit


class TreeError(Exception):
    """The worktree cannot be walked whole: too deep, or an entry that cannot be read."""


def walk(root: Path) -> Iterator[tuple[int, str, os.stat_result]]:
    """Every entry below ``root`` as (its directory's fd, name, lstat), depth first.

    Directories are opened relative to their parent's descriptor with ``O_NOFOLLOW``, so
    no path is ever longer than a name (a tree past PATH_MAX is walked whole) and no link
    is followed; the stack is explicit, so depth costs no recursion. A tree deeper than
    ``MAX_DEPTH``, or anything that cannot be opened or read, raises ``TreeError``: a
    check that cannot see part of the tree must not pass it.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []
    try:
        fd = os.open(root, flags)
        stack.append((fd, os.scandir(fd)))
        while stack:
            fd, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                os.close(stack.pop()[0])
                continue
            st = entry.stat(follow_symlinks=False)
            yield fd, entry.name, st
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise TreeError(f"directories nested deeper than {MAX_DEPTH} levels")
                child = os.open(entry.name, flags, dir_fd=fd)
                stack.append((child, os.scandir(child)))
    except OSError as exc:
        raise TreeError(f"an entry cannot be read ({exc.strerror})") from None
    finally:
        for fd, _ in stack:
            os.close(fd)


def disk_usage(root: Path, limit: int) -> int:
    """What the tree under ``root`` is charged, in bytes; stops once past ``limit``.

    Each entry costs what it could cost: its allocated blocks or its apparent size,
    whichever is larger (git reads a sparse file whole), and at least one 4 KiB block
    (a million empty files are not free: they use inodes). Raises ``TreeError``.
    """
    total = 0
    for _fd, _name, st in walk(root):
        total += max(st.st_blocks * 512, st.st_size, ENTRY_COST)
        if total > limit:
            return total
    return total


def remove_tree(path: Path) -> None:
    """Remove a tree the sandbox wrote, however deep: Python 3.11's ``shutil.rmtree``
    recurses (a 1,200-level tree raised RecursionError), ``rm -rf`` does not."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False)
