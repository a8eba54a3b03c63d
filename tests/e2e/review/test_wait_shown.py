"""A loop waiting for a person says so, in the same words, everywhere a maintainer looks:
the status comment, ``/loop-status``, ``loopbot status`` (the real CLI), the dashboard
(its API, and the list page in a real browser) and the loop's check run on the head; the
check run takes it back once the loop merges."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.core.settings import load_settings
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.github.state import ReviewRule
from bot.standins.serving import run_in_thread
from bot.web.app import create_app
from tests.conftest import Web
from tests.e2e.review.test_merge_rules import (
    merged_within,
    record,
    review,
    start,
    status_comment,
)
from tests.e2e.review.test_review_merge import FIX, report
from tests.e2e.test_control import bot_replies
from tests.helpers import CHROMIUM_ARGS, REPO, chromium_or_skip, comment
from tests.io.test_operator import cli

WAIT = "waiting for 1 approving review by a writer"


def loop_runs(github: GitHubServer, head: str) -> list[dict[str, Any]]:
    return [
        r
        for r in github.repo(REPO).check_runs.values()
        if r["name"] == "loopbot" and r["head_sha"] == head
    ]


def test_the_wait_for_a_person_is_shown_everywhere(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    env: dict[str, str],
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    start(github, drain, ReviewRule(required_approving_review_count=1))
    r = record(redis)
    assert (r.status, r.phase, r.detail) == (Status.MERGING, "awaiting_approval", WAIT), r
    assert WAIT in status_comment(github)

    # /loop-status answers with it.
    comment(github, "writer", r.issue, "/loop-status")
    drain()
    assert any(WAIT in b and "awaiting_approval" in b for b in bot_replies(github))

    # loopbot status, as an operator runs it: under the loop's row, and in --json.
    only = {"REDIS_URL": env["REDIS_URL"]}
    out = cli("status", env=only)
    assert out.returncode == 0, out.stderr
    shown = out.stdout.splitlines()
    row = next(i for i, line in enumerate(shown) if line.startswith(f"{REPO}#1 "))
    assert "awaiting_approval" in shown[row] and shown[row + 1] == f"  ↳ {WAIT}", out.stdout
    (data,) = json.loads(cli("status", "--json", env=only).stdout)
    assert data["waiting_for"] == WAIT

    # The dashboard: its list API, and the list page as a browser renders it.
    s = load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": "s3cret-token"}, role="web")
    app = create_app(s, redis)
    auth = {"Authorization": "Bearer s3cret-token"}
    (listed,) = app.test_client().get("/api/loops", headers=auth).json["loops"]
    assert listed["waiting_for"] == WAIT
    _the_list_page_shows(app, WAIT)

    # The check run on the head: the same words, its conclusion still verify's.
    (run,) = loop_runs(github, r.head_sha)
    assert (run["status"], run["conclusion"]) == ("completed", "success")
    assert run["output"]["title"] == WAIT and WAIT in run["output"]["summary"]

    review(github, "writer", r.pr_number)
    merged_within(github, redis, drain, 10)
    r = record(redis)
    (run,) = loop_runs(github, r.head_sha)
    assert run["output"]["title"] == "completed: merged", run["output"]
    assert WAIT not in run["output"]["summary"] and run["conclusion"] == "success"
    assert r.wait_shown == ""
    out = cli("status", env=only)
    assert WAIT not in out.stdout and "↳" not in out.stdout


def _the_list_page_shows(app: Any, text: str) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    run_in_thread(server)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{server.server_port}/dashboard")
            page.fill("input[name=token]", "s3cret-token")
            page.click("button")
            page.wait_for_selector(f"text={REPO}#1")
            cells = page.inner_text("tbody#rows")
            assert "awaiting_approval" in cells and text in cells, cells
            browser.close()
    finally:
        server.shutdown()


def test_a_loop_cancelled_while_it_waits_takes_the_wait_back(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), report())
    start(github, drain, ReviewRule(required_approving_review_count=1))
    r = record(redis)
    assert (
        r.phase == "awaiting_approval"
        and loop_runs(github, r.head_sha)[0]["output"]["title"] == WAIT
    )
    comment(github, "writer", r.issue, "/loop-cancel")
    drain()
    r = record(redis)
    assert r.status == Status.CANCELLED, r
    (run,) = loop_runs(github, r.head_sha)
    assert run["output"]["title"].startswith("cancelled: "), run["output"]
    assert run["conclusion"] == "cancelled" and r.wait_shown == ""
    # The status comment too: no job of the loop's was running to say it ended.
    top = status_comment(github).split("### loopbot", 1)[1].strip().splitlines()[0]
    assert "**cancelled**" in top and "awaiting_approval" not in top, top
