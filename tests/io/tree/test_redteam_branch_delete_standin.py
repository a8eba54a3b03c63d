"""Red team on remote_branch.delete (jobs/tree/remote_branch.py) and on the local GitHub's
new deletion rules (bot/standins/receive_hook.py, repos.py delete_ref, pulls.py
after_merge), held against GitHub's documented behaviour:

- classic branch protection forbids deletion unless "Allow deletions" is on; a push's
  deletion is refused (``GH006: Protected branch update failed``, ``Cannot delete this
  protected branch``, ``protected branch hook declined``); "Branch protection rules and
  repository rules can also prevent branches being automatically deleted" (GitHub's
  docs, managing-the-automatic-deletion-of-branches);
- the default branch cannot be deleted (``deletion of the current branch prohibited``);
- a merged (closed) pull request's head is where it merged: later pushes to the branch
  do not move it."""

from __future__ import annotations

from pathlib import Path

from bot.core.rules.push_refusal import Deletion
from bot.standins import gitrepo
from bot.standins.github import GitHubServer
from jobs.tree import remote_branch
from jobs.tree.worktree import Worktrees
from tests.io.tree.test_remote_branch import api, pushed
from tests.io.tree.test_worktree import REPO, setup  # noqa: F401 - the fixture

BRANCH = "loop/issue-1"


# -- remote_branch.delete -------------------------------------------------------------


def test_a_new_loop_s_branch_of_the_same_name_is_not_deleted_by_the_old_loop_s_lease(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """Rule 1: after /loop-restart a new loop pushes loop/issue-1 afresh (from main, not
    on top of the merged head): the old loop's deletion, leased on its merged head, keeps
    it."""
    wt, url, token, mirror = setup
    merged = pushed(wt, mirror, token, "x = 2\n")
    repo = github.repo(REPO)
    main = gitrepo.resolve(repo.path, "refs/heads/main")
    gitrepo.git(repo.path, "update-ref", f"refs/heads/{BRANCH}", str(main))
    new = gitrepo.seed(repo.path, BRANCH, {"c.py": "z = 3\n"}, "loop(turn-1): the new loop")
    done = remote_branch.delete(mirror, url, token, BRANCH, merged)
    assert (done.outcome, done.gone) == (Deletion.NOT_AT_HEAD, False)
    assert github.ref(REPO, BRANCH) == new


def test_a_record_without_a_merged_head_deletes_whatever_the_branch_holds(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """Rule 1 for records from before ``merged_head`` was kept ("" : no lease): a commit
    pushed after the merge is deleted with the branch. (Documented in remote_branch's
    docstring; the REST DELETE did the same before. A retry of such a record's tidying
    — ``tidy_pending`` — is the only way here.)"""
    wt, url, token, mirror = setup
    pushed(wt, mirror, token, "x = 2\n")
    theirs = gitrepo.seed(github.repo(REPO).path, BRANCH, {"b.py": "y = 1\n"}, "a person's fix")
    done = remote_branch.delete(mirror, url, token, BRANCH, "")
    assert done.outcome is Deletion.DELETED
    assert github.ref(REPO, BRANCH) is None, theirs  # theirs is gone: no lease to hold


def test_gone_is_told_even_when_another_branch_name_ends_with_the_ref(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """``git ls-remote URL refs/heads/B`` matches refs by their tail: a branch named
    ``x/refs/heads/B`` answers for B. The deletion found B gone; it says moved."""
    wt, url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    repo = github.repo(REPO)
    gitrepo.git(repo.path, "update-ref", f"refs/heads/x/refs/heads/{BRANCH}", head)
    assert remote_branch.delete(mirror, url, token, BRANCH, head).outcome is Deletion.DELETED
    again = remote_branch.delete(mirror, url, token, BRANCH, head)
    assert (again.outcome, again.gone) == (Deletion.NOT_AT_HEAD, True), again


def test_the_token_is_not_in_the_mirror_after_a_deletion(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    github.repo(REPO).restrict_deletion = ["refs/heads/loop/*"]
    remote_branch.delete(mirror, url, token, BRANCH, head)
    github.repo(REPO).restrict_deletion = []
    remote_branch.delete(mirror, url, token, BRANCH, head)
    for p in wt.data_dir.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert token.encode() not in p.read_bytes(), p


# -- the local GitHub against GitHub's documented behaviour ----------------------------


def test_standin_a_classic_protected_branch_refuses_its_deletion_by_push(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """GitHub: classic protection forbids deletion by default (GH006, "protected branch
    hook declined")."""
    wt, url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    github.repo(REPO).protection[BRANCH] = []  # classic protection, no checks required
    done = remote_branch.delete(mirror, url, token, BRANCH, head)
    assert done.outcome is Deletion.REFUSED, done
    assert github.ref(REPO, BRANCH) == head


def test_standin_a_classic_protected_branch_refuses_its_deletion_by_rest(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, _url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    github.repo(REPO).protection[BRANCH] = []
    with api(github, token) as a:
        gone = a.delete(f"/repos/{REPO}/git/refs/heads/{BRANCH}")
    assert gone.status_code == 422, (gone.status_code, gone.text)
    assert github.ref(REPO, BRANCH) == head


def test_standin_the_default_branch_is_not_deleted_by_push(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """GitHub: ``[remote rejected] main (deletion of the current branch prohibited)``."""
    _wt, url, token, mirror = setup
    main = gitrepo.resolve(github.repo(REPO).path, "refs/heads/main")
    assert main
    done = remote_branch.delete(mirror, url, token, "main", str(main))
    assert done.outcome is Deletion.REFUSED, done
    assert github.ref(REPO, "main") == main


def _merged_pull(github: GitHubServer, token: str, head: str) -> tuple[int, str]:
    with api(github, token) as a:
        pr = a.post(f"/repos/{REPO}/pulls", json={"title": "t", "head": BRANCH, "base": "main"})
        assert pr.status_code == 201, pr.text
        number = pr.json()["number"]
        done = a.put(f"/repos/{REPO}/pulls/{number}/merge", json={"merge_method": "squash"})
        assert done.status_code == 200, done.text
    return number, head


def test_standin_auto_delete_keeps_a_classic_protected_head(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """GitHub's docs: branch protection rules (not only rulesets) prevent the automatic
    deletion."""
    wt, _url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    repo = github.repo(REPO)
    repo.delete_branch_on_merge = True
    repo.protection[BRANCH] = []
    _merged_pull(github, token, head)
    assert github.ref(REPO, BRANCH) == head


def test_standin_auto_delete_keeps_a_ruleset_restricted_head(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    wt, _url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    repo = github.repo(REPO)
    repo.delete_branch_on_merge = True
    repo.restrict_deletion = ["refs/heads/loop/*"]
    _merged_pull(github, token, head)
    assert github.ref(REPO, BRANCH) == head


def test_standin_a_merged_pull_s_head_does_not_follow_a_later_push(
    setup: tuple[Worktrees, str, str, Path],  # noqa: F811
    github: GitHubServer,
) -> None:
    """GitHub: a closed pull request no longer follows its head branch (no synchronize);
    ``head.sha`` stays where it merged. The gate leases the deletion on the head a
    ``GET pull`` reports after the merge in three of its four paths (AlreadyMerged, a
    lost merge answer, a retried enqueue): a stand-in whose merged head follows the branch
    has the gate lease on a person's later commit, and delete it."""
    wt, _url, token, mirror = setup
    head = pushed(wt, mirror, token, "x = 2\n")
    number, _ = _merged_pull(github, token, head)
    theirs = gitrepo.seed(github.repo(REPO).path, BRANCH, {"b.py": "y = 1\n"}, "after")
    with api(github, token) as a:
        got = a.get(f"/repos/{REPO}/pulls/{number}").json()
    assert got["merged"] is True
    assert got["head"]["sha"] == head, ("the merged pull's head followed the branch", theirs)
