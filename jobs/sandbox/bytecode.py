"""The bytecode of the system's Pythons, where the sandbox's Python looks for it.

The sandbox sets ``PYTHONPYCACHEPREFIX`` (bwrap.py): Python reads bytecode only under
that directory, never from a ``__pycache__`` beside a source, so an unchecked ``.pyc``
committed in the worktree cannot run instead of its source. With the prefix empty and
nothing written to it (``PYTHONDONTWRITEBYTECODE``), every Python start compiled each
standard-library module it imported, again (``python -m unittest``: about 0.13 s of CPU
instead of 0.02 s, in every verify).

``tree()`` is a directory laid out as the prefix wants (``usr/lib/python3.11/unittest/
case.cpython-311.pyc``) whose entries are symlinks to the bytecode that ships under
/usr (``/usr/lib/python3.11/unittest/__pycache__/case.cpython-311.pyc``); the sandbox
mounts it read-only at ``<prefix>/usr``. It mirrors nothing but /usr, which the sandbox
already has read-only: the worktree's sources are never under it, so they are compiled as
before. Python checks a (timestamp) ``.pyc`` against its source's mtime and size, so a
link to a stale or missing file costs a compile, never a wrong module.

Built once per machine and user (about 0.5 s of CPU: two thousand links), under /tmp
with the usual care for a shared directory: made private, filled, then renamed into
place; used only when it is a directory (not a link) owned by this user and writable by
no one else.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

# Where the system's Pythons keep their standard library and packages.
ROOTS = (Path("/usr/lib"), Path("/usr/local/lib"))
PARENT = Path(tempfile.gettempdir())


def _libraries() -> list[Path]:
    return sorted(p for root in ROOTS if root.is_dir() for p in root.glob("python3*"))


def _fingerprint(libraries: list[Path]) -> str:
    """Changes when a Python is added or removed, or a library directory's own entries
    change (a package installed or removed): a new tree is built then."""
    h = hashlib.sha256()
    for lib in libraries:
        h.update(f"{lib}\0{lib.stat().st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def _usable(path: Path) -> bool:
    """A directory of ours that no one else can change, in a parent where no one else can
    move it away (not writable by others, or sticky as /tmp is)."""
    try:
        st, parent = path.lstat(), path.parent.stat()
    except OSError:
        return False
    others_write = stat.S_IWGRP | stat.S_IWOTH
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and not st.st_mode & others_write
        and (not parent.st_mode & others_write or bool(parent.st_mode & stat.S_ISVTX))
    )


def _fill(into: Path, libraries: list[Path]) -> None:
    for lib in libraries:
        for dirpath, _dirs, files in os.walk(lib):
            if os.path.basename(dirpath) != "__pycache__":
                continue
            source_dir = os.path.dirname(dirpath)
            target = into / source_dir.lstrip("/")
            target.mkdir(mode=0o755, parents=True, exist_ok=True)
            for name in files:
                if name.endswith(".pyc"):
                    os.symlink(os.path.join(dirpath, name), target / name)


@functools.cache
def _place() -> Path | None:
    libraries = _libraries()
    if not libraries:
        return None
    return PARENT / f"loopbot-bytecode-{os.getuid()}-{_fingerprint(libraries)}"


def tree() -> Path | None:
    """The directory to mount at ``<prefix>/usr`` (its ``usr`` part), or None when there
    is nothing to link or it cannot be made (the sandbox then compiles, as before).
    Looked at on every call, two ``stat``s: a cleaner of /tmp may have removed it."""
    final = _place()
    if final is None:
        return None
    if not _usable(final):
        _build(final)
    return final / "usr" if _usable(final) else None


def _build(final: Path) -> None:
    try:
        work = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=final.parent))
    except OSError:
        return
    try:
        work.chmod(0o755)  # the sandbox's uid traverses it
        _fill(work, _libraries())
        (work / "usr").mkdir(mode=0o755, exist_ok=True)
        os.rename(work, final)  # another process may have won: then its tree is used
    except OSError:
        pass
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
