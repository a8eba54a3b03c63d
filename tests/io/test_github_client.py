"""The GitHub client against the local GitHub server: auth, retries, idempotent writes."""

from __future__ import annotations

import pytest
from redis import Redis

from bot.core.settings import Settings
from bot.io.github.client import GitHubApp, Installation
from bot.io.github.failures import NotFound, Unavailable
from bot.standins.github import GitHubServer

REPO = "acme/widgets"


@pytest.fixture
def gh(github: GitHubServer, settings: Settings):  # type: ignore[no-untyped-def]
    iid = github.add_installation("acme")
    github.add_repo(
        REPO,
        {"README.md": "hi\n"},
        installation_id=iid,
        collaborators={"writer": "write", "reader": "read", "maint": "maintain"},
    )
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    sleeps: list[float] = []
    app = GitHubApp(settings, sleep=sleeps.append)
    inst = app.installation(iid)
    inst.sleeps = sleeps  # type: ignore[attr-defined]
    return inst


def test_reads_through_app_installation_token(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    repo = gh.repo(REPO)
    assert repo.default_branch == "main"
    assert repo.clone_url.endswith(f"/git/{REPO}.git")
    issue = gh.issue(REPO, 1)
    assert issue.title == "Bug" and issue.open
    # One JWT call minted the token; the reads used the installation token.
    kinds = [k for (m, path, k) in github.requests if m == "GET" and path.startswith("/repos/")]
    assert set(kinds) == {"installation"}
    assert sum(1 for (_, p, _) in github.requests if p.endswith("/access_tokens")) == 1


def test_permissions(gh) -> None:  # type: ignore[no-untyped-def]
    assert gh.can_write(REPO, "writer")
    assert gh.can_write(REPO, "maint")
    assert gh.can_write(REPO, "acme")
    assert not gh.can_write(REPO, "reader")
    assert not gh.can_write(REPO, "stranger")


def test_revoked_token_is_minted_again_on_401(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    gh.issue(REPO, 1)
    github.revoke_tokens()
    assert gh.issue(REPO, 1).number == 1
    assert sum(1 for (_, p, _) in github.requests if p.endswith("/access_tokens")) == 2


def test_5xx_is_retried(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    github.inject("GET", r"/issues/1$", 502, times=2)
    assert gh.issue(REPO, 1).number == 1
    assert len(gh.sleeps) == 2


def test_secondary_rate_limit_waits_retry_after(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    github.inject(
        "POST",
        r"/issues/1/comments$",
        403,
        headers={"Retry-After": "3"},
        body={"message": "You have exceeded a secondary rate limit"},
    )
    gh.upsert_comment(REPO, 1, "status", "hello")
    assert gh.sleeps == [3.0]
    assert len([c for c in github.repo(REPO).comments.values()]) == 1


def test_write_that_landed_before_a_5xx_is_not_repeated(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    # GitHub applied the comment but the answer was lost as a 500: the retry must find it.
    github.inject("POST", r"/issues/1/comments$", 500, after=True)
    c = gh.upsert_comment(REPO, 1, "status", "hello")
    comments = list(github.repo(REPO).comments.values())
    assert len(comments) == 1 and comments[0]["id"] == c.id


def test_upsert_edits_instead_of_adding(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    first = gh.upsert_comment(REPO, 1, "status", "one")
    second = gh.upsert_comment(REPO, 1, "status", "two")
    assert first.id == second.id
    assert "two" in github.repo(REPO).comments[first.id]["body"]


def test_pull_request_created_once_across_lost_answers(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    from bot.standins import gitrepo

    repo = github.repo(REPO)
    gitrepo.git(repo.path, "branch", "loop/issue-1", "main")
    gitrepo.seed(repo.path, "loop/issue-1", {"README.md": "fixed\n"}, "fix")
    github.inject("POST", r"/pulls$", 502, after=True)
    pr = gh.open_pull(REPO, "loop/issue-1", "main", "Fix", "Done.", closes=1)
    again = gh.open_pull(REPO, "loop/issue-1", "main", "Fix", "Done.", closes=1)
    assert pr.number == again.number
    assert len(repo.pulls) == 1


def test_persistent_outage_ends_with_a_clear_error(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    github.inject("GET", r"/issues/1$", 503, times=100)
    with pytest.raises(Unavailable, match="503"):
        gh.issue(REPO, 1)


def test_rate_limit_longer_than_allowed_wait_is_fatal(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    github.inject("GET", r"/issues/1$", 403, headers={"Retry-After": "3600"})
    with pytest.raises(Unavailable, match="rate limited"):
        gh.issue(REPO, 1)
    assert gh.sleeps == []


def test_missing_things(gh) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NotFound):
        gh.issue(REPO, 99)
    assert gh.file(REPO, ".github/loop.yml") is None
    assert gh.file(REPO, "README.md") == "hi\n"


def test_required_checks_from_protection_and_rulesets(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    assert gh.required_checks(REPO, "main") is None  # nothing required: every check counts
    github.require_checks(REPO, "main", ["ci/test"])
    assert gh.required_checks(REPO, "main") == {"ci/test"}
    github.require_checks(REPO, "main", ["deploy", "ci/test"], ruleset=True)
    assert gh.required_checks(REPO, "main") == {"ci/test", "deploy"}
    # Older GitHub Enterprise Server has no rulesets endpoint: protection still counts.
    github.inject("GET", r"/rules/branches/", 404, times=5)
    assert gh.required_checks(REPO, "main") == {"ci/test"}


def test_every_page_of_commit_statuses_is_read(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    """Red team: only the first page (30) of the combined status was read, so a failing
    status past it was never seen by the gate."""
    from bot.standins import gitrepo

    sha = gitrepo.resolve(github.repo(REPO).path, "main")
    with github.as_user("acme") as u:
        for i in range(130):
            state = "failure" if i == 129 else "success"
            u.post(f"/repos/{REPO}/statuses/{sha}", json={"state": state, "context": f"ci/{i}"})
    statuses = gh.commit_statuses(REPO, sha)
    assert len(statuses) == 130 and ("ci/129", "failure") in statuses


def test_update_pull_keeps_closes_defuses_and_redacts(
    gh: Installation, github: GitHubServer, settings: Settings
) -> None:
    from bot.core.text.defuse import JOINER as J
    from bot.standins import gitrepo

    repo = github.repo(REPO)
    gitrepo.git(repo.path, "branch", "loop/issue-1", "main")
    gitrepo.seed(repo.path, "loop/issue-1", {"README.md": "fixed\n"}, "fix")
    pr = gh.open_pull(REPO, "loop/issue-1", "main", "Fix", "Done.", closes=1)
    secret, token = settings.github_webhook_secret.get_secret_value(), gh.token()
    text = f"Turn 2 of 2. The agent printed {secret} and {token}; also fixes #1, cc @acme."
    updated = gh.update_pull(REPO, pr.number, body=text, closes=1)
    body = repo.issues[pr.number].body
    assert body.startswith("Closes #1\n\nTurn 2 of 2.") and updated.body == body
    assert secret not in body and token not in body and body.count("[redacted]") == 2
    assert f"#{J}1" in body and f"@{J}acme" in body  # loopbot's own Closes only
    assert repo.issues[pr.number].title == "Fix"  # no title given: kept
    patches = sum(1 for (m, p, _) in github.requests if m == "PATCH" and "/pulls/" in p)
    # The pull request as just read says this already: nothing is written.
    gh.update_pull(REPO, pr.number, body=text, closes=1, current=updated)
    assert sum(1 for (m, p, _) in github.requests if m == "PATCH" and "/pulls/" in p) == patches
    gh.update_pull(REPO, pr.number, body="Turn 3.", closes=1, title="Fix @acme", current=updated)
    assert repo.issues[pr.number].body == "Closes #1\n\nTurn 3."
    assert repo.issues[pr.number].title == f"Fix @{J}acme"


def test_standin_pull_edit_answers_as_github(gh, github: GitHubServer) -> None:  # type: ignore[no-untyped-def]
    from bot.standins import gitrepo

    repo = github.repo(REPO)
    gitrepo.git(repo.path, "branch", "loop/issue-1", "main")
    gitrepo.seed(repo.path, "loop/issue-1", {"README.md": "fixed\n"}, "fix")
    pr = gh.open_pull(REPO, "loop/issue-1", "main", "Fix", "Done.", closes=1)
    with github.as_user("acme") as u:
        r = u.patch(f"/repos/{REPO}/pulls/{pr.number}", json={"title": "Better"})
        assert r.status_code == 200
        assert (r.json()["title"], r.json()["number"], r.json()["head"]["ref"]) == (
            "Better",
            pr.number,
            "loop/issue-1",
        )
        assert r.json()["body"] == "Closes #1\n\nDone."  # not sent: kept
        assert u.patch(f"/repos/{REPO}/pulls/{pr.number}", json={"state": "x"}).status_code == 422
        assert u.patch(f"/repos/{REPO}/pulls/{pr.number}", json={"base": "nope"}).status_code == 422
        r = u.patch(f"/repos/{REPO}/pulls/{pr.number}", json={"state": "closed"})
        assert r.json()["state"] == "closed"
        r = u.patch(f"/repos/{REPO}/pulls/{pr.number}", json={"state": "open"})
        assert r.json()["state"] == "open"


def test_a_secondary_limit_without_retry_after_waits_a_minute_not_fails(  # type: ignore[no-untyped-def]
    gh, github: GitHubServer, settings: Settings
) -> None:
    """githubkit raises RateLimitExceeded only with a Retry-After: GitHub's secondary-limit
    message alone is waited out as its docs ask (a minute), not taken for a real 403; a
    minute past the longest wait allowed is a clear Unavailable."""
    message = {"message": "You have exceeded a secondary rate limit. Please wait."}
    github.inject("POST", r"/issues/1/comments$", 403, body=message)
    with pytest.raises(Unavailable, match="secondary rate limit"):  # tests allow 5 s
        gh.upsert_comment(REPO, 1, "status", "hello")
    patient = settings.model_copy(update={"github_max_retry_wait": 120.0})
    sleeps: list[float] = []
    inst = GitHubApp(patient, sleep=sleeps.append).installation(gh.installation_id)
    github.inject("POST", r"/issues/1/comments$", 403, body=message)
    inst.upsert_comment(REPO, 1, "status", "hello")
    assert sleeps == [60.0]
    assert len(github.repo(REPO).comments) == 1


def test_a_paced_installation_s_errors_come_out_as_themselves(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """With the shared pace (Redis), a pause longer than the longest wait surfaces as
    ``Unavailable`` (not a wrapped githubkit error), and a write waits its slot."""
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    sleeps: list[float] = []
    inst = GitHubApp(settings, sleep=sleeps.append, redis=redis).installation(iid)
    assert inst.pace is not None
    inst.pace.pause(600, "a test's pause", slower=False)
    with pytest.raises(Unavailable, match="GitHub paused it"):
        inst.issue(REPO, 1)
    assert sleeps == []


def test_requests_in_flight_stay_within_github_s_concurrency_limit(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """Six workers (each its own client) read at once from a GitHub that allows two
    concurrent requests per installation: with LOOPBOT_GITHUB_MAX_CONCURRENT=2 none is
    refused; with six allowed in flight the same reads are (the local server's limit)."""
    import threading

    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    github.concurrent_limit, github.request_delay = 2, 0.3

    def read_at_once(bound: int) -> list[BaseException]:
        s = settings.model_copy(update={"github_max_concurrent": bound})
        insts = [GitHubApp(s, redis=redis).installation(iid) for _ in range(6)]
        for inst in insts:
            inst.token()  # minted first: the token call is the App's, not the installation's
        errors: list[BaseException] = []

        def read(inst: Installation) -> None:
            try:
                assert inst.issue(REPO, 1).title == "Bug"
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(i,)) for i in insts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors

    assert read_at_once(2) == []
    assert github.limited == [] and github.peak_inflight == 2
    redis.delete(f"loopbot:gh-pause:{iid}")
    assert read_at_once(6), "the local GitHub let six requests in flight"
    assert github.limited
