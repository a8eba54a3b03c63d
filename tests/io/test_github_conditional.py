"""Conditional reads (bot/io/github/conditional.py) against the local GitHub: a read sent
again carries the ETag and a 304 gives the same data; a changed resource is read fresh
at once, whatever GitHub's max-age; no two installations share a body; the bounds hold;
the tally counts a 304 as its own kind. With Redis, the bodies are shared by every job
(client) of an installation, across its token's rotations, and Redis failing fails no
read; without it, they stay in the process, per token."""

from __future__ import annotations

import os
from typing import Any

import pytest
from redis import Redis
from structlog.testing import capture_logs

from bot.core.settings import Settings
from bot.io.github import tally
from bot.io.github.client import GitHubApp, Installation
from bot.io.github.conditional import (
    MAX_BODY,
    REDIS_MAX_BODY,
    REDIS_TTL,
    Bodies,
    Body,
    RedisBodies,
)
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


@pytest.fixture
def local(gh: Installation, settings: Settings) -> Installation:
    """The same installation without Redis: its bodies in the process."""
    return GitHubApp(settings, sleep=lambda _: None).installation(gh.installation_id)


def another_job(gh: Installation, settings: Settings, redis: Redis) -> Installation:
    """The installation as the next job sees it: its own app, token and client, built
    afresh over the same Redis (an RQ work horse is a fresh fork for each job)."""
    return GitHubApp(settings, sleep=lambda _: None, redis=redis).installation(gh.installation_id)


def etag_keys(redis: Redis) -> list[str]:
    return sorted(k.decode() for k in redis.scan_iter("loopbot:etag:*"))


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


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "process"])
def test_no_two_installations_share_a_body(
    shared: bool, gh: Installation, github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """``GET /installation/repositories`` is one URL with an answer per installation."""
    other_id = github.add_installation("other")
    github.add_repo("other/gadgets", {"README.md": "hi\n"}, installation_id=other_id)
    app = GitHubApp(settings, sleep=lambda _: None, redis=redis if shared else None)
    mine, other = app.installation(gh.installation_id), app.installation(other_id)
    path = "/installation/repositories"
    assert mine.repositories() == [REPO]
    assert other.repositories() == ["other/gadgets"]
    assert answered_304(github, path) == 0
    assert mine.repositories() == [REPO]
    assert other.repositories() == ["other/gadgets"]
    assert answered_304(github, path) == 2
    if shared:
        assert etag_keys(redis) == [
            f"loopbot:etag:{gh.installation_id}:{path}",
            f"loopbot:etag:{other_id}:{path}",
        ]


def test_in_the_process_a_new_token_does_not_send_the_old_tokens_etag(
    local: Installation, github: GitHubServer, redis: Redis
) -> None:
    path = "/installation/repositories"
    assert local.repositories() == [REPO]
    assert local.repositories() == [REPO]
    assert answered_304(github, path) == 1
    github.revoke_tokens()
    local.issue(REPO, 1)  # answered 401, and read again with a new token
    assert local.repositories() == [REPO]
    assert answered_304(github, path) == 1
    assert etag_keys(redis) == []  # no Redis given: none used


def test_the_bound_holds_least_recently_used_out(local: Installation, github: GitHubServer) -> None:
    gh = local
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


def test_a_write_drops_the_body_of_what_it_changed(local: Installation) -> None:
    gh = local
    gh.issue(REPO, 1)
    assert isinstance(gh.bodies, Bodies) and len(gh.bodies) == 1
    gh.add_labels(REPO, 1, ["loop"])  # POST .../issues/1/labels: another resource
    assert len(gh.bodies) == 1
    gh.rewrite_issue(REPO, 1, "k", "Bug", "Still breaks")  # PATCH .../issues/1
    assert len(gh.bodies) == 0


def test_in_redis_a_write_drops_the_bodies_of_what_it_changed(
    gh: Installation, redis: Redis
) -> None:
    gh.issue(REPO, 1)
    assert etag_keys(redis) == [f"loopbot:etag:{gh.installation_id}:{ISSUE}"]
    gh.add_labels(REPO, 1, ["loop"])  # POST .../issues/1/labels: another resource
    assert etag_keys(redis) == [f"loopbot:etag:{gh.installation_id}:{ISSUE}"]
    gh.rewrite_issue(REPO, 1, "k", "Bug", "Still breaks")  # PATCH .../issues/1
    assert etag_keys(redis) == []


# -- shared through Redis: every job of an installation ------------------------------


# The stand-in stamps an issue's ``updated_at`` with the second it is read, so its ETag
# changes each second; these read a file, ``.github/loop.yml`` (the measured case: read
# by one job after another), whose body changes only with the file.
LOOP_YML = f"/repos/{REPO}/contents/.github/loop.yml"


@pytest.fixture
def loop_yml(github: GitHubServer, gh: Installation) -> str:
    gitrepo.seed(github.repo(REPO).path, "main", {".github/loop.yml": "max_turns: 3\n"}, "cfg")
    return ".github/loop.yml"


def test_the_next_jobs_first_read_of_an_unchanged_file_is_a_304(
    gh: Installation, github: GitHubServer, settings: Settings, redis: Redis, loop_yml: str
) -> None:
    assert gh.file(REPO, loop_yml) == "max_turns: 3\n"
    minted = len(token_mints(github))
    job2 = another_job(gh, settings, redis)
    # Nothing in the process is shared; the installation's token is, through Redis
    # (bot/io/github/tokens.py), and GitHub answers 304 only to the token whose read
    # gave the ETag.
    assert job2.token() == gh.token() and len(token_mints(github)) == minted
    assert job2.file(REPO, loop_yml) == "max_turns: 3\n"
    assert answered_304(github, LOOP_YML) == 1


def token_mints(github: GitHubServer) -> list[str]:
    return [p for m, p, _ in github.requests if m == "POST" and p.endswith("/access_tokens")]


def test_a_change_between_two_jobs_is_read_fresh(
    gh: Installation, github: GitHubServer, settings: Settings, redis: Redis, loop_yml: str
) -> None:
    assert gh.issue(REPO, 1).open
    assert gh.file(REPO, loop_yml) == "max_turns: 3\n"
    with github.as_user("acme") as alice:
        assert alice.patch(ISSUE, json={"state": "closed"}).status_code == 200
    gitrepo.seed(github.repo(REPO).path, "main", {loop_yml: "max_turns: 5\n"}, "more")
    job2 = another_job(gh, settings, redis)
    assert not job2.issue(REPO, 1).open
    assert job2.file(REPO, loop_yml) == "max_turns: 5\n"
    assert answered_304(github, ISSUE) == 0 and answered_304(github, LOOP_YML) == 0
    job3 = another_job(gh, settings, redis)
    assert job3.file(REPO, loop_yml) == "max_turns: 5\n"  # the fresh body is the one held
    assert answered_304(github, LOOP_YML) == 1


def test_a_rotated_token_reads_whole_once_then_its_own_etag_is_a_304(
    gh: Installation, github: GitHubServer, loop_yml: str
) -> None:
    """GitHub's ETags are per token (GitHub support, quoted in eclipse-csi/otterdog#201),
    and so are the local GitHub's: the new token's read sends the old ETag and gets the
    whole body, which replaces the entry; its next read is a 304."""
    assert gh.file(REPO, loop_yml) == "max_turns: 3\n"
    before = gh.token()
    github.revoke_tokens()
    # Answered 401, and read again with a new token: whole, never a stale 304.
    assert gh.file(REPO, loop_yml) == "max_turns: 3\n"
    assert gh.token() != before
    assert answered_304(github, LOOP_YML) == 0
    assert gh.file(REPO, loop_yml) == "max_turns: 3\n"
    assert answered_304(github, LOOP_YML) == 1


def test_redis_failing_fails_no_read_and_is_logged_once(
    gh: Installation, github: GitHubServer, redis: Redis
) -> None:
    """The bodies' Redis refuses every connection (the pace's still answers): reads are
    sent unconditionally and succeed, and the store is left alone for a while after the
    first failure (redis-py retries a refused connection ten times, with backoff: seconds
    a read would wait each time)."""

    class Dead(Redis):
        tries = 0

        def pipeline(self, *args: Any, **kwargs: Any) -> Any:
            Dead.tries += 1
            return super().pipeline(*args, **kwargs)

        def delete(self, *names: Any) -> Any:
            Dead.tries += 1
            return super().delete(*names)

    dead = Dead(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    gh.bodies = RedisBodies(dead, gh.installation_id)  # before the first request
    with capture_logs() as logs:
        for _ in range(3):
            assert gh.issue(REPO, 1).title == "Bug"
        gh.rewrite_issue(REPO, 1, "k", "Bug", "Still breaks")  # a write's DEL rests too
        assert gh.issue(REPO, 1).title == "Bug"
    assert answered_304(github, ISSUE) == 0
    assert [e["event"] for e in logs].count("github.etag_store_failed") == 1
    assert Dead.tries == 1  # the first read's; the others left the store alone
    assert etag_keys(redis) == []
    # Once the rest is over, it is tried again (and fails again, logged no more).
    gh.bodies._rest_until = 0.0  # type: ignore[attr-defined]
    assert gh.issue(REPO, 1).title == "Bug"
    assert Dead.tries == 2


def test_no_body_over_256_kib_is_kept_in_redis(
    gh: Installation, github: GitHubServer, redis: Redis
) -> None:
    big = os.urandom(REDIS_MAX_BODY // 2).hex()  # 256 KiB of text, more as base64 JSON
    repo = github.repo(REPO)
    gitrepo.seed(repo.path, "main", {"big.txt": big, "small.txt": "small\n"}, "files")
    for _ in range(2):
        assert gh.file(REPO, "big.txt") == big
        assert gh.file(REPO, "small.txt") == "small\n"
    assert answered_304(github, f"/repos/{REPO}/contents/big.txt") == 0
    assert answered_304(github, f"/repos/{REPO}/contents/small.txt") == 1
    assert etag_keys(redis) == [
        f"loopbot:etag:{gh.installation_id}:/repos/{REPO}/contents/small.txt"
    ]
    # Directly too: at the bound kept, one byte over not.
    bodies = RedisBodies(redis, 99)
    bodies.put(("99", "https://x/a", ""), Body('"a"', (), b"x" * REDIS_MAX_BODY))
    bodies.put(("99", "https://x/b", ""), Body('"b"', (), b"x" * (REDIS_MAX_BODY + 1)))
    assert bodies.get(("99", "https://x/a", "")) is not None
    assert bodies.get(("99", "https://x/b", "")) is None
    assert (
        redis.hlen("loopbot:etag:99:/a"),
        redis.exists("loopbot:etag:99:/b"),
    ) == (1, 0)


def test_each_entry_has_a_ttl_refreshed_on_use(gh: Installation, redis: Redis) -> None:
    gh.issue(REPO, 1)
    key = f"loopbot:etag:{gh.installation_id}:{ISSUE}"
    assert REDIS_TTL - 5 <= redis.ttl(key) <= REDIS_TTL == 15 * 60
    redis.expire(key, 10)
    gh.issue(REPO, 1)  # its use keeps it, whatever GitHub answers
    assert redis.ttl(key) > REDIS_TTL - 5


def test_bodies_in_redis_are_compressed(redis: Redis) -> None:
    bodies = RedisBodies(redis, 7)
    content = b'{"body": "' + b"a" * 10_000 + b'"}'
    headers = (("Content-Type", "application/json"), ("X-GitHub-Request-Id", "1"))
    bodies.put(("7", "https://x/r?page=2", "application/json"), Body('"e"', headers, content))
    assert len(redis.hget("loopbot:etag:7:/r", "application/json https://x/r?page=2") or b"") < 1000
    held = bodies.get(("7", "https://x/r?page=2", "application/json"))
    # Only the headers githubkit reads of a 200 are kept; the 304 brings the rest.
    assert held == Body('"e"', (("Content-Type", "application/json"),), content)
