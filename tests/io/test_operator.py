"""The operator's side: demo, doctor, CLI, metrics, dashboard (API and a real browser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.core.record import LoopRecord, Status, Usage
from bot.core.settings import Settings, load_settings
from bot.io.store import Store
from bot.standins.serving import run_in_thread
from bot.web.app import create_app
from tests.helpers import CHROMIUM_ARGS, chromium_or_skip

LOOPBOT = str(Path(sys.executable).parent / "loopbot")


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [LOOPBOT, *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def seed_loops(redis: Redis) -> None:
    store = Store(redis)
    r = LoopRecord(
        repo="acme/widgets",
        issue=1,
        installation_id=1,
        status=Status.RUNNING,
        phase="coding",
        turn=2,
        cost_usd=0.25,
        branch="loop/issue-1",
    )
    r.record_usage(
        "claude-test", "agent", Usage(input_tokens=100, output_tokens=10, messages=1, cost_usd=0.25)
    )
    store.put(r)
    store.put(
        LoopRecord(
            repo="acme/widgets",
            issue=2,
            installation_id=1,
            status=Status.COMPLETED,
            phase="completed",
            reason="merged",
            pr_number=3,
            pr_url="http://x/pull/3",
            turn=1,
        )
    )
    store.event("acme/widgets#1", "turn_started", turn=2)
    store.event("acme/widgets#1", "verify", turn=1, passed=False, exit_code=1, seconds=0.2)


def test_demo_runs_the_whole_story(tmp_path: Path) -> None:
    started = time.monotonic()
    out = cli("demo", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert time.monotonic() - started < 60
    text = out.stdout
    for step in [
        "turn 1: verify failed",
        "turn 2: verify passed",
        "pull request #2 opened",
        "critic verdict: approve",
        "squash-merged as",
        "loop completed: merged",
        "issue #1 is closed",
        "local stand-ins",
        "/dashboard (sign in with ",
    ]:
        assert step in text, (step, text)


def test_doctor_with_nothing_configured_fails_one_line_each(tmp_path: Path) -> None:
    out = cli("doctor", env={"HOME": str(tmp_path)})
    assert out.returncode == 1
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[FAIL]")]
    for name in [
        "GITHUB_APP_ID",
        "GITHUB_WEBHOOK_SECRET",
        "GITHUB_PRIVATE_KEY",
        "ANTHROPIC_API_KEY",
    ]:
        assert sum(f"setting {name}" in ln for ln in lines) == 1, out.stdout
    assert "passed," in out.stdout and "failed" in out.stdout


def test_doctor_passes_against_the_local_servers(env: dict[str, str], github: Any) -> None:
    github.add_installation("acme")
    out = cli("doctor", env=env)
    assert out.returncode == 0, out.stdout
    assert "authenticated as 'loopbot-test'" in out.stdout and "1 installation(s)" in out.stdout
    assert "0 failed" in out.stdout
    assert "append-only file on" in out.stdout  # the test Redis persists (see conftest)


def test_doctor_judges_redis_persistence() -> None:
    from bot.ops.doctor import redis_persistence

    assert redis_persistence("r", True, "").ok
    snapshots = redis_persistence("r", False, "3600 1")
    assert snapshots.ok and "appendonly yes is safer" in snapshots.detail
    nothing = redis_persistence("r", False, "")
    assert not nothing.ok and "--appendonly yes" in nothing.line()


def test_doctor_reports_a_dead_redis(env: dict[str, str]) -> None:
    out = cli("doctor", env={**env, "REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 1
    assert "[FAIL] redis" in out.stdout


def test_status_events_and_cancel(env: dict[str, str], redis: Redis) -> None:
    seed_loops(redis)
    out = cli("status", env={"REDIS_URL": env["REDIS_URL"]})
    assert out.returncode == 0, out.stderr
    assert "acme/widgets#1" in out.stdout and "running" in out.stdout and "$0.25" in out.stdout
    assert "#3" in out.stdout
    data = json.loads(cli("status", "--json", env={"REDIS_URL": env["REDIS_URL"]}).stdout)
    assert {d["issue"] for d in data} == {1, 2}
    ev = cli("events", "acme/widgets#1", env={"REDIS_URL": env["REDIS_URL"]})
    assert "turn_started" in ev.stdout and "verify" in ev.stdout
    bad = cli("cancel", "widgets-1", env={"REDIS_URL": env["REDIS_URL"]})
    assert bad.returncode == 2 and "OWNER/REPO#NUMBER" in bad.stderr
    ok = cli("cancel", "acme/widgets#1", env={"REDIS_URL": env["REDIS_URL"]})
    assert ok.returncode == 0 and "cancelled" in ok.stdout
    assert Store(redis).get("acme/widgets#1").status == Status.CANCELLED  # type: ignore[union-attr]
    again = cli("cancel", "acme/widgets#2", env={"REDIS_URL": env["REDIS_URL"]})
    assert "already completed" in again.stdout


def test_status_pages_and_filters(env: dict[str, str], redis: Redis) -> None:
    seed_loops(redis)
    only = {"REDIS_URL": env["REDIS_URL"]}
    out = cli("status", "--limit", "1", env=only)
    assert out.returncode == 0, out.stderr
    assert "acme/widgets#2" in out.stdout and "acme/widgets#1" not in out.stdout  # newest
    assert "(1 older not shown" in out.stdout
    done = cli("status", "--status", "completed", "--json", env=only)
    assert [d["key"] for d in json.loads(done.stdout)] == ["acme/widgets#2"]
    bad = cli("status", "--status", "finished", env=only)
    assert bad.returncode == 2 and "'finished' is not one of" in bad.stderr


def test_status_with_redis_down_is_a_clear_error() -> None:
    out = cli("status", env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 1 and "cannot read Redis" in out.stderr


def test_metrics(settings: Settings, redis: Redis) -> None:
    seed_loops(redis)
    for _ in range(3):
        Store(redis).count("turns")  # as three turn starts do
    client = create_app(settings, redis).test_client()
    text = client.get("/metrics").get_data(as_text=True)
    assert 'loopbot_loops{status="running"} 1.0' in text
    assert 'loopbot_loops{status="completed"} 1.0' in text
    assert "loopbot_turns_total 3.0" in text
    assert "loopbot_cost_usd_total 0.25" in text
    assert 'loopbot_tokens_total{kind="input",model="claude-test",role="agent"} 100.0' in text
    assert 'loopbot_queue_depth{queue="loopbot-loops"} 0.0' in text
    assert "loopbot_webhook_seconds_bucket" in text
    from bot.io.metrics import observe_job

    observe_job(redis, "loop", 42.0)
    text = client.get("/metrics").get_data(as_text=True)
    assert 'loopbot_job_duration_seconds_bucket{job="loop",le="60.0"} 1.0' in text


def test_dashboard_is_off_without_a_token(settings: Settings, redis: Redis) -> None:
    client = create_app(settings, redis).test_client()
    assert client.get("/dashboard").status_code == 404
    assert client.get("/api/loops").status_code == 404


@pytest.fixture
def dash(env: dict[str, str], redis: Redis) -> Any:
    s = load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": "s3cret-token"}, role="web")
    return create_app(s, redis).test_client()


def test_dashboard_needs_the_token(dash: Any, redis: Redis) -> None:
    seed_loops(redis)
    assert dash.get("/dashboard").status_code == 401
    assert dash.get("/api/loops").status_code == 401
    assert dash.get("/api/loops", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert dash.get("/dashboard/loops/acme/widgets/1").status_code == 401
    ok = dash.get("/api/loops", headers={"Authorization": "Bearer s3cret-token"})
    assert ok.status_code == 200 and {d["issue"] for d in ok.json["loops"]} == {1, 2}
    one = dash.get("/api/loops/acme/widgets/1", headers={"Authorization": "Bearer s3cret-token"})
    assert one.json["verify"][0]["exit_code"] == 1 and one.json["loop"]["turn"] == 2
    assert dash.post("/dashboard/login", data={"token": "nope"}).status_code == 401
    login = dash.post("/dashboard/login", data={"token": "s3cret-token"})
    assert login.status_code == 303 and "HttpOnly" in login.headers["Set-Cookie"]
    assert dash.get("/dashboard").status_code == 200  # the cookie now


def test_dashboard_pages_newest_first(dash: Any, redis: Redis) -> None:
    store = Store(redis)
    for n in range(1, 121):
        status = Status.COMPLETED if n % 3 == 0 else Status.FAILED
        store.put(
            LoopRecord(
                repo="acme/many", issue=n, installation_id=1, status=status, updated_at=1000 + n
            ),
            touch=False,
        )
    auth = {"Authorization": "Bearer s3cret-token"}
    first = dash.get("/api/loops", headers=auth).json
    assert first["total"] == 120 and len(first["loops"]) == 50
    assert [d["issue"] for d in first["loops"][:3]] == [120, 119, 118]
    last = dash.get("/api/loops?limit=50&offset=100", headers=auth).json
    assert [d["issue"] for d in last["loops"]] == list(range(20, 0, -1))
    done = dash.get("/api/loops?status=completed&limit=5", headers=auth).json
    assert done["total"] == 40 and [d["issue"] for d in done["loops"]] == [120, 117, 114, 111, 108]
    assert all(set(d) == set(first["loops"][0]) for d in done["loops"])
    for query, word in [
        ("limit=0", "limit must be between 1 and 500"),
        ("limit=ten", "limit must be a whole number"),
        ("offset=-1", "offset must be between"),
        ("status=finished", "status must be one of"),
    ]:
        resp = dash.get(f"/api/loops?{query}", headers=auth)
        assert resp.status_code == 400 and word in resp.json["error"], (query, resp.json)


def test_records_written_before_the_index_are_listed(redis: Redis) -> None:
    # A record as an older loopbot stored it: no summary, no place in the recent index.
    old = LoopRecord(repo="acme/old", issue=7, installation_id=1, status=Status.FAILED, turn=4)
    redis.set(f"loopbot:loop:{old.key}", old.model_dump_json())
    redis.sadd("loopbot:loops", old.key)
    store = Store(redis)
    rows, total = store.recent(10)
    assert total == 1 and rows[0]["key"] == "acme/old#7" and rows[0]["turn"] == 4
    # A later write replaces the backfilled summary.
    store.set_fields(old.key, status=Status.CANCELLED)
    assert [s["status"] for s in store.summaries()] == ["cancelled"]


def test_dashboard_in_a_real_browser(
    env: dict[str, str], redis: Redis, github: Any, tmp_path: Path
) -> None:
    chromium = chromium_or_skip()

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    seed_loops(redis)
    s = load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": "s3cret-token"}, role="web")
    server = make_server("127.0.0.1", 0, create_app(s, redis), threaded=True)
    run_in_thread(server)
    base = f"http://127.0.0.1:{server.server_port}"
    # LOOPBOT_SCREENSHOT_DIR=docs/screenshots refreshes the pictures in docs/operating.md.
    shots = Path(os.environ.get("LOOPBOT_SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium,
                args=CHROMIUM_ARGS,
            )
            page = browser.new_page(viewport={"width": 1100, "height": 520})
            resp = page.goto(f"{base}/dashboard")
            assert resp is not None and resp.status == 401
            page.fill("input[name=token]", "s3cret-token")
            page.click("button")
            page.wait_for_selector("text=acme/widgets#1")
            assert page.locator("tbody#rows tr").count() == 2
            assert "running" in page.inner_text("tbody#rows")
            assert page.inner_text("#range") == "1\u20132 of 2"
            page.screenshot(path=str(shots / "dashboard.png"))
            page.select_option("#status", "completed")
            page.wait_for_function("document.querySelectorAll('tbody#rows tr').length === 1")
            assert "acme/widgets#2" in page.inner_text("tbody#rows")
            page.select_option("#status", "")
            page.wait_for_function("document.querySelectorAll('tbody#rows tr').length === 2")
            page.click("text=acme/widgets#1")
            page.wait_for_selector("text=turn_started")
            assert "failed" in page.inner_text("tbody#verify")
            page.screenshot(path=str(shots / "loop.png"), full_page=True)
            browser.close()
    finally:
        server.shutdown()
    assert (shots / "dashboard.png").stat().st_size > 5000
