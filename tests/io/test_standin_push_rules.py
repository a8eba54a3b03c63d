"""The local GitHub's receive-pack rules, through plain ``git push --porcelain``: each
refusal comes back as git's own ``!`` ref status with GitHub's reason, and its
``remote:`` lines, and the refused ref is not updated."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bot.standins.github import GitHubServer

REPO = "acme/rules"
TOKEN = "ghp_" + "A1b2C3d4E5" * 3 + "F6g7H8"  # 36 characters after the prefix
ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **ENV}
    )


@pytest.fixture
def clone(github: GitHubServer, tmp_path: Path) -> tuple[Path, str]:
    """A clone of a repository with a workflow, and the URL with an App token in it."""
    iid = github.add_installation("acme")
    github.add_repo(
        REPO,
        {"a.py": "x = 1\n", ".github/workflows/ci.yml": "on: push\n"},
        installation_id=iid,
    )
    token = github.app_token_for(iid)
    url = github.url.replace("://", f"://x-access-token:{token}@") + f"/git/{REPO}.git"
    work = tmp_path / "clone"
    assert run(tmp_path, "clone", "-q", url, str(work)).returncode == 0
    return work, url


def commit(work: Path, path: str, text: str) -> str:
    target = work / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    run(work, "add", "-A")
    run(work, "commit", "-q", "-m", f"change {path}")
    return run(work, "rev-parse", "HEAD").stdout.strip()


def push(work: Path, ref: str = "refs/heads/loop/issue-1") -> subprocess.CompletedProcess[str]:
    return run(work, "push", "--porcelain", "origin", f"HEAD:{ref}")


def test_a_workflow_change_from_an_app_without_workflows_is_refused(
    github: GitHubServer, clone: tuple[Path, str]
) -> None:
    work, _ = clone
    commit(work, ".github/workflows/ci.yml", "on: [push, pull_request]\n")
    out = push(work)
    assert out.returncode != 0
    assert (
        "!\tHEAD:refs/heads/loop/issue-1\t[remote rejected] (refusing to allow a GitHub App "
        "to create or update workflow `.github/workflows/ci.yml` without `workflows` "
        "permission)"
    ) in out.stdout
    assert github.ref(REPO, "loop/issue-1") is None
    assert [r["cause"] for r in github.repo(REPO).refused_pushes()] == ["workflows"]


def test_a_merge_that_brings_a_workflow_change_in_is_refused_a_linear_commit_is_not(
    github: GitHubServer, clone: tuple[Path, str]
) -> None:
    """Judged per new commit against each parent: main changed the workflow (a person),
    the branch merges main in; the merge commit, against the branch, updates it."""
    work, _ = clone
    base = run(work, "rev-parse", "HEAD").stdout.strip()
    commit(work, "a.py", "x = 2\n")
    assert push(work).returncode == 0
    from bot.standins import gitrepo

    gitrepo.seed(github.repo(REPO).path, "main", {".github/workflows/ci.yml": "on: [push]\n"})
    run(work, "fetch", "-q", "origin")
    run(work, "merge", "-q", "--no-edit", "origin/main")
    out = push(work)
    assert "(refusing to allow a GitHub App to create or update workflow" in out.stdout
    # The same work as one commit on main's head: nothing under workflows changes.
    tree = run(work, "rev-parse", "HEAD^{tree}").stdout.strip()
    onto = run(work, "rev-parse", "origin/main").stdout.strip()
    linear = run(work, "commit-tree", tree, "-p", onto, "-m", "squashed").stdout.strip()
    run(work, "reset", "-q", "--hard", linear)
    out = run(
        work, "push", "--porcelain", "--force-with-lease", "origin", "HEAD:refs/heads/loop/issue-1"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert github.ref(REPO, "loop/issue-1") == linear != base


def test_push_protection_refuses_a_secret_with_its_type_commit_and_line(
    github: GitHubServer, clone: tuple[Path, str]
) -> None:
    work, _ = clone
    github.repo(REPO).push_protection = True
    sha = commit(work, "conf.py", f"# settings\nKEY = '{TOKEN}'\n")
    out = push(work)
    assert (
        "!\tHEAD:refs/heads/loop/issue-1\t[remote rejected] (push declined due to "
        "repository rule violations)"
    ) in out.stdout
    assert (
        "remote: error: GH013: Repository rule violations found for refs/heads/loop/issue-1."
        in out.stderr
    )
    assert "remote:     - Push cannot contain secrets" in out.stderr
    assert "—— GitHub Personal Access Token " in out.stderr
    assert f"remote:          - commit: {sha}" in out.stderr
    assert "remote:            path: conf.py:2" in out.stderr
    # A later commit removing it does not help: the commit that added it is still pushed.
    commit(work, "conf.py", "# settings\n")
    assert "(push declined due to repository rule violations)" in push(work).stdout
    assert github.ref(REPO, "loop/issue-1") is None
    assert github.repo(REPO).refusals("secret") == 2


def test_a_file_over_100_mb_is_refused_as_github_does(
    github: GitHubServer, clone: tuple[Path, str]
) -> None:
    work, _ = clone
    with (work / "big.bin").open("wb") as f:
        f.truncate(120 * 1024 * 1024)  # sparse: costs no disk, compresses to little
    run(work, "add", "big.bin")
    run(work, "commit", "-q", "-m", "big")
    out = push(work)
    assert (
        "!\tHEAD:refs/heads/loop/issue-1\t[remote rejected] (pre-receive hook declined)"
        in out.stdout
    )
    assert (
        "remote: error: File big.bin is 120.00 MB; this exceeds GitHub's file size limit "
        "of 100.00 MB"
    ) in out.stderr
    assert "remote: error: GH001: Large files detected." in out.stderr
    assert github.ref(REPO, "loop/issue-1") is None


def test_a_ruleset_restricting_creation_refuses_a_new_loop_branch_only(
    github: GitHubServer, clone: tuple[Path, str]
) -> None:
    work, _ = clone
    github.repo(REPO).restrict_creation = ["refs/heads/loop/*"]
    commit(work, "a.py", "x = 3\n")
    out = push(work)
    assert "(push declined due to repository rule violations)" in out.stdout
    assert "remote: - Cannot create ref due to creations being restricted." in out.stderr
    assert github.ref(REPO, "loop/issue-1") is None
    assert push(work, "refs/heads/other").returncode == 0
    assert github.repo(REPO).refusals("creation_restricted") == 1


def test_an_app_granted_workflows_may_push_them(github: GitHubServer, tmp_path: Path) -> None:
    iid = github.add_installation("acme", permissions={"contents": "write", "workflows": "write"})
    github.add_repo(REPO, {".github/workflows/ci.yml": "on: push\n"}, installation_id=iid)
    token = github.app_token_for(iid)
    url = github.url.replace("://", f"://x-access-token:{token}@") + f"/git/{REPO}.git"
    work = tmp_path / "c"
    run(tmp_path, "clone", "-q", url, str(work))
    commit(work, ".github/workflows/ci.yml", "on: [push]\n")
    assert push(work).returncode == 0
    assert github.repo(REPO).refused_pushes() == []
