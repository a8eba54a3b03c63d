"""After a merge the loop's branch goes: deleted by loopbot, or by GitHub itself when the
repository deletes merged head branches ("Automatically delete head branches"), and
then loopbot sends nothing of its own (a write for nothing at fleet scale, issue 43).
loopbot deletes it by ``git push``, leased on the merged head: no REST write in the
installation's line (jobs/tree/remote_branch.py); the REST DELETE only when git is out
of reach; and a rule forbidding the deletion is kept to, never bypassed."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.review.test_merge_rules import status_comment
from tests.e2e.review.test_receipt import start
from tests.e2e.review.test_review_merge import FIX, fixing_agent, record, report

BRANCH = "loop/issue-1"
KEY = LoopId("acme/widgets", 1).key


def deletes(github: GitHubServer) -> list[str]:
    return [p for meth, p, _ in github.requests if meth == "DELETE" and "/git/refs/" in p]


@pytest.mark.parametrize("github_deletes", [False, True])
def test_the_merged_branch_is_deleted_once_by_whoever_the_repository_says(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    github_deletes: bool,
) -> None:
    model.play(FIX, m.text("Fixed."), report())
    start(github)
    from tests.helpers import REPO

    github.repo(REPO).delete_branch_on_merge = github_deletes
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert github.ref(REPO, BRANCH) is None  # gone either way
    assert deletes(github) == []  # by git push, or by GitHub: no REST write
    assert not kept(redis)


def kept(redis: Redis) -> list[dict[str, Any]]:
    return [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "branch_kept"]


def test_a_rule_forbidding_the_deletion_keeps_the_branch_and_the_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    from tests.helpers import REPO

    model.play(FIX, m.text("Fixed."), report())
    start(github)
    github.repo(REPO).restrict_deletion = ["refs/heads/loop/*"]
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert github.ref(REPO, BRANCH) == r.merged_head  # kept, as the rule says
    assert deletes(github) == []  # not tried another way round the rule
    (event,) = kept(redis)
    assert "Cannot delete this branch" in event["why"], event
    # The status comment's last edit says so: the maintainer knows why it stayed.
    assert "branch loop/issue-1 kept: GitHub refused its deletion" in status_comment(github)
    assert [x["cause"] for x in github.repo(REPO).refused_pushes()] == ["deletion_restricted"]


def test_git_out_of_reach_after_the_review_deletes_the_branch_by_rest(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    from tests.helpers import REPO

    def git_goes_down() -> None:
        github.git_down = True

    model.responder = fixing_agent(on_review=git_goes_down)
    start(github)
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert github.ref(REPO, BRANCH) is None
    assert len(deletes(github)) == 1, deletes(github)


def test_the_local_github_deletes_a_merged_head_when_the_repository_says_so(
    github: GitHubServer,
) -> None:
    """The stand-in first: GitHub's setting, in the repository's JSON, and its effect."""
    from bot.standins import gitrepo
    from tests.helpers import REPO, sample_repo

    sample_repo(github)
    repo = github.repo(REPO)
    repo.delete_branch_on_merge = True
    with github.as_user("acme") as u:
        assert u.get(f"/repos/{REPO}").json()["delete_branch_on_merge"] is True
        main = gitrepo.resolve(repo.path, "refs/heads/main")
        gitrepo.git(repo.path, "update-ref", "refs/heads/topic", str(main))
        gitrepo.seed(repo.path, "topic", {"NEW.md": "new\n"}, "new")
        pr = u.post(
            f"/repos/{REPO}/pulls", json={"title": "t", "head": "topic", "base": "main"}
        ).json()["number"]
        done = u.put(f"/repos/{REPO}/pulls/{pr}/merge", json={"merge_method": "squash"})
        assert done.status_code == 200, done.text
        assert github.ref(REPO, "topic") is None
        again = u.delete(f"/repos/{REPO}/git/refs/heads/topic")
        assert again.status_code == 422 and "Reference does not exist" in again.text
