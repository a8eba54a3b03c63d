"""Mirrors and worktrees with real git over the local GitHub server's smart HTTP."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from bot.standins.github import GitHubServer
from jobs.tree.worktree import GitError, Worktrees, git

REPO = "acme/tree"


@pytest.fixture
def setup(github: GitHubServer, tmp_path: Path) -> tuple[Worktrees, str, str, Path]:
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"a.py": "x = 1\n", ".gitignore": "build/\n"}, installation_id=iid)
    token = github.app_token_for(iid)
    wt = Worktrees(tmp_path / "data")
    url = f"{github.url}/git/{REPO}.git"
    mirror = wt.sync_mirror(REPO, url, token)
    return wt, url, token, mirror


def test_token_never_lands_on_disk(setup: tuple[Worktrees, str, str, Path]) -> None:
    wt, url, token, mirror = setup
    wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    assert git(mirror, "config", "--get", "remote.origin.url").strip() == url
    found = subprocess.run(["grep", "-rl", token, str(wt.data_dir)], capture_output=True, text=True)
    assert found.stdout == ""


def test_bad_token_is_a_clear_error_without_the_token(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    wt, url, _token, _mirror = setup
    with pytest.raises(GitError) as exc:
        wt.sync_mirror(REPO, url, "ghs_wrong-token")
    assert "ghs_wrong-token" not in str(exc.value)


def test_commit_push_and_resume_from_the_pushed_branch(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    wt, url, token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("x = 2\n")
    sha = wt.commit_all(co, "loop(turn-1): change")
    assert sha is not None and wt.commit_all(co, "nothing") is None
    wt.push(co, token)
    assert github.ref(REPO, "loop/issue-1") == sha
    wt.remove(REPO, 1)  # the worktree is gone (another machine): recreate from the push
    again = wt.checkout(REPO, 1, "loop/issue-1", "main", wt.sync_mirror(REPO, url, token))
    assert again.resumed and wt.head(again.path) == sha
    assert (again.path / "a.py").read_text() == "x = 2\n"


def test_a_push_in_flight_leaves_the_mirror_to_other_loops(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    """GitHub takes seconds to take a push; meanwhile another loop of the same repository
    commits (which needs the mirror's lock). The push holds no lock while it transfers,
    lands whole, and the remote-tracking ref follows it."""
    wt, _url, token, mirror = setup
    one = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    two = wt.checkout(REPO, 2, "loop/issue-2", "main", mirror)
    (one.path / "a.py").write_text("x = 2\n")
    sha = wt.commit_all(one, "loop(turn-1): one")
    assert sha is not None
    github.push_delay = 3.0
    pushing = threading.Thread(target=wt.push, args=(one, token, sha))
    pushing.start()
    time.sleep(0.5)  # the push is on the wire (or waiting for the lock, were it held)
    (two.path / "a.py").write_text("x = 3\n")
    other = wt.commit_all(two, "loop(turn-1): two")
    assert other is not None
    assert pushing.is_alive(), "the commit waited for the other loop's push"
    pushing.join(30)
    assert github.ref(REPO, "loop/issue-1") == sha
    assert wt.remote_sha(mirror, "loop/issue-1") == sha
    assert github.ref(REPO, "loop/issue-2") is None  # a commit is not a push


def test_a_push_that_is_not_a_fast_forward_fails_and_moves_nothing(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    """Someone else's commit on the loop's branch is never clobbered: the push (to the
    URL, with the commit named) is still fast-forward only, and a refused push leaves
    the remote-tracking ref where it was."""
    wt, _url, token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("x = 2\n")
    first = wt.commit_all(co, "loop(turn-1): one")
    assert first is not None
    wt.push(co, token, first)
    git(mirror, "update-ref", "refs/heads/loop/issue-1", wt.fork_point(co))  # a rewrite
    (co.path / "b.py").write_text("y = 1\n")
    rewritten = wt.commit_all(co, "loop(turn-2): elsewhere")
    assert rewritten is not None and rewritten != first
    with pytest.raises(GitError):
        wt.push(co, token, rewritten)
    assert github.ref(REPO, "loop/issue-1") == first
    assert wt.remote_sha(mirror, "loop/issue-1") == first


def test_agent_cannot_redirect_git_to_its_own_hooks(
    setup: tuple[Worktrees, str, str, Path], tmp_path: Path
) -> None:
    wt, _url, _token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    evil = co.path / "evil-gitdir"
    subprocess.run(["git", "init", "-q", "--bare", str(evil)], check=True)
    marker = tmp_path / "pwned"
    hook = evil / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    (co.path / ".git").write_text(f"gitdir: {evil}\n")  # what a malicious agent could do
    (co.path / "a.py").write_text("x = 3\n")
    sha = wt.commit_all(co, "loop(turn-1): change")
    assert sha is not None and not marker.exists()
    assert git(mirror, "rev-parse", "refs/heads/loop/issue-1").strip() == sha


def test_finished_worktree_is_recycled_clean(setup: tuple[Worktrees, str, str, Path]) -> None:
    wt, _url, _token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("dirty\n")
    (co.path / "untracked.txt").write_text("left over\n")
    (co.path / "build").mkdir()
    (co.path / "build" / "out.bin").write_text("ignored\n")
    wt.release(REPO, 1)
    assert not co.path.exists() and len(list(wt.spares_dir(REPO).iterdir())) == 1
    co2 = wt.checkout(REPO, 2, "loop/issue-2", "main", mirror)
    assert not list(wt.spares_dir(REPO).iterdir())  # the spare was taken
    assert git(co2.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "loop/issue-2"
    assert wt.head(co2.path) == co2.base_sha
    assert (co2.path / "a.py").read_text() == "x = 1\n"
    assert not (co2.path / "untracked.txt").exists() and not (co2.path / "build").exists()
    (co2.path / "a.py").write_text("x = 5\n")
    assert wt.commit_all(co2, "loop(turn-1): on a recycled worktree") is not None
    # Issue 1's branch is free again (not checked out anywhere), so it can be resumed.
    co1 = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    assert git(co1.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "loop/issue-1"


def test_merging_the_base_in_cleanly_or_with_conflicts(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    from bot.standins import gitrepo

    wt, url, token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("x = 2\n")
    wt.commit_all(co, "loop(turn-1): x is 2")
    # main moves on elsewhere: first a change git merges alone.
    gitrepo.seed(github.repo(REPO).path, "main", {"b.py": "y = 1\n"}, "add b")
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", wt.sync_mirror(REPO, url, token))
    assert wt.merge_base_in(co, "main") == []
    assert (co.path / "b.py").exists() and (co.path / "a.py").read_text() == "x = 2\n"
    # Then one on the same line: markers left, the merge concluded by the next commit.
    gitrepo.seed(github.repo(REPO).path, "main", {"a.py": "x = 3\n"}, "x is 3")
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", wt.sync_mirror(REPO, url, token))
    assert wt.merge_base_in(co, "main") == ["a.py"]
    assert "<<<<<<<" in (co.path / "a.py").read_text()
    (co.path / "a.py").write_text("x = 3  # and 2\n")
    sha = wt.commit_all(co, "loop(turn-2): resolve")
    assert sha is not None
    parents = git(co.path, "rev-list", "--parents", "-n", "1", sha).split()
    assert len(parents) == 3  # a merge commit: main is now an ancestor of the branch


def test_the_branch_diff_follows_its_head_across_a_merge_and_a_revert(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    """The diff's start (the merge base, remembered by the two shas) moves with the head:
    after main is merged in, main's own change is not the branch's; an edit and its
    revert add up to no change. The head passed in and the head read give one answer."""
    from bot.standins import gitrepo

    wt, url, token, mirror = setup
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    first_base = co.base_sha
    (co.path / "a.py").write_text("x = 2\n")
    head = wt.commit_all(co, "loop(turn-1): x is 2")
    assert head is not None
    assert wt.fork_point(co, head) == first_base
    assert wt.changed_files(co, head) == wt.changed_files(co) == ["a.py"]
    assert wt.tree_changed(co, head) and wt.files_with_added_lines(co, head) == ["a.py"]

    gitrepo.seed(github.repo(REPO).path, "main", {"b.py": "y = 1\n"}, "add b")
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", wt.sync_mirror(REPO, url, token))
    assert wt.merge_base_in(co, "main") == []
    merged = wt.head(co.path)
    assert merged != head and wt.fork_point(co, merged) == co.base_sha != first_base
    assert wt.changed_files(co, merged) == ["a.py"]  # b.py is main's, not the branch's
    assert wt.files_with_added_lines(co) == ["a.py"]

    (co.path / "a.py").write_text("x = 1\n")  # the edit undone
    reverted = wt.commit_all(co, "loop(turn-2): x is 1 again")
    assert reverted is not None
    assert not wt.tree_changed(co, reverted) and not wt.tree_changed(co)
    assert wt.changed_files(co, reverted) == [] and wt.files_with_added_lines(co, reverted) == []
    assert wt.changed_since_base(co, reverted)  # commits there are; a change there is not


def test_a_refused_push_raises_with_githubs_words_and_moves_no_ref(
    setup: tuple[Worktrees, str, str, Path], github: GitHubServer
) -> None:
    """The ref status decides (``--porcelain``), never git's exit code alone."""
    from bot.core.rules.push_refusal import Kind
    from jobs.tree.worktree import PushRefused

    wt, _url, token, mirror = setup
    github.repo(REPO).restrict_creation = ["refs/heads/loop/*"]
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("x = 2\n")
    wt.commit_all(co, "loop(turn-1): change")
    with pytest.raises(PushRefused) as refused:
        wt.push(co, token)
    assert refused.value.refusal.kind == Kind.CREATION_RESTRICTED
    assert "Cannot create ref due to creations being restricted." in refused.value.refusal.remote
    assert token not in refused.value.refusal.remote
    assert wt.remote_sha(mirror, "loop/issue-1") is None


def test_workflow_changes_are_set_aside_and_a_base_merge_is_linearized_for_a_lease_push(
    github: GitHubServer, tmp_path: Path
) -> None:
    """Against the local GitHub's rule (an App without ``workflows``): the agent's
    workflow edit stays out of the commit as a patch; main's own workflow change, merged
    in, goes up as one commit on main's head with a lease, and GitHub takes it."""
    from bot.standins import gitrepo

    iid = github.add_installation("acme")
    github.add_repo(
        REPO, {"a.py": "x = 1\n", ".github/workflows/ci.yml": "on: push\n"}, installation_id=iid
    )
    token = github.app_token_for(iid)
    wt = Worktrees(tmp_path / "data")
    url = f"{github.url}/git/{REPO}.git"
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", wt.sync_mirror(REPO, url, token))
    (co.path / "a.py").write_text("x = 2\n")
    (co.path / ".github/workflows/ci.yml").write_text("on: [push]\n")
    (co.path / ".github/workflows/new.yml").write_text("on: pull_request\n")
    aside = wt.set_aside(co, ".github/workflows/")
    assert sorted(aside) == [".github/workflows/ci.yml", ".github/workflows/new.yml"]
    assert "+on: [push]" in aside[".github/workflows/ci.yml"]
    assert (co.path / ".github/workflows/ci.yml").read_text() == "on: push\n"
    assert not (co.path / ".github/workflows/new.yml").exists()
    first = wt.push(co, token, wt.commit_all(co, "loop(turn-1): a"))
    gitrepo.seed(
        github.repo(REPO).path, "main", {".github/workflows/ci.yml": "on: [push, pull_request]\n"}
    )
    wt.sync_mirror(REPO, url, token)
    assert wt.merge_base_in(co, "main") == []
    assert wt.merge_touches(co, ".github/workflows/")
    squashed = wt.linearize(co)
    assert squashed is not None
    assert wt.push(co, token, squashed, lease=first) == squashed
    assert github.ref(REPO, "loop/issue-1") == squashed
    assert (
        github.file_at(REPO, "loop/issue-1", ".github/workflows/ci.yml")
        == "on: [push, pull_request]\n"
    )
    assert github.repo(REPO).refused_pushes() == []
