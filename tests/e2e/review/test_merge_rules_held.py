"""Merges that wait for a person, attacked where they held: approvals that must not count
(triage, the App itself, a writer who lost write access), and webhooks that only wake the
gate (forged, unsigned, or about another repository's pull request of the same number):
GitHub's own verdict, read again, decides. Real loops against the local GitHub."""

from __future__ import annotations

from typing import Any

import httpx
from redis import Redis

from bot.core.record import Status
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.github.shapes import event_base, pull_json
from bot.standins.github.state import ReviewRule
from tests.conftest import Web
from tests.e2e.review.test_merge_rules import merged_within, record, review, start
from tests.e2e.review.test_review_merge import FIX, report
from tests.helpers import REPO


def still_waiting(github: GitHubServer, redis: Redis) -> Any:
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert r.detail == "waiting for 1 approving review by a writer", r.detail
    assert not github.repo(REPO).pulls[r.pr_number].merged
    return r


def test_approvals_that_do_not_count_never_merge_and_one_that_does_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    start(github, drain, ReviewRule(required_approving_review_count=1))
    r = still_waiting(github, redis)
    repo = github.repo(REPO)
    repo.permissions["triager"] = "triage"
    review(github, "triager", r.pr_number)  # triage is not write
    drain()
    still_waiting(github, redis)
    # The App itself cannot approve its own pull request (GitHub's 422).
    token = github.app_token_for(repo.installation_id)
    with httpx.Client(base_url=github.url, headers={"Authorization": f"token {token}"}) as c:
        answer = c.post(f"/repos/{REPO}/pulls/{r.pr_number}/reviews", json={"event": "APPROVE"})
    assert answer.status_code == 422, answer.text
    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []


def test_an_approval_by_someone_who_lost_write_access_no_longer_counts(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    github.add_user("leaver")
    start(github, drain, ReviewRule(required_approving_review_count=2))
    repo = github.repo(REPO)
    repo.permissions["leaver"] = "write"
    r = record(redis)
    review(github, "leaver", r.pr_number)  # one of two
    drain()
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    repo.permissions["leaver"] = "read"  # GitHub counts approvals by writers, as they are now
    review(github, "writer", r.pr_number)
    drain()
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "awaiting_approval"), r
    assert not repo.pulls[r.pr_number].merged
    repo.permissions["leaver"] = "write"
    review(github, "leaver", r.pr_number, "COMMENT")  # wakes the gate; the approval stands
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []


def test_webhooks_only_wake_the_gate_and_github_decides(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    start(github, drain, ReviewRule(required_approving_review_count=1))
    r = still_waiting(github, redis)
    repo = github.repo(REPO)
    pull = repo.pulls[r.pr_number]
    writer = github.users["writer"]
    approved = {
        "action": "submitted",
        "review": {"id": 1, "state": "approved", "user": writer.json(), "body": ""},
        "pull_request": pull_json(github, repo, pull),
        **event_base(github, repo, writer),
    }
    # Unsigned: refused at the door.
    answer = httpx.post(
        web.webhook_url,
        json=approved,
        headers={"X-GitHub-Event": "pull_request_review", "X-GitHub-Delivery": "forged-1"},
    )
    assert answer.status_code == 401, answer.text
    # Signed (as if GitHub sent it) but no such approval exists: the gate reads GitHub.
    github.emit("pull_request_review", approved)
    drain()
    still_waiting(github, redis)
    # Another repository's pull request with the same number, approved for real there.
    github.add_repo(
        "acme/other",
        {"README.md": "# other\n"},
        installation_id=repo.installation_id,
        collaborators={"writer": "write"},
    )
    other = github.repo("acme/other")
    other_payload = approved | {
        "pull_request": pull_json(github, repo, pull) | {"number": r.pr_number},
        **event_base(github, other, writer),
    }
    github.emit("pull_request_review", other_payload)
    drain()
    still_waiting(github, redis)
    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
    assert repo.merge_refusals == []
