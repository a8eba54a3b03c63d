"""The local GitHub refuses check runs as GitHub documents (422): a ``completed`` status
without its conclusion, a status or conclusion outside GitHub's values; and, as GitHub,
a conclusion alone makes the run ``completed``. Sent raw with the installation's token
(githubkit's own models refuse the first two before they are sent)."""

from __future__ import annotations

from typing import Any

import httpx
from redis import Redis

from bot.core.settings import Settings
from bot.io.github.client import GitHubApp
from bot.standins import gitrepo
from bot.standins.github import GitHubServer
from bot.standins.serving import client_tls

REPO = "acme/widgets"


def test_check_runs_are_refused_as_github_refuses_them(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    iid = github.add_installation("acme")
    repo = github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    sha = gitrepo.seed(repo.path, "loop/issue-1", {"a.txt": "a\n"}, "turn 1")
    token = GitHubApp(settings, redis=redis).installation(iid).token()

    def post(**body: Any) -> httpx.Response:
        return httpx.post(
            f"{settings.api_url}/repos/{REPO}/check-runs",
            json={"name": "loopbot", "head_sha": sha, **body},
            headers={"Authorization": f"token {token}"},
            verify=client_tls(),
        )

    refused = post(status="completed")
    assert refused.status_code == 422, refused.text
    assert "conclusion is required" in refused.json()["message"]
    assert post(status="done").status_code == 422
    assert post(status="completed", conclusion="passed").status_code == 422
    assert repo.check_runs == {}
    made = post(status="in_progress", conclusion="success")
    assert made.status_code == 201, made.text
    assert (made.json()["status"], made.json()["conclusion"]) == ("completed", "success")
    run = made.json()["id"]
    patched = httpx.patch(
        f"{settings.api_url}/repos/{REPO}/check-runs/{run}",
        json={"status": "completed"},  # its conclusion is there already
        headers={"Authorization": f"token {token}"},
        verify=client_tls(),
    )
    assert patched.status_code == 200, patched.text


def test_a_merge_the_base_s_required_checks_do_not_pass_is_refused(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """As GitHub answers (405, 'Required status check "X" is expected.'): a required
    check missing, in progress or failing on the head refuses the merge; passed, it
    merges."""
    iid = github.add_installation("acme")
    repo = github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    gitrepo.git(repo.path, "branch", "loop/issue-1", "main")  # from main, as a loop's
    sha = gitrepo.seed(repo.path, "loop/issue-1", {"a.txt": "a\n"}, "turn 1")
    github.require_checks(REPO, "main", ["loopbot"])
    token = GitHubApp(settings, redis=redis).installation(iid).token()
    auth = {"Authorization": f"token {token}"}

    def call(method: str, path: str, **body: Any) -> httpx.Response:
        return httpx.request(
            method,
            f"{settings.api_url}/repos/{REPO}{path}",
            json=body,
            headers=auth,
            verify=client_tls(),
        )

    pull = call("POST", "/pulls", head="loop/issue-1", base="main", title="t").json()["number"]
    refused = call("PUT", f"/pulls/{pull}/merge", merge_method="squash", sha=sha)
    assert refused.status_code == 405, refused.text
    assert refused.json()["message"] == 'Required status check "loopbot" is expected.'
    call("POST", "/check-runs", name="loopbot", head_sha=sha, status="in_progress")
    assert call("PUT", f"/pulls/{pull}/merge", merge_method="squash").status_code == 405
    call("POST", "/check-runs", name="loopbot", head_sha=sha, conclusion="failure")
    assert call("PUT", f"/pulls/{pull}/merge", merge_method="squash").status_code == 405
    call("POST", "/check-runs", name="loopbot", head_sha=sha, conclusion="success")
    merged = call("PUT", f"/pulls/{pull}/merge", merge_method="squash")
    assert merged.status_code == 200 and merged.json()["merged"], merged.text
    assert [r[1] for r in repo.merge_refusals] == [405, 405, 405]
