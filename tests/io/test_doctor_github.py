"""``loopbot doctor --github``: the live App against app.yml, its webhook URL and GitHub's
record of deliveries, asked of the local GitHub server through the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from githubkit.utils import UNSET
from githubkit_schemas.v2026_03_10.models import HookDeliveryItem, WebhookConfig
from pydantic import TypeAdapter

from bot.ops.doctor_github import delivery_checks, grant_checks, installation_checks
from bot.ops.manifest import load_manifest
from bot.standins.github import GitHubServer
from bot.standins.redis_server import free_port
from tests.conftest import Web, wait_for
from tests.helpers import REPO, label, open_issue, sample_repo

LOOPBOT = str(Path(sys.executable).parent / "loopbot")
MANIFEST = load_manifest()
WANTED = MANIFEST["default_permissions"]
EVENTS = list(MANIFEST["default_events"])


def doctor(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it, in a directory with no .env of its own."""
    return subprocess.run(
        [LOOPBOT, "doctor", "--github"],
        env=env | {"PATH": "/usr/bin:/bin", "LOOPBOT_ENV_FILE": str(tmp_path / "none.env")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(out: str, mark: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(f"[{mark}]")]


def delivered(github: GitHubServer, n: int) -> None:
    github.wait_for_webhooks()
    wait_for(lambda: len(github.deliveries) >= n, 10, f"{n} deliveries")


def test_all_granted_and_delivered_passes(
    github: GitHubServer, web: Web, env: dict[str, str], tmp_path: Path
) -> None:
    sample_repo(github)
    label(github, "writer", open_issue(github))
    delivered(github, 1)

    r = doctor(env, tmp_path)

    assert r.returncode == 0, r.stdout + r.stderr
    assert not lines(r.stdout, "FAIL")
    asks = f"{len(WANTED)} permissions and {len(EVENTS)} events as app.yml asks"
    assert f"[ok  ] installation acme: {asks}" in r.stdout
    assert f"[ok  ] webhook answers: {web.webhook_url} accepted a signed ping" in r.stdout
    assert "webhook deliveries: the last" in r.stdout and "all succeeded" in r.stdout
    assert github.webhook_secret not in r.stdout + r.stderr
    assert "PRIVATE KEY" not in r.stdout + r.stderr


def test_missing_permission_and_unreachable_webhook_are_named(
    github: GitHubServer, env: dict[str, str], tmp_path: Path
) -> None:
    # The owner of acme accepted an older grant: issues read only, no checks, no check_run.
    granted = dict(WANTED, issues="read")
    del granted["checks"]
    iid = github.add_installation("acme", permissions=granted, events=EVENTS[:-1])
    github.add_repo(
        REPO, {"README.md": "hi\n"}, installation_id=iid, collaborators={"writer": "write"}
    )
    dead = f"http://127.0.0.1:{free_port()}/webhook"  # nothing listens there
    github.webhook_url = dead
    label(github, "writer", open_issue(github))
    delivered(github, 2)  # opened, labeled

    r = doctor(env, tmp_path)

    assert r.returncode == 1, r.stdout
    failed = "\n".join(lines(r.stdout, "FAIL"))
    assert "permission issues (acme): read, loopbot needs write" in failed
    assert "permission checks (acme): none, loopbot needs write" in failed
    assert f"event {EVENTS[-1]} (acme): not delivered to loopbot" in failed
    # The App asks for these; only the owner's acceptance is missing, and the fix says so.
    assert r.stdout.count("must accept") == 3
    assert f"{github.url}/settings/installations/{iid}" in r.stdout
    assert f"webhook answers: {dead}: no answer (ConnectError" in failed
    assert "webhook deliveries: 2 of the last 2 failed" in failed
    assert "issues.labeled: We couldn't deliver this payload" in failed
    assert "not reachable from GitHub" in r.stdout


def test_secret_mismatch_shows_in_gitHubs_deliveries(
    github: GitHubServer, web: Web, env: dict[str, str], tmp_path: Path
) -> None:
    """The web and this environment agree (the ping passes) but the App was given another
    secret: only GitHub's record of deliveries shows it."""
    sample_repo(github)
    github.webhook_secret = "not-the-one-loopbot-has"
    label(github, "writer", open_issue(github))
    delivered(github, 1)

    r = doctor(env, tmp_path)

    assert r.returncode == 1, r.stdout
    assert "[ok  ] webhook answers" in r.stdout
    failed = "\n".join(lines(r.stdout, "FAIL"))
    assert "issues.labeled: Invalid HTTP Response: 401" in failed
    assert "the App's webhook secret is not GITHUB_WEBHOOK_SECRET" in r.stdout


def test_webhook_url_at_the_wrong_path_and_no_installation(
    github: GitHubServer, web: Web, env: dict[str, str], tmp_path: Path
) -> None:
    github.webhook_url = web.url + "/hooks"

    r = doctor(env, tmp_path)

    assert r.returncode == 1
    failed = "\n".join(lines(r.stdout, "FAIL"))
    assert "installations: the App is installed nowhere" in failed
    assert f"webhook url: {web.url}/hooks: loopbot web serves POST /webhook" in failed
    assert "webhook answers" in failed and "HTTP 404" in failed


def test_bad_credentials_fail_clearly(env: dict[str, str], tmp_path: Path) -> None:
    r = doctor(env | {"GITHUB_APP_ID": "999999"}, tmp_path)
    assert r.returncode == 1
    assert lines(r.stdout, "FAIL")[0].startswith("[FAIL] github app:")
    assert "Traceback" not in r.stdout + r.stderr


def test_config_and_github_together_is_a_usage_error(tmp_path: Path) -> None:
    yml = tmp_path / "loop.yml"
    yml.write_text("verify: make test\n")
    r = subprocess.run(
        [LOOPBOT, "doctor", "--github", "--config", str(yml)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "give one" in r.stderr


# -- the pure decisions ---------------------------------------------------------------


APP = {"slug": "loopbot", "owner": {"login": "acme", "type": "Organization"}}


def test_a_permission_the_app_itself_lacks_is_fixed_on_the_app() -> None:
    app = APP | {"permissions": dict(WANTED, contents="read"), "events": EVENTS}
    checks = grant_checks(
        "acme",
        dict(WANTED, contents="read"),
        EVENTS,
        wanted=WANTED,
        wanted_events=EVENTS,
        app=app,
        settings_url="https://github.com/organizations/acme/settings/apps/loopbot",
        accept_url="https://github.com/organizations/acme/settings/installations/1",
    )
    (bad,) = [c for c in checks if not c.ok]
    assert bad.name == "permission contents (acme)"
    assert bad.fix.startswith("give the App contents: write at https://github.com/organizations")


def test_more_than_needed_warns_and_admin_covers_write() -> None:
    granted = dict(WANTED, contents="admin", administration="write")
    (check,) = grant_checks(
        "acme",
        granted,
        [*EVENTS, "push"],
        wanted=WANTED,
        wanted_events=EVENTS,
        app=APP | {"permissions": granted, "events": EVENTS},
        settings_url="s",
        accept_url="a",
    )
    assert check.ok and check.warn
    assert "administration: write" in check.detail and "contents: admin" in check.detail


def test_a_suspended_installation_fails() -> None:
    inst = {"id": 7, "account": {"login": "acme"}, "suspended_at": "2026-11-01T00:00:00Z"}
    (check,) = installation_checks([inst], APP, MANIFEST, "https://github.com")
    assert not check.ok and "suspended since 2026-11-01" in check.detail


def _delivery(i: int, code: int) -> dict[str, Any]:
    return {"guid": f"g{i}", "status_code": code, "event": "issues", "action": "labeled"}


def test_old_failures_followed_by_a_success_only_warn() -> None:
    checks = delivery_checks([_delivery(3, 202), _delivery(2, 503), _delivery(1, 0)], "s")
    assert all(c.ok for c in checks)
    assert checks[0].warn and "2 of the last 3 failed; the newest succeeded" in checks[0].detail
    assert "could not reach Redis" in checks[1].detail
    assert "not reachable from GitHub" in checks[2].detail


def test_only_the_five_newest_failures_are_listed() -> None:
    checks = delivery_checks([_delivery(i, 500) for i in range(9, 0, -1)], "s")
    assert not checks[0].ok and "9 of the last 9 failed" in checks[0].detail
    assert [c.name for c in checks[1:]] == [f"delivery g{i}" for i in (9, 8, 7, 6, 5)]


# -- the stand-in speaks GitHub's shapes ----------------------------------------------


def test_the_local_server_answers_in_githubs_schemas(
    github: GitHubServer, web: Web, env: dict[str, str]
) -> None:
    """What doctor reads is what githubkit's own models accept, newest first, paged by
    cursor as GitHub pages it."""
    sample_repo(github)
    for _ in range(3):
        label(github, "writer", open_issue(github))
    delivered(github, 3)
    from bot.core.settings import load_settings
    from bot.io.github.client import GitHubApp

    gh = GitHubApp(load_settings(env))
    config = TypeAdapter(WebhookConfig).validate_python(gh.hook_config())
    assert config.url == web.webhook_url and config.secret not in (UNSET, github.webhook_secret)
    items = TypeAdapter(list[HookDeliveryItem]).validate_python(gh.recent_deliveries())
    assert [d.guid for d in items] == [d["delivery"] for d in reversed(github.deliveries)]
    first = gh.client.rest.apps.list_webhook_deliveries(per_page=2)
    nxt = httpx.get(
        first.headers["link"].split(";")[0].strip("<>"),
        headers={"Authorization": first.raw_request.headers["Authorization"]},
    ).json()
    assert [d["id"] for d in first.json() + nxt] == [d.id for d in items][:4]
    with pytest.raises(Exception, match="422"):
        gh.client.rest.apps.list_webhook_deliveries(per_page=101)
