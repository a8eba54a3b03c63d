"""What a worktree holds beside its commits: the files git ignores (dependencies that
``setup`` installed, build output, caches) and what lies in a submodule's directory,
which verify sees and a commit never carries; what ``setup`` and ``verify`` leave
behind that the repository does not ignore, which a commit must not carry either; and
the sweep that leaves a reused worktree holding exactly its index (``remove_unseen``).
``Worktrees`` (jobs/tree/worktree.py) has these as methods; they are kept here, apart
from checkouts, commits and pushes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from jobs.tree.git import (
    Checkout,
    FileState,
    GitError,
    _remove,
    defuse_tree,
    files_under,
    mirror_lock,
)

LEFTOVERS = "loopbot-leftovers"  # a worktree's exclude file, in its git directory
# What stands on disk for each mode of an index entry. A gitlink (a submodule) is a
# directory git never enters: a fresh checkout leaves it empty, and so must a reused one.
_KINDS = {"100644": "file", "100755": "file", "120000": "link", "160000": "gitlink"}


def index_shape(listing: str) -> tuple[dict[str, str], bool]:
    """From ``git ls-files -z -v -s``: what each path may be on disk ("file", "link",
    "gitlink", or "dir" for every directory above an entry), and whether an entry carries
    a bit that makes git look away from the file (skip-worktree, assume-unchanged: any
    tag but ``H``). Slices, not splits: a spare's index has one entry a file."""
    shape: dict[str, str] = {}
    flagged = False
    for item in listing.split("\0"):
        tab = item.find("\t")  # "<tag> <mode> <object> <stage>\t<path>"
        if tab < 0:
            continue
        flagged |= item[0] != "H"
        path = item[tab + 1 :]
        shape[path] = _KINDS.get(item[2:8], "other")
        cut = path.rfind("/")
        while cut > 0 and shape.get(parent := path[:cut]) != "dir":
            shape[parent] = "dir"
            cut = parent.rfind("/")
    return shape, flagged


# What each kind of index path is on disk (``other``, a mode git does not write, fits none).
_ON_DISK = {"dir": "dir", "gitlink": "dir", "file": "file", "link": "link", "other": ""}


def _kinds_on_disk(root: Path, descend: Callable[[str], bool]) -> Iterator[tuple[str, str]]:
    """Everything under ``root`` as (path from the root, "dir"/"file"/"link"/"other")
    from the directory entries' types, never a link followed (``lstat`` only where the
    file system gives no type). A directory is entered after it was yielded when
    ``descend`` says so. Strings, not ``Path`` objects and a ``stat`` a file: this walks
    every file of a spare on the way to a loop's start, ten times faster so."""
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as entries:
                listed = list(entries)
        except OSError as exc:
            raise GitError(f"{rel_dir or root} cannot be read ({exc.strerror})") from None
        for entry in listed:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.is_symlink():
                kind = "link"
            elif entry.is_dir(follow_symlinks=False):
                kind = "dir"
            elif entry.is_file(follow_symlinks=False):
                kind = "file"
            else:
                kind = "other"  # a FIFO, a socket, a device
            yield rel, kind
            if kind == "dir" and descend(rel):
                stack.append(rel)


def _literal_pattern(rel: str) -> str:
    """An exclude line that matches exactly ``rel`` (a directory when it ends in ``/``),
    from the worktree's root: glob characters and trailing spaces escaped."""
    out = "".join("\\" + c if c in "\\*?[]" else c for c in rel)
    stripped = out.rstrip(" ")
    return "/" + stripped + "\\ " * (len(out) - len(stripped))


class TreeFiles:
    """Ignored files and leftovers of a worktree (a part of ``Worktrees``)."""

    def _git(
        self, path: Path, mirror: Path, *args: str, check: bool = True, errors: str = "replace"
    ) -> str:
        raise NotImplementedError  # Worktrees'

    def _restore_gitfile(self, path: Path, mirror: Path) -> None:
        raise NotImplementedError  # Worktrees'

    def _admin_dir(self, path: Path, mirror: Path) -> Path | None:
        raise NotImplementedError  # Worktrees'

    @contextlib.contextmanager
    def _tree(self, checkout: Checkout, *, lock: bool = True) -> Iterator[list[str]]:
        """How every harness git call that reads a worktree starts: the mirror's lock
        held, the tree defused (FIFOs, sockets, devices and nested ``.git`` removed; rule
        files and path lengths checked) and the worktree's ``.git`` put back. Yields
        what defusing removed. ``lock=False`` for a read that touches only this
        worktree and its own index, never the mirror's refs or objects."""
        with mirror_lock(checkout.mirror) if lock else contextlib.nullcontext():
            removed = defuse_tree(checkout.path)
            self._restore_gitfile(checkout.path, checkout.mirror)
            yield removed

    def remove_unseen(self, path: Path, mirror: Path) -> list[str]:
        """Make the worktree at ``path`` hold exactly what its index names, as a fresh
        checkout would: everything else removed, wherever git looks away from it. After
        ``reset --hard`` and ``clean -ffdx`` that is what lies inside a submodule's
        directory (git never enters a gitlink, ``is_clean`` ignores submodules), what
        stands at a gitlink's path that is no directory, names git will not track, and a
        tracked file the index says to skip. A spare is reused by another loop, whose
        setup runs with ``setup_network`` and the repository's cache: nothing the agent
        hid may be there. Returns the removed paths. Call with the mirror's lock held."""
        listing = self._git(path, mirror, "ls-files", "-z", "-v", "-s", errors="surrogateescape")
        shape, flagged = index_shape(listing)
        if flagged:
            # A skip-worktree or assume-unchanged bit: ``reset --hard`` leaves that file
            # as it is. An index rebuilt from HEAD has no bits, and the reset rewrites it.
            admin = self._admin_dir(path, mirror)
            if admin is None:
                raise GitError(f"{path} is not a worktree of {mirror}")
            (admin / "index").unlink(missing_ok=True)
            self._git(path, mirror, "reset", "-q", "--hard")
            listing = self._git(
                path, mirror, "ls-files", "-z", "-v", "-s", errors="surrogateescape"
            )
            shape, flagged = index_shape(listing)
            if flagged:
                raise GitError("the worktree's index keeps skip-worktree bits")
        removed: list[str] = []

        def descend(rel: str) -> bool:
            # Into tracked directories, and into gitlinks to empty them.
            return shape.get(rel) in ("dir", "gitlink")

        for rel, kind in _kinds_on_disk(path, descend):
            expected = shape.get(rel)
            if rel == ".git" or (expected is not None and _ON_DISK[expected] == kind):
                continue  # the worktree's own ``.git`` is _restore_gitfile's
            _remove(path / rel)
            removed.append(rel)
            if expected == "gitlink":
                (path / rel).mkdir()  # empty, as git checks a submodule out
        return removed

    def _others(self, checkout: Checkout, *flags: str) -> list[str]:
        """Untracked paths, a wholly untracked directory as one ``dir/`` entry (call with
        ``_tree`` held)."""
        listed = self._git(
            checkout.path,
            checkout.mirror,
            "ls-files",
            "--others",
            "--exclude-standard",
            "--directory",
            "-z",
            *flags,
        )
        return [p for p in listed.split("\0") if p]

    def untracked(self, checkout: Checkout) -> set[str]:
        """What is untracked and not ignored now (before a harness command runs). Without
        the mirror's lock: it reads only this worktree and its index, and the lock is
        often held by the turn's push, which verify is meant to overlap."""
        with self._tree(checkout, lock=False):
            return set(self._others(checkout))

    def exclude_leftovers(self, checkout: Checkout, before: set[str]) -> list[str]:
        """After ``setup`` or ``verify`` (or a metric command): what it wrote that the
        repository does not ignore (``__pycache__``, build output) and that was not there
        before it ran (``before``: ``untracked``) is its own, not the agent's, and never
        reaches a commit. Each such path is added, anchored and literal, to this
        worktree's own exclude file (in its git directory in the mirror, where neither the
        agent nor another loop writes); from then on harness git ignores it like the
        repository's ignored files. A name no exclude line can hold (a newline in it) is
        deleted instead. The agent's own uncommitted files (a turn a killed worker left)
        were there before, and stay the agent's."""
        path, mirror = checkout.path, checkout.mirror
        with self._tree(checkout, lock=False):  # this worktree and its own exclude file
            admin = self._admin_dir(path, mirror)
            found = [p for p in self._others(checkout) if p not in before]
            lines = []
            for rel in found:
                if "\n" in rel or "\r" in rel:
                    _remove(path / rel.rstrip("/"))
                else:
                    lines.append(_literal_pattern(rel))
            if lines and admin is not None:
                with open(admin / LEFTOVERS, "a", encoding="utf-8", errors="surrogateescape") as f:
                    f.write("".join(line + "\n" for line in lines))
        return found

    def ignored_files(self, checkout: Checkout) -> dict[str, FileState]:
        """Every file git ignores in the worktree, and every file in a submodule's
        directory, with (ctime_ns, inode, size, mode): what verify sees but a commit
        never carries (dependencies, build output, caches). The change time and inode, not
        the modification time: the agent can set a file's mtime (``touch -r``) but not its
        ctime, which any write or ``utime`` moves to now. Without the mirror's lock, as
        ``untracked``: it reads only this worktree and its index (at a turn's start the
        last turn's push may be running)."""
        return self._hidden_files(checkout)[0]

    def _hidden_files(self, checkout: Checkout) -> tuple[dict[str, FileState], list[str]]:
        """``ignored_files``, and the submodules' directories."""
        path = checkout.path
        with self._tree(checkout, lock=False):
            links = self._gitlinks(checkout)
            listed = self._others(checkout, "--ignored") + links
        found: dict[str, FileState] = {}
        for rel in listed:
            top = path / rel
            for file in files_under(top):
                st = file[1]
                found[str(file[0].relative_to(path))] = (
                    st.st_ctime_ns,
                    st.st_ino,
                    st.st_size,
                    st.st_mode,
                )
        return found, links

    def _gitlinks(self, checkout: Checkout) -> list[str]:
        """The submodules' directories: git never looks into them, so what they hold
        counts with the ignored files (call with ``_tree`` held)."""
        listing = self._git(
            checkout.path, checkout.mirror, "ls-files", "-z", "-v", "-s", errors="surrogateescape"
        )
        if " 160000 " not in listing:
            return []  # most repositories: no submodule, nothing to parse
        shape, _ = index_shape(listing)
        return [rel for rel, kind in shape.items() if kind == "gitlink"]

    def missing_ignored(self, checkout: Checkout, before: dict[str, FileState]) -> list[str]:
        """Ignored files of ``before`` that are gone (the agent deleted what setup made)."""
        return sorted(rel for rel in before if not os.path.lexists(checkout.path / rel))

    def purge_ignored(self, checkout: Checkout, before: dict[str, FileState]) -> list[str]:
        """Remove the ignored files (and files in submodules' directories) that are new
        or changed since ``before``: files the agent left where git does not look. verify
        would see them and the commit would not, so a verify that passes only because of
        them proves nothing about the commit (a ``calc/`` package in an ignored directory
        shadowing ``calc.py``)."""
        removed = []
        found, links = self._hidden_files(checkout)
        keep = {checkout.path, *(checkout.path / rel for rel in links)}  # as checked out
        for rel, state in found.items():
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
            while parent not in keep and checkout.path in parent.parents:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent
        return sorted(removed)
