"""The system's bytecode for the sandbox's Python (jobs/sandbox/bytecode.py), on disk."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.sandbox import bytecode


@pytest.fixture
def parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(bytecode, "PARENT", tmp_path)
    bytecode._place.cache_clear()
    yield tmp_path
    bytecode._place.cache_clear()


def test_links_the_shipped_bytecode_where_the_prefix_looks(parent: Path) -> None:
    tree = bytecode.tree()
    assert tree is not None and tree.parent.parent == parent
    links = [p for p in tree.rglob("case.cpython-3*.pyc") if "unittest" in p.parts]
    assert links, "no unittest/case bytecode linked"
    for link in links:
        target = Path(os.readlink(link))
        assert target.parent.name == "__pycache__" and target.is_file()
        # <tree>/usr/lib/python3.X/unittest/case... -> /usr/lib/python3.X/unittest/__pycache__/
        assert "/" + str(link.parent.relative_to(tree.parent)) == str(target.parent.parent)
    assert not os.stat(tree.parent).st_mode & 0o022  # no one else may add to it


def test_a_tree_removed_since_is_built_again(parent: Path) -> None:
    first = bytecode.tree()
    assert first is not None
    shutil.rmtree(first.parent)
    again = bytecode.tree()
    assert again == first and again.is_dir()


def test_a_link_planted_in_its_place_is_not_followed(parent: Path, tmp_path: Path) -> None:
    place = bytecode._place()
    assert place is not None
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "usr").mkdir(parents=True)
    place.symlink_to(elsewhere)
    assert bytecode.tree() is None  # the sandbox then compiles, as before
    assert place.is_symlink() and not any(elsewhere.joinpath("usr").iterdir())


def test_a_directory_others_can_write_is_not_used(parent: Path) -> None:
    place = bytecode._place()
    assert place is not None
    (place / "usr").mkdir(parents=True)
    place.chmod(0o777)
    assert bytecode.tree() is None
