"""``index_shape`` (jobs/tree/files.py): what each path of a worktree may be on disk, read
from ``git ls-files -z -v -s``. Pure: no git runs."""

from __future__ import annotations

from jobs.tree.files import index_shape

SHA1 = "a" * 40
SHA256 = "b" * 64  # a repository in SHA-256 object format: a longer header


def entry(path: str, mode: str = "100644", tag: str = "H", sha: str = SHA1) -> str:
    return f"{tag} {mode} {sha} 0\t{path}\0"


def test_kinds_and_every_directory_above_an_entry() -> None:
    listing = (
        entry("a/b/c.py")
        + entry("a/run.sh", "100755")
        + entry("link", "120000")
        + entry("packages/ui", "160000", sha=SHA256)
    )
    shape, flagged = index_shape(listing)
    assert shape == {
        "a/b/c.py": "file",
        "a/b": "dir",
        "a": "dir",
        "a/run.sh": "file",
        "link": "link",
        "packages/ui": "gitlink",
        "packages": "dir",
    }
    assert not flagged


def test_a_name_with_a_tab_or_a_newline_is_one_path() -> None:
    shape, _ = index_shape(entry("we\tird\nname.txt"))
    assert shape == {"we\tird\nname.txt": "file"}


def test_a_bit_that_makes_git_look_away_is_reported() -> None:
    for tag in ("S", "s", "h"):  # skip-worktree; assume-unchanged (lowercase)
        assert index_shape(entry("x.py") + entry("y.py", tag=tag))[1], tag


def test_an_empty_index_and_an_unknown_mode() -> None:
    assert index_shape("") == ({}, False)
    assert index_shape(entry("odd", "100664")) == ({"odd": "other"}, False)
