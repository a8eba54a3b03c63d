"""The local GitHub's merge queue as GitHub documents it, read and written through
loopbot's own client: the rule in ``rules/branches``, the merge endpoint's 405, the
enqueue pinned to a head, the permission it takes, and the queue's removals."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.settings import Settings
from bot.io.github.client import GitHubApp, Installation
from bot.io.github.failures import Conflict
from bot.standins import gitrepo
from bot.standins.github import GitHubServer

REPO = "acme/widgets"


def setup(github: GitHubServer, settings: Settings, **grant: Any) -> tuple[Installation, int]:
    iid = github.add_installation("acme", **grant)
    repo = github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    main = github.ref(REPO, "main")
    gitrepo.git(repo.path, "update-ref", "refs/heads/loop/issue-1", main or "")
    gitrepo.seed(repo.path, "loop/issue-1", {"a.txt": "a\n"}, "change")
    github.require_checks(REPO, "main", ["ci/test"], ruleset=True)
    github.require_merge_queue(REPO, "main", ci="")
    with github.as_user("acme") as u:
        u.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "x"}).raise_for_status()
        pr = u.post(
            f"/repos/{REPO}/pulls",
            json={"title": "Fix", "head": "loop/issue-1", "base": "main", "body": "Closes #1"},
        ).json()["number"]
        head = github.ref(REPO, "loop/issue-1")
        u.post(f"/repos/{REPO}/statuses/{head}", json={"state": "success", "context": "ci/test"})
    return GitHubApp(settings).installation(iid), pr


def test_the_rule_is_listed_and_the_merge_endpoint_refuses(
    github: GitHubServer, settings: Settings
) -> None:
    gh, pr = setup(github, settings)
    assert gh.branch_review_rules(REPO, "main").merge_queue
    head = github.ref(REPO, "loop/issue-1") or ""
    with pytest.raises(Conflict) as refused:
        gh.merge_pull(REPO, pr, head, "squash", "Fix", "body", closes=1)
    assert refused.value.status == 405
    assert "Changes must be made through the merge queue" in str(refused.value)
    assert github.repo(REPO).merge_refusals == [
        (pr, 405, "Changes must be made through the merge queue")
    ]


def test_enqueue_is_pinned_to_the_head_and_the_queue_merges_on_green(
    github: GitHubServer, settings: Settings
) -> None:
    gh, pr = setup(github, settings)
    head = github.ref(REPO, "loop/issue-1") or ""
    state = gh.queue_state(REPO, pr)
    assert (state.in_queue, state.removals, state.head) == (False, 0, head)
    stale = gh.enqueue(state.node_id, "0" * 40)
    assert not stale.ok and "Head branch was modified" in stale.error
    assert gh.enqueue(state.node_id, head).ok
    again = gh.enqueue(state.node_id, head)
    assert not again.ok and "already in the merge queue" in again.error
    now = gh.queue_state(REPO, pr)
    assert now.in_queue and now.entry_state == "AWAITING_CHECKS" and now.position == 1
    group = github.report_queue_checks(REPO, "main", "success")
    assert github.ref(REPO, "main") == group
    pull = gh.pull(REPO, pr)
    assert pull.merged and pull.merge_commit_sha == group
    assert gh.issue(REPO, 1).state == "closed"  # "Closes #1" in the body


def test_failing_group_checks_remove_it_with_a_reason(
    github: GitHubServer, settings: Settings
) -> None:
    gh, pr = setup(github, settings)
    head = github.ref(REPO, "loop/issue-1") or ""
    gh.enqueue(gh.queue_state(REPO, pr).node_id, head)
    github.report_queue_checks(REPO, "main", "failure")
    state = gh.queue_state(REPO, pr)
    assert not state.in_queue and state.removals == 1
    assert (state.removed_reason, state.removed_head) == ("CI_FAILURE", head)
    assert not gh.pull(REPO, pr).merged


def test_an_app_without_the_merge_queues_permission_cannot_enqueue(
    github: GitHubServer, settings: Settings
) -> None:
    gh, pr = setup(
        github,
        settings,
        permissions={"pull_requests": "write", "contents": "write", "metadata": "read"},
    )
    head = github.ref(REPO, "loop/issue-1") or ""
    got = gh.enqueue(gh.queue_state(REPO, pr).node_id, head)
    assert not got.ok and "Resource not accessible by integration" in got.error
