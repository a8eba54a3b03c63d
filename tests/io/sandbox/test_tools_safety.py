"""The editor tool touches worktree files from the harness process: against real files,
it never hangs, never reads or writes more than it uses, and never leaves the worktree."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.agents.tools import MAX_VIEW, ToolBox
from jobs.sandbox import safefs
from jobs.sandbox.bwrap import Sandbox
from tests.helpers import worker_settings

EDITOR = "str_replace_based_edit_tool"
SECRET = "TOP-SECRET-CONTENTS\n"
ALL_COMMANDS: list[dict[str, Any]] = [
    {"command": "view"},
    {"command": "create", "file_text": "pwned\n"},
    {"command": "str_replace", "old_str": "TOP", "new_str": "pwned"},
    {"command": "insert", "insert_line": 0, "insert_text": "pwned"},
]


class OwnedSandbox(Sandbox):
    """A real sandbox whose files must be handed to another user (as when run as root)."""

    owner: tuple[int, int] | None = None

    @property
    def file_owner(self) -> tuple[int, int] | None:
        return self.owner


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    wt = tmp_path / "data" / "worktrees" / "issue-1"
    wt.mkdir(parents=True)
    (wt / "hello.txt").write_text("hi\n")
    return wt


@pytest.fixture
def sandbox(tmp_path: Path, worktree: Path) -> OwnedSandbox:
    return OwnedSandbox(worktree, settings=worker_settings(tmp_path))


@pytest.fixture
def tools(worktree: Path, sandbox: OwnedSandbox) -> ToolBox:
    return ToolBox(worktree, sandbox)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    f = tmp_path / "secret.txt"
    f.write_text(SECRET)
    return f


def edit(tools: ToolBox, path: str, timeout: float = 10, **args: Any) -> tuple[str, bool]:
    """One editor call in a thread, failing the test if it does not come back."""
    result: list[tuple[str, bool]] = []
    t = threading.Thread(target=lambda: result.append(tools.run(EDITOR, {"path": path, **args})))
    t.daemon = True  # a hung open() must not keep pytest alive
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"editor {args} on {path} hung"
    return result[0]


def ok(tools: ToolBox, path: str, **args: Any) -> str:
    text, is_error = edit(tools, path, **args)
    assert not is_error, text
    return text


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.mark.parametrize("args", ALL_COMMANDS, ids=lambda a: a["command"])
def test_fifo_in_worktree_is_refused_without_blocking(
    tools: ToolBox, worktree: Path, args: dict[str, Any]
) -> None:
    os.mkfifo(worktree / "pipe")
    started = time.monotonic()
    text, is_error = edit(tools, "pipe", **args)
    assert is_error and "FIFO" in text
    assert time.monotonic() - started < 2
    with pytest.raises(safefs.AccessError, match="FIFO"):
        safefs.read_text(worktree / "pipe", 100)


def test_git_replaced_by_a_fifo(tools: ToolBox, worktree: Path) -> None:
    os.mkfifo(worktree / ".git")
    for path in (".git", ".git/config", str(worktree / ".git"), "sub/../.git/HEAD"):
        for args in ALL_COMMANDS:
            text, is_error = edit(tools, path, **args)
            assert is_error and ".git" in text, (path, args, text)
    text, is_error = edit(tools, ".", command="view")
    assert not is_error and text == "hello.txt"
    ok(tools, "a", command="create", file_text="x")


def test_huge_sparse_file_costs_bounded_memory_and_time(tools: ToolBox, worktree: Path) -> None:
    big = worktree / "big.bin"
    big.touch()
    os.truncate(big, 10 * 1024**3)  # 10 GB of nothing: free for the agent to make
    with_lines = worktree / "lines.txt"  # 40 MB of one-character lines
    with_lines.write_bytes(b"x\n" * (20 * 1024 * 1024))
    with_lines.with_name("one-line.txt").write_bytes(b"y" * (40 * 1024 * 1024))
    # Reset the peak so VmHWM measures these views alone (when the kernel allows it).
    try:
        Path("/proc/self/clear_refs").write_text("5")
        peak_reset = True
    except OSError:
        peak_reset = False
    before = rss_kib()
    started = time.monotonic()
    for name in ("big.bin", "lines.txt", "one-line.txt"):
        text, is_error = edit(tools, name, command="view")
        assert not is_error and len(text) < MAX_VIEW + 500
        assert "[truncated" in text and "bytes" in text
        ok(tools, name, command="view", view_range=[1, 1])
    text, _ = edit(tools, "lines.txt", command="view", view_range=[1000, 1002])
    assert text.splitlines()[0] == "  1000\tx"
    text, is_error = edit(tools, "lines.txt", command="view", view_range=[30_000_000, -1])
    assert is_error and "sed" in text
    assert str(10 * 1024**3) in edit(tools, "big.bin", command="view")[0]
    for args in ALL_COMMANDS[2:]:
        text, is_error = edit(tools, "big.bin", **args)
        assert is_error and "bash" in text
    elapsed = time.monotonic() - started
    grown_mib = (rss_kib() - before) / 1024
    assert elapsed < 5
    assert grown_mib < 50
    if peak_reset:
        assert (rss_kib("VmHWM") - before) / 1024 < 50
    assert big.stat().st_size == 10 * 1024**3


def test_symlink_to_a_file_outside_cannot_be_used(
    tools: ToolBox, worktree: Path, secret: Path
) -> None:
    (worktree / "link").symlink_to(secret)
    (worktree / "sub").mkdir()
    (worktree / "sub" / "relative").symlink_to("../../../../secret.txt")
    (worktree / "chain").symlink_to("sub/relative")  # inside, then out
    for path in ("link", "sub/relative", "chain", str(worktree / "link")):
        for args in ALL_COMMANDS:
            text, is_error = edit(tools, path, **args)
            assert is_error and "outside the repository" in text, (path, args, text)
            assert "TOP-SECRET" not in text
    assert secret.read_text() == SECRET
    assert (worktree / "link").is_symlink()


def test_paths_outside_the_worktree_are_refused(
    tools: ToolBox, worktree: Path, secret: Path
) -> None:
    for path in ("../../../secret.txt", str(secret), "/etc/passwd", "/"):
        for args in ALL_COMMANDS:
            text, is_error = edit(tools, path, **args)
            assert is_error and "outside the repository" in text, (path, args, text)
    assert secret.read_text() == SECRET


def test_symlinked_directory_outside_cannot_be_written_into(
    tools: ToolBox, worktree: Path, tmp_path: Path, secret: Path
) -> None:
    (worktree / "out").symlink_to(tmp_path)
    (worktree / "deep").mkdir()
    (worktree / "deep" / "out").symlink_to(tmp_path)
    for path in ("out/new.txt", "out/secret.txt", "deep/out/made/new.txt", "out"):
        for args in ALL_COMMANDS:
            text, is_error = edit(tools, path, **args)
            assert is_error and "outside the repository" in text, (path, args, text)
    assert not (tmp_path / "new.txt").exists() and not (tmp_path / "made").exists()
    assert secret.read_text() == SECRET
    # The second line of defence: handed a path with a symlinked directory in it, the
    # writer itself refuses to follow it.
    with pytest.raises(safefs.AccessError, match="symbolic link"):
        safefs.write_text(worktree / "out" / "new.txt", "x", root=worktree)
    with pytest.raises(safefs.AccessError, match="symbolic link"):
        safefs.read_text(worktree / "out" / "secret.txt", 100, root=worktree)
    assert not (tmp_path / "new.txt").exists()


def test_dangling_symlinks_never_create_outside(
    tools: ToolBox, worktree: Path, tmp_path: Path
) -> None:
    (worktree / "dangling").symlink_to(tmp_path / "planted.txt")
    (worktree / "dangling-dir").symlink_to(tmp_path / "planted-dir")
    for path in ("dangling", "dangling-dir/x.txt"):
        text, is_error = edit(tools, path, command="create", file_text="planted\n")
        assert is_error and "outside the repository" in text
    assert not (tmp_path / "planted.txt").exists()
    assert not (tmp_path / "planted-dir").exists()
    # Dangling inside the worktree: still a symlink, so create refuses to write through it.
    (worktree / "inner").symlink_to("not-yet.txt")
    text, is_error = edit(tools, "inner", command="create", file_text="x")
    assert is_error and "symbolic link" in text
    assert not (worktree / "not-yet.txt").exists()
    # The writer alone never follows the last component either.
    with pytest.raises(safefs.AccessError, match="symbolic link"):
        safefs.write_text(worktree / "dangling", "x", root=worktree)
    with pytest.raises(safefs.AccessError, match="symbolic link"):
        safefs.write_text(worktree / "dangling", "x")
    assert not (tmp_path / "planted.txt").exists()


def test_devices_are_refused(tools: ToolBox, worktree: Path) -> None:
    (worktree / "zero").symlink_to("/dev/zero")
    (worktree / "hop").symlink_to("zero")
    for path in ("zero", "hop", "/dev/zero", "../../../../../../dev/zero"):
        for args in ALL_COMMANDS:
            text, is_error = edit(tools, path, **args)
            assert is_error and "outside the repository" in text, (path, args, text)
    with pytest.raises(safefs.AccessError, match="device"):
        safefs.read_file(Path("/dev/zero"), 10)
    with pytest.raises(safefs.AccessError, match="device"):
        safefs.write_file(Path("/dev/null"), b"x")


def test_hard_links_are_not_written_through(tools: ToolBox, worktree: Path, secret: Path) -> None:
    os.link(secret, worktree / "hard.txt")
    for args in ALL_COMMANDS[1:]:
        text, is_error = edit(tools, "hard.txt", **args)
        assert is_error and "hard links" in text, (args, text)
    assert secret.read_text() == SECRET


def test_directory_view_of_a_huge_tree_is_bounded(tools: ToolBox, worktree: Path) -> None:
    for d in range(20):
        sub = worktree / f"d{d:02}"
        sub.mkdir()
        for f in range(1000):
            (sub / f"f{f:04}.txt").touch()
    (worktree / "d00" / "f0000.txt").unlink()
    (worktree / "d00" / "deeper").mkdir()
    (worktree / "d00" / "deeper" / "hidden-by-depth.txt").touch()
    (worktree / "outlink").symlink_to("/")
    started = time.monotonic()
    text, is_error = edit(tools, ".", command="view")
    assert time.monotonic() - started < 5
    assert not is_error
    lines = text.splitlines()
    assert len(lines) == 1001 and len(text) < 40_000
    assert lines[:3] == ["d00/", "d00/deeper/", "d00/f0001.txt"]
    assert "hidden-by-depth" not in text and ".git" not in text
    # Shallow entries come first: a crowded d00 does not hide the rest of the top level.
    assert {"d19/", "hello.txt", "outlink -> /"} <= set(lines)
    assert (
        lines[-1] == "[19022 more entries not shown; list subdirectories, or use bash (find, ls)]"
    )
    text, _ = edit(tools, "d07", command="view")
    assert text.splitlines()[0] == "d07/f0000.txt" and len(text.splitlines()) == 1000
    # Listing never follows a symlink, even to /.
    listing = safefs.list_dir(worktree, root=worktree)
    assert "outlink -> /" in listing.entries and listing.omitted == 19022
    small = safefs.list_dir(worktree, root=worktree, limit=10, scan=100)
    assert len(small.entries) == 10 and small.incomplete


def test_created_files_and_directories_get_the_sandbox_owner(
    tools: ToolBox, worktree: Path, sandbox: OwnedSandbox
) -> None:
    # As root the harness must hand what it makes to the sandbox's user; as anyone else
    # only its own ids are possible, and the same code path runs.
    uid, gid = (65534, 65534) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    sandbox.owner = (uid, gid)
    root_stat = worktree.stat()
    text, is_error = edit(tools, "new/dir/file.txt", command="create", file_text="a\n")
    assert not is_error, text
    for p in (worktree / "new", worktree / "new" / "dir", worktree / "new" / "dir" / "file.txt"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), p
    assert (worktree.stat().st_uid, worktree.stat().st_gid) == (
        root_stat.st_uid,
        root_stat.st_gid,
    )
    # Editing keeps the file's owner; without an owner nothing is chowned.
    ok(tools, "new/dir/file.txt", command="str_replace", old_str="a", new_str="b")
    assert (worktree / "new" / "dir" / "file.txt").stat().st_uid == uid
    sandbox.owner = None
    ok(tools, "plain.txt", command="create", file_text="x")
    assert (worktree / "plain.txt").stat().st_uid == os.geteuid()


def test_view_range_errors_are_reported(tools: ToolBox, worktree: Path) -> None:
    (worktree / "f.txt").write_text("one\ntwo\nthree\n")
    bad = [["1", 2], [1.5, 2], [3, 2], [0, 2], [4, 4], [1, 9], [1], 5, "1,2", [True, 2], [2, -2]]
    for rng in bad:
        text, is_error = edit(tools, "f.txt", command="view", view_range=rng)
        assert is_error and "view_range" in text, (rng, text)
    assert edit(tools, "f.txt", command="view", view_range=[2, -1]) == (
        "     2\ttwo\n     3\tthree",
        False,
    )
    assert edit(tools, "f.txt", command="view", view_range=[3, 3])[0] == "     3\tthree"
    text, is_error = edit(tools, ".", command="view", view_range=[1, 2])
    assert is_error and "directory" in text


def test_editor_still_does_its_job(tools: ToolBox, worktree: Path) -> None:
    assert edit(tools, "pkg/mod.py", command="create", file_text="a = 1\nb = 2") == (
        "created pkg/mod.py",
        False,
    )
    ok(tools, "pkg/mod.py", command="insert", insert_line=2, insert_text="c = 3")
    assert (worktree / "pkg" / "mod.py").read_text() == "a = 1\nb = 2\nc = 3\n"
    ok(tools, "pkg/mod.py", command="insert", insert_line=0, insert_text="# top\n")
    text, is_error = edit(tools, "pkg/mod.py", command="insert", insert_line=9, insert_text="x")
    assert is_error and "0..4" in text
    text, is_error = edit(tools, "pkg/mod.py", command="str_replace", old_str="= ", new_str="=")
    assert is_error and "3 times" in text
    assert edit(
        tools,
        str(worktree / "pkg/mod.py"),
        command="str_replace",
        old_str="b = 2",
        new_str="b = 20",
    ) == (
        "edited pkg/mod.py",
        False,
    )
    text, is_error = edit(tools, "pkg/mod.py", command="view")
    assert not is_error and text.splitlines() == [
        "     1\t# top",
        "     2\ta = 1",
        "     3\tb = 20",
        "     4\tc = 3",
    ]
    assert edit(tools, "pkg", command="view") == ("pkg/mod.py", False)
    # Invalid UTF-8 survives an edit elsewhere in the file byte for byte.
    (worktree / "latin1.txt").write_bytes(b"caf\xe9\nname = old\n")
    ok(tools, "latin1.txt", command="str_replace", old_str="old", new_str="new")
    assert (worktree / "latin1.txt").read_bytes() == b"caf\xe9\nname = new\n"
    # Symlinks that stay inside are read through; a write names the real file instead.
    (worktree / "alias.py").symlink_to("pkg/mod.py")
    (worktree / "pkgdir").symlink_to("pkg")
    assert "b = 20" in edit(tools, "alias.py", command="view")[0]
    text, is_error = edit(tools, "alias.py", command="create", file_text="x")
    assert is_error and "pkg/mod.py" in text
    assert edit(tools, "pkgdir/other.py", command="create", file_text="x\n") == (
        "created pkg/other.py",
        False,
    )
    assert (worktree / "alias.py").is_symlink()
    # Too big to create or edit here: the agent is sent to bash.
    text, is_error = edit(tools, "huge.txt", command="create", file_text="x" * (5 * 1024 * 1024))
    assert is_error and "bash" in text and not (worktree / "huge.txt").exists()
    # Not-a-directory parents and missing files are tool errors, not exceptions.
    for path, args in [
        ("hello.txt/x", {"command": "create", "file_text": "x"}),
        ("hello.txt/x", {"command": "view"}),
        ("missing.txt", {"command": "view"}),
        ("missing.txt", {"command": "str_replace", "old_str": "a", "new_str": "b"}),
        ("pkg", {"command": "create", "file_text": "x"}),
        (".", {"command": "create", "file_text": "x"}),
        ("x\0y", {"command": "view"}),
        ("x" * 300, {"command": "view"}),  # an OSError (too long), reported like the rest
    ]:
        text, is_error = edit(tools, path, **args)
        assert is_error and text, (path, args)
    assert edit(tools, "empty.txt", command="create", file_text="") == ("created empty.txt", False)
    assert edit(tools, "empty.txt", command="view") == ("(empty file)", False)
