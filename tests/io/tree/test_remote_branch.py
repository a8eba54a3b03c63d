"""A merged loop branch is deleted by ``git push``, leased on the head that merged
(jobs/tree/remote_branch.py), against the local GitHub's git over HTTP: a push after the
merge keeps the branch, a rule forbidding deletion keeps it with GitHub's words, and git
out of reach is an error the caller can fall back from."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bot.core.rules.push_refusal import Deletion
from bot.standins import gitrepo, serving
from bot.standins.github import GitHubServer
from jobs.tree import remote_branch
from jobs.tree.git import GitError
from jobs.tree.worktree import Worktrees
from tests.io.tree.test_worktree import REPO, setup  # noqa: F401 - the fixture

BRANCH = "loop/issue-1"


def api(github: GitHubServer, token: str) -> httpx.Client:
    """An HTTP client of the local GitHub's REST API, as the installation."""
    auth = {"Authorization": f"token {token}"}
    return httpx.Client(base_url=github.url, headers=auth, verify=serving.client_tls())


def pushed(wt: Worktrees, mirror: Path, token: str, text: str) -> str:
    one = wt.checkout(REPO, 1, BRANCH, "main", mirror)
    (one.path / "a.py").write_text(text)
    sha = wt.commit_all(one, "loop(turn-1): one")
    assert sha
    return wt.push(one, token, sha)


@pytest.mark.parametrize("in_mirror", [True, False])
def test_a_branch_at_the_merged_head_is_deleted(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
    tmp_path: Path,
    in_mirror: bool,
) -> None:
    wt, url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    where = mirror if in_mirror else tmp_path / "no-mirror-on-this-machine.git"
    done = remote_branch.delete(where, url, token, BRANCH, head)
    assert done == remote_branch.Deleted(Deletion.DELETED)
    assert github.ref(REPO, BRANCH) is None
    again = remote_branch.delete(where, url, token, BRANCH, head)
    assert (again.outcome, again.gone) == (Deletion.NOT_AT_HEAD, True)  # gone already
    assert not [p for m, p, _ in github.requests if m == "DELETE"]  # no REST write


def test_a_push_after_the_merge_keeps_the_branch(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, url, token, mirror = setup
    merged = pushed(wt, mirror, token, "x = 2\n")
    theirs = gitrepo.seed(github.repo(REPO).path, BRANCH, {"b.py": "y = 1\n"}, "a person's fix")
    done = remote_branch.delete(mirror, url, token, BRANCH, merged)
    assert (done.outcome, done.gone) == (Deletion.NOT_AT_HEAD, False)
    assert github.ref(REPO, BRANCH) == theirs  # their commit is not lost


def test_a_rule_forbidding_deletion_keeps_the_branch_with_github_s_words(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    github.repo(REPO).restrict_deletion = ["refs/heads/loop/*"]
    done = remote_branch.delete(mirror, url, token, BRANCH, head)
    assert done.outcome is Deletion.REFUSED
    assert "Cannot delete this branch" in done.words and "GH013" in done.words
    assert token not in done.words
    assert github.ref(REPO, BRANCH) == head
    assert [r["cause"] for r in github.repo(REPO).refused_pushes()] == ["deletion_restricted"]


def test_git_out_of_reach_is_an_error_without_the_token(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    github.git_down = True
    with pytest.raises(GitError) as exc:
        remote_branch.delete(mirror, url, token, BRANCH, head)
    assert token not in str(exc.value)
    github.git_down = False
    assert github.ref(REPO, BRANCH) == head


def test_the_local_github_refuses_a_restricted_deletion_by_rest_too(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """The stand-in first: the rule is listed for the branch, and REST's DELETE is a 422
    with GitHub's words, as a push's deletion is refused."""
    wt, _url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    github.repo(REPO).restrict_deletion = ["refs/heads/loop/*"]
    with api(github, token) as a:
        rules = a.get(f"/repos/{REPO}/rules/branches/{BRANCH}").json()
        assert "deletion" in [r["type"] for r in rules]
        gone = a.delete(f"/repos/{REPO}/git/refs/heads/{BRANCH}")
    assert gone.status_code == 422 and "Cannot delete this branch" in gone.text
    assert github.ref(REPO, BRANCH) == head
