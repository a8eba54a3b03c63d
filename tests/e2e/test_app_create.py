"""``loopbot app create``: GitHub's manifest flow against the local GitHub server, in a
real browser, then ``loopbot web`` and ``worker`` run from the ``.env`` it wrote, a loop
to a merge."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dotenv import dotenv_values
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.ops import app_create, manifest
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer, free_port
from tests.conftest import wait_for
from tests.helpers import CHROMIUM_ARGS, REPO, chromium_or_skip, label, open_issue, sample_repo

LOOPBOT = str(Path(sys.executable).parent / "loopbot")
FIX = m.replace("calc.py", "return a - b", "return a + b")
YML = "verify: python3 -m unittest -q\nmax_turns: 3\n"


def base_env(**extra: str) -> dict[str, str]:
    """The process environment without any App setting: those must come from the .env."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "LOOPBOT_"))}
    return keep | {"LOOPBOT_LOG_FORMAT": "console"} | extra


class Flow:
    """``loopbot app create`` running in ``cwd``; ``page`` is its local page."""

    def __init__(self, cwd: Path, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [LOOPBOT, "app", "create", "--no-browser", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)/", first)
        assert found, first + self.proc.stdout.read()
        self.page = found.group(1)
        self.head = first

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, self.head + out


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "deploy"
    d.mkdir()
    yield d


def click_register(page_url: str) -> str:
    """A browser signed in to GitHub: open the local page, press the button, follow
    GitHub's redirect back; the text of the page it ends on."""
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(page_url + "/")
            with page.expect_navigation(url=re.compile(r".*/callback\?.*")):
                page.click("#register")
            return page.inner_text("body")
        finally:
            browser.close()


def test_app_create_writes_an_env_file_that_web_and_worker_run_to_a_merge(
    github: GitHubServer,
    model: AnthropicServer,
    redis_server: RedisServer,
    redis: Redis,
    deploy: Path,
) -> None:
    web_port = free_port()
    site = f"http://127.0.0.1:{web_port}"
    old_app = github.app_id
    flow = Flow(deploy, base_env(GITHUB_API_URL=github.url), "--url", site, "--org", "acme")
    shown = click_register(flow.page)
    code, out = flow.finish()
    assert code == 0, out
    assert "Registered" in shown and "install the App" in shown

    # The stand-in registered a new App from loopbot's manifest, webhook at our URL.
    assert github.app_id != old_app
    assert github.webhook_url == f"{site}/webhook"
    assert github.app_permissions == manifest.load_manifest()["default_permissions"]
    env_file = deploy / ".env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    values = dotenv_values(env_file)
    assert values["GITHUB_APP_ID"] == str(github.app_id)
    assert values["GITHUB_WEBHOOK_SECRET"] == github.webhook_secret
    assert values["GITHUB_PRIVATE_KEY"] == github.private_key_pem
    assert values["GITHUB_API_URL"] == github.url
    # Never printed: neither the key nor the secret is in the command's output.
    assert github.webhook_secret not in out and "PRIVATE KEY" not in out
    assert f"/apps/{github.app_slug}/installations/new" in out

    # The App is installed; web and worker read the credentials from .env alone.
    sample_repo(github, loop_yml=YML)
    model.play(
        FIX,
        m.text("Fixed add."),
        m.structured({"verdict": "approve", "summary": "ok", "findings": []}),
    )
    run_env = base_env(
        REDIS_URL=redis_server.url,
        ANTHROPIC_API_KEY="sk-ant-local-test",
        ANTHROPIC_BASE_URL=model.url,
        LOOPBOT_DATA_DIR=str(deploy / "data"),
        LOOPBOT_MODEL="claude-test",
        LOOPBOT_CRITIC_MODEL="claude-test",
    )
    procs = [
        subprocess.Popen(
            [LOOPBOT, *args],
            cwd=deploy,
            env=run_env,
            stdout=open(deploy / f"{args[0]}.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for args in (["web", "--port", str(web_port), "--workers", "1"], ["worker"])
    ]
    try:
        wait_for(lambda: _healthy(site), 30, "loopbot web to answer")
        n = open_issue(github)
        label(github, "writer", n)
        store = Store(redis)

        def merged() -> bool:
            r = store.get(f"{REPO}#{n}")
            return r is not None and r.status == Status.COMPLETED

        wait_for(merged, 90, "the loop to merge")
        r = store.get(f"{REPO}#{n}")
        assert r is not None and r.reason == "merged", r
        assert "return a + b" in (github.file_at(REPO, "main", "calc.py") or "")
        # Every delivery reached the web and was accepted under the new secret.
        assert github.deliveries and all(d.get("status") in (200, 202) for d in github.deliveries)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _healthy(site: str) -> bool:
    try:
        return httpx.get(site + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_callback_with_another_state_is_refused_and_the_flow_keeps_waiting(
    github: GitHubServer, deploy: Path
) -> None:
    flow = Flow(deploy, base_env(GITHUB_API_URL=github.url), "--url", "https://bot.example.com")
    try:
        # Another site sends the browser to our callback with a code of its choosing.
        r = httpx.get(flow.page + "/callback", params={"code": "attacker", "state": "guess"})
        assert r.status_code == 400
        assert not (deploy / ".env").exists()
        assert flow.proc.poll() is None  # still waiting for GitHub's own answer
        shown = _register_without_a_browser(flow.page)
        assert "Registered" in shown
        code, out = flow.finish()
        assert code == 0, out
        assert dotenv_values(deploy / ".env")["GITHUB_APP_ID"] == str(github.app_id)
    finally:
        flow.proc.kill()


def _register_without_a_browser(page_url: str) -> str:
    """Post the local page's form as a browser would (the quicker path for the tests
    that are not about the browser)."""
    html = httpx.get(page_url + "/").text
    action = re.search(r'<form method="post" action="([^"]+)"', html)
    value = re.search(r'name="manifest" value="([^"]*)"', html)
    assert action and value
    from html import unescape

    r = httpx.post(
        unescape(action.group(1)),
        data={"manifest": unescape(value.group(1))},
        follow_redirects=True,
        timeout=30,
    )
    return r.text


def test_a_used_code_cannot_be_exchanged_again_and_the_env_file_is_left_alone(
    github: GitHubServer, deploy: Path
) -> None:
    env_file = deploy / ".env"
    env_file.write_text("REDIS_URL=redis://example:6379/0\n# kept\n")
    flow = Flow(deploy, base_env(GITHUB_API_URL=github.url), "--url", "https://bot.example.com")
    shown = _register_without_a_browser(flow.page)
    assert "Registered" in shown
    assert flow.finish()[0] == 0
    first = env_file.read_text()
    # The other lines are kept; the file is private.
    assert "REDIS_URL=redis://example:6379/0" in first and "# kept" in first
    assert env_file.stat().st_mode & 0o777 == 0o600
    # The conversion's code was used: a replay gets GitHub's 404.
    codes = [p for (meth, p, _) in github.requests if "/app-manifests/" in p]
    assert len(codes) == 1
    r = httpx.post(github.url + codes[0])
    assert r.status_code == 404

    # A second run refuses to replace the App without --force, and changes nothing.
    again = subprocess.run(
        [LOOPBOT, "app", "create", "--no-browser", "--url", "https://bot.example.com"],
        cwd=deploy,
        env=base_env(GITHUB_API_URL=github.url),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert again.returncode == 1 and "--force" in again.stderr
    assert env_file.read_text() == first


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--url", "http://bot.example.com"], "https"),
        (["--url", "ftp://x"], "expected https://HOST"),
        (["--url", "https://bot.example.com", "--org", "bad/org"], "--org"),
        (["--url", "https://bot.example.com", "--name", "x" * 35], "34 characters"),
    ],
)
def test_bad_options_are_refused_before_anything_is_served(
    deploy: Path, args: list[str], says: str
) -> None:
    r = subprocess.run(
        [LOOPBOT, "app", "create", "--no-browser", *args],
        cwd=deploy,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (deploy / ".env").exists()


@pytest.mark.parametrize(
    ("api", "web"),
    [
        ("https://api.github.com", "https://github.com"),
        ("https://ghe.example.com/api/v3", "https://ghe.example.com"),
        ("https://ghe.example.com/api/v3/", "https://ghe.example.com"),
        ("http://127.0.0.1:8123", "http://127.0.0.1:8123"),
    ],
)
def test_the_web_address_follows_the_api_address(api: str, web: str) -> None:
    assert manifest.web_url(api) == web
    assert manifest.registration_url(web, "acme", "s") == (
        f"{web}/organizations/acme/settings/apps/new?state=s"
    )


def test_env_values_survive_quotes_backslashes_and_newlines(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    tricky = 'a"b\\c\nd$e'
    app_create.write_env_file(path, {"GITHUB_WEBHOOK_SECRET": tricky, "GITHUB_APP_ID": "7"})
    assert dotenv_values(path, interpolate=False)["GITHUB_WEBHOOK_SECRET"] == tricky
    app_create.write_env_file(path, {"GITHUB_APP_ID": "8"})
    assert dotenv_values(path)["GITHUB_APP_ID"] == "8"
    assert path.read_text().count("GITHUB_APP_ID") == 1
