"""The local GitHub answers conditional requests as GitHub does: a JSON GET carries an
ETag and GitHub's caching headers, a GET with a matching ``If-None-Match`` is a 304
without a body, and the primary rate limit (X-RateLimit-*) counts every request of a
credential but a 304. Sent raw with an installation's token."""

from __future__ import annotations

import httpx
from redis import Redis

from bot.core.settings import Settings
from bot.io.github.client import GitHubApp
from bot.standins.github import GitHubServer
from bot.standins.serving import client_tls

REPO = "acme/widgets"


def test_a_matching_if_none_match_is_a_304_that_the_rate_limit_does_not_count(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    token = GitHubApp(settings, redis=redis).installation(iid).token()

    def get(**headers: str) -> httpx.Response:
        return httpx.get(
            f"{settings.api_url}/repos/{REPO}/issues/1",
            headers={"Authorization": f"token {token}", **headers},
            verify=client_tls(),
        )

    first = get()
    assert first.status_code == 200 and first.json()["title"] == "Bug"
    tag = first.headers["ETag"]
    assert tag.startswith('W/"') and tag.endswith('"')
    assert first.headers["Cache-Control"] == "private, max-age=60, s-maxage=60"
    assert first.headers["Vary"] == "Accept, Authorization, Cookie"
    used = int(first.headers["X-RateLimit-Used"])
    assert used >= 1 and first.headers["X-RateLimit-Resource"] == "core"
    assert int(first.headers["X-RateLimit-Remaining"]) == github.rate_limit - used

    same = get(**{"If-None-Match": tag})
    assert same.status_code == 304 and same.content == b""
    assert same.headers["ETag"] == tag
    assert int(same.headers["X-RateLimit-Used"]) == used  # not counted
    assert github.not_modified == [("GET", f"/repos/{REPO}/issues/1", "installation")]

    stale = get(**{"If-None-Match": 'W/"not-this-one"'})
    assert stale.status_code == 200 and stale.json()["title"] == "Bug"
    assert int(stale.headers["X-RateLimit-Used"]) == used + 1

    with github.as_user("acme") as alice:  # the issue changes: its tag does too
        alice.patch(f"/repos/{REPO}/issues/1", json={"state": "closed"})
    changed = get(**{"If-None-Match": tag})
    assert changed.status_code == 200 and changed.json()["state"] == "closed"
    assert changed.headers["ETag"] != tag
    assert len(github.not_modified) == 1


def test_each_credential_has_its_own_rate_limit(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    app = GitHubApp(settings, redis=redis)
    used = []
    for owner in ("acme", "other"):
        iid = github.add_installation(owner)
        github.add_repo(f"{owner}/widgets", {"README.md": "hi\n"}, installation_id=iid)
        token = app.installation(iid).token()
        for _ in range(3 if owner == "acme" else 1):
            r = httpx.get(
                f"{settings.api_url}/repos/{owner}/widgets",
                headers={"Authorization": f"token {token}"},
                verify=client_tls(),
            )
        used.append(int(r.headers["X-RateLimit-Used"]))
    assert used == [3, 1]
