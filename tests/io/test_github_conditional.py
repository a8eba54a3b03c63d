"""Conditional reads (bot/io/github/conditional.py) against the local GitHub: a read sent
again carries the ETag and a 304 gives the same data; a changed resource is read fresh
at once, whatever GitHub's max-age; no two installations or tokens share a body; the
bound holds; the tally counts a 304 as its own kind."""

from __future__ import annotations

import pytest
from redis import Redis

from bot.core.settings import Settings
from bot.io.github import tally
from bot.io.github.client import GitHubApp, Installation
from bot.io.github.conditional import MAX_BODY, Bodies, Body
from bot.standins import gitrepo
from bot.standins.github import GitHubServer

REPO = "acme/widgets"
ISSUE = f"/repos/{REPO}/issues/1"


@pytest.fixture
def gh(github: GitHubServer, settings: Settings, redis: Redis) -> Installation:
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    return GitHubApp(settings, sleep=lambda _: None, redis=redis).installation(iid)


def answered_304(github: GitHubServer, path: str) -> int:
    return sum(1 for (m, p, _) in github.not_modified if (m, p) == ("GET", path))


def test_an_unchanged_issue_read_again_is_answered_304_with_the_same_data(
    gh: Installation, github: GitHubServer, redis: Redis
) -> None:
    first = gh.issue(REPO, 1)
    assert answered_304(github, ISSUE) == 0
    again = gh.issue(REPO, 1)
    # The stand-in answers 304 only to the If-None-Match of the body it sent.
    assert answered_304(github, ISSUE) == 1
    assert again == first and again.title == "Bug" and again.open
    kinds = {k: n for (_, k, what), n in tally.counts(redis).items() if what.endswith("/N")}
    assert kinds == {"read": 1, "read304": 1}


def test_a_closed_issue_is_read_closed_at_once(gh: Installation, github: GitHubServer) -> None:
    """The stale read this must never make: GitHub says max-age=60, and the gate decides
    on these reads. The next read, a moment later, sees the change."""
    assert gh.issue(REPO, 1).open
    with github.as_user("acme") as alice:
        assert alice.patch(ISSUE, json={"state": "closed"}).status_code == 200
    assert not gh.issue(REPO, 1).open
    assert answered_304(github, ISSUE) == 0
    assert not gh.issue(REPO, 1).open  # and that fresh body is the one held now
    assert answered_304(github, ISSUE) == 1


def test_a_moved_pull_head_is_read_at_once(gh: Installation, github: GitHubServer) -> None:
    repo = github.repo(REPO)
    gitrepo.git(repo.path, "branch", "loop/issue-1", "main")
    first_sha = gitrepo.seed(repo.path, "loop/issue-1", {"README.md": "fixed\n"}, "fix")
    pr = gh.open_pull(REPO, "loop/issue-1", "main", "Fix", "Done.", closes=1)
    path = f"/repos/{REPO}/pulls/{pr.number}"
    assert gh.pull(REPO, pr.number).head_sha == first_sha
    assert gh.pull(REPO, pr.number).head_sha == first_sha
    assert answered_304(github, path) == 1
    moved = gitrepo.seed(repo.path, "loop/issue-1", {"README.md": "fixed again\n"}, "more")
    assert moved != first_sha
    assert gh.pull(REPO, pr.number).head_sha == moved
    assert answered_304(github, path) == 1


def test_no_two_installations_or_tokens_share_a_body(
    gh: Installation, github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """``GET /installation/repositories`` is one URL with an answer per installation."""
    other_id = github.add_installation("other")
    github.add_repo("other/gadgets", {"README.md": "hi\n"}, installation_id=other_id)
    other = GitHubApp(settings, sleep=lambda _: None, redis=redis).installation(other_id)
    path = "/installation/repositories"
    assert gh.repositories() == [REPO]
    assert other.repositories() == ["other/gadgets"]
    assert answered_304(github, path) == 0 and len(other.bodies) == 1
    assert gh.repositories() == [REPO]
    assert answered_304(github, path) == 1
    # A new token of the same installation does not send the old token's ETag.
    github.revoke_tokens()
    gh.issue(REPO, 1)  # answered 401, and read again with a new token
    assert gh.repositories() == [REPO]
    assert answered_304(github, path) == 1


def test_the_bound_holds_least_recently_used_out(gh: Installation, github: GitHubServer) -> None:
    gh.bodies = Bodies(max_entries=2)  # before the first request builds the client
    with github.as_user("acme") as alice:
        for n in (2, 3):
            alice.post(f"/repos/{REPO}/issues", json={"title": f"Bug {n}", "body": "x"})
    for n in (1, 2, 3):
        gh.issue(REPO, n)
    assert len(gh.bodies) == 2
    gh.issue(REPO, 3)  # held: a 304
    gh.issue(REPO, 1)  # the oldest, dropped: read in full
    assert answered_304(github, f"/repos/{REPO}/issues/3") == 1
    assert answered_304(github, ISSUE) == 0


def test_bodies_keep_within_their_bytes() -> None:
    bodies = Bodies(max_entries=10, max_bytes=100)
    for n in range(5):
        bodies.put(("t", f"/r/{n}", ""), Body(f'"{n}"', (), b"x" * 40))
    assert len(bodies) == 2 and bodies.nbytes == 80
    assert bodies.get(("t", "/r/4", "")) is not None and bodies.get(("t", "/r/2", "")) is None
    bodies.put(("t", "/big", ""), Body('"b"', (), b"x" * 101))  # larger than all: not kept
    assert bodies.get(("t", "/big", "")) is None and bodies.nbytes == 80
    default = Bodies()
    assert (default.max_entries, default.max_bytes) == (256, 8 * 1024 * 1024)
    default.put(("t", "/file", ""), Body('"f"', (), b"x" * (MAX_BODY + 1)))
    assert len(default) == 0  # a body over 1 MiB is not kept


def test_a_write_drops_the_body_of_what_it_changed(gh: Installation) -> None:
    gh.issue(REPO, 1)
    assert len(gh.bodies) == 1
    gh.add_labels(REPO, 1, ["loop"])  # POST .../issues/1/labels: another resource
    assert len(gh.bodies) == 1
    gh.rewrite_issue(REPO, 1, "k", "Bug", "Still breaks")  # PATCH .../issues/1
    assert len(gh.bodies) == 0
