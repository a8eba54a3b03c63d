"""``loopbot report`` after a mixed run: merged, refused, failed and cancelled loops across two
repositories and two backends, its figures held to what the local model server billed."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from redis import Redis

from bot.core.record import Status
from bot.core.settings import load_settings
from bot.io.store import Store
from bot.ops.cli import main
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.serving import run_in_thread
from bot.web.app import create_app
from jobs.agents.claude_code import cli_path
from tests.conftest import Web, run_control_jobs
from tests.helpers import CALC, CHROMIUM_ARGS, REPO, TEST_CALC, chromium_or_skip, sample_repo

MODEL = "claude-sonnet-4-6"  # a model Claude Code knows
OTHER = "acme/gadgets"
APPROVE = m.structured({"verdict": "approve", "summary": "ok", "findings": []})
VAGUE = m.triage_answer("needs_spec", reasons=("Nothing to check.",), criteria=("a test",))

pytestmark = pytest.mark.skipif(cli_path() is None, reason="Claude Code is not installed")


@pytest.fixture
def env_extra() -> dict[str, str]:
    return {
        "LOOPBOT_AGENT_BACKENDS": "builtin,claude-code",
        "LOOPBOT_MODEL": MODEL,
        "LOOPBOT_CRITIC_MODEL": MODEL,
    }


WIDGETS = "verify: python3 -m unittest -q\nmax_turns: 2\n"  # built-in agent, triage on
GADGETS = (
    "verify: python3 -m unittest -q\nmax_turns: 2\ntriage:\n  enabled: false\n"
    "agent:\n  backend: claude-code\n"
)


def _issue(github: GitHubServer, repo: str, title: str) -> int:
    with github.as_user("writer") as u:
        r = u.post(f"/repos/{repo}/issues", json={"title": title, "body": "add(2, 3) is 5."})
        r.raise_for_status()
        return int(r.json()["number"])


def _label(github: GitHubServer, repo: str, n: int) -> None:
    with github.as_user("writer") as u:
        u.post(f"/repos/{repo}/issues/{n}/labels", json={"labels": ["loop:ready"]})


def _comment(github: GitHubServer, repo: str, n: int, body: str) -> None:
    with github.as_user("writer") as u:
        u.post(f"/repos/{repo}/issues/{n}/comments", json={"body": body}).raise_for_status()


def _status(redis: Redis, repo: str, n: int) -> tuple[Status, str]:
    r = Store(redis).get(f"{repo}#{n}")
    assert r is not None
    return r.status, r.reason


def test_report_matches_the_bill_after_a_mixed_run(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    iid = sample_repo(github, loop_yml=WIDGETS)
    files = {"calc.py": CALC, "test_calc.py": TEST_CALC, ".github/loop.yml": GADGETS}
    github.add_repo(OTHER, files, installation_id=iid, collaborators={"writer": "write"})

    # widgets, the built-in agent: merged (triage, two calls, the critic), then refused by
    # triage, then cancelled before it ran.
    model.play(m.replace("calc.py", "return a - b", "return a + b"), m.text("Fixed."), APPROVE)
    merged = _issue(github, REPO, "add() subtracts")
    _label(github, REPO, merged)
    drain()
    assert _status(redis, REPO, merged) == (Status.COMPLETED, "merged")
    model.play_triage(VAGUE)
    refused = _issue(github, REPO, "make it nicer")
    _label(github, REPO, refused)
    drain()
    assert _status(redis, REPO, refused)[0] is Status.REFUSED
    cancelled = _issue(github, REPO, "later")
    _label(github, REPO, cancelled)
    github.wait_for_webhooks()
    run_control_jobs(redis)  # the loop is created and queued, not run
    _comment(github, REPO, cancelled, "/loop-cancel")
    drain()
    assert _status(redis, REPO, cancelled)[0] is Status.CANCELLED

    # gadgets, Claude Code: merged, then failed (two wrong turns, max_turns 2).
    model.play(m.cc_edit("calc.py", "a - b", "a + b"), m.text("Fixed."), APPROVE)
    good = _issue(github, OTHER, "add() subtracts")
    _label(github, OTHER, good)
    drain()
    assert _status(redis, OTHER, good) == (Status.COMPLETED, "merged")
    # The fix is merged by now: these two turns break add() again, and verify fails.
    model.play(
        m.cc_write("calc.py", CALC),
        m.text("Tried."),
        m.cc_write("calc.py", CALC.replace("a - b", "a * b")),
        m.text("Tried again."),
    )
    bad = _issue(github, OTHER, "add() still subtracts")
    _label(github, OTHER, bad)
    drain()
    assert _status(redis, OTHER, bad) == (Status.FAILED, "max_turns_reached")

    # Per pull request: the merge receipt, in the status comment's last edit, gives the
    # loop's total cost and tokens as the record has them; the body says it as of its
    # writing. A loop that ended unmerged says it on the status comment's last line.
    for repo, n in ((REPO, merged), (OTHER, good)):
        r = Store(redis).get(f"{repo}#{n}")
        assert r is not None and r.pr_number is not None
        total_line = f"Loop total: ${r.cost_usd:.4f}"
        status = next(
            c["body"]
            for c in github.repo(repo).comments.values()
            if c["_issue"] == n and c["body"].startswith("### loopbot")
        )
        assert "merge receipt" in status
        assert f"Merged as `{r.merge_sha}`. {total_line} · " in status
        assert "Loop total: $" in github.repo(repo).issues[r.pr_number].body
    r = Store(redis).get(f"{OTHER}#{bad}")
    assert r is not None
    failed_status = next(
        c["body"]
        for c in github.repo(OTHER).comments.values()
        if c["_issue"] == bad and c["body"].startswith("### loopbot")
    )
    assert f"**Loop total: ${r.cost_usd:.4f} · " in failed_status

    runner = CliRunner()
    env_cli = {"REDIS_URL": env["REDIS_URL"]}
    out = runner.invoke(main, ["report", "--since", "1d", "--format", "json"], env=env_cli)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    total = data["repos"]["(total)"]
    billed = model.billed_usd()
    assert billed > 0
    assert round(total["usd"], 2) == round(billed, 2)  # to the cent
    assert total["usd"] == pytest.approx(billed, abs=1e-5)  # and closer still
    assert (total["loops_started"], total["loops_merged"], total["loops_refused"]) == (5, 2, 1)
    assert (total["loops_failed"], total["loops_cancelled"]) == (1, 1)
    widgets, gadgets = data["repos"][REPO], data["repos"][OTHER]
    assert widgets["usd"] + gadgets["usd"] == pytest.approx(total["usd"], abs=1e-6)
    # By backend and model: Claude Code's calls under its name, the critic's under builtin.
    backends = {(r["backend"], r["model"]) for r in gadgets["by_model"]}
    assert backends == {("claude-code", MODEL), ("builtin", MODEL)}
    assert {r["backend"] for r in widgets["by_model"]} == {"builtin"}
    tokens = sum(total[f"{k}_tokens"] for k in ("input", "output", "cache_read", "cache_write"))
    billed_tokens = sum(
        sum(v for k, v in r["usage"].items() if k.endswith("_tokens") and isinstance(v, int))
        for r in [*model.responses, *model.triage_responses]
    )
    assert tokens == billed_tokens
    # Per merged pull request: two of them; the failed and refused loops' spend unmerged.
    assert total["merged_usd_median"] > 0 and total["merged_turns_median"] >= 1
    assert total["label_to_merge_hours_p90"] is not None
    assert 0 < total["unmerged_share"] < 1
    assert total["critic_rounds"] == 2

    out = runner.invoke(main, ["report", "--format", "csv", "--repo", OTHER], env=env_cli)
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.output)))
    repo_rows = [r for r in rows if r["kind"] == "repo"]
    assert [r["repo"] for r in repo_rows] == [OTHER, "(total)"]
    assert float(repo_rows[0]["usd"]) == pytest.approx(gadgets["usd"], abs=1e-6)
    assert {r["backend"] for r in rows if r["kind"] == "model"} == {"claude-code", "builtin"}

    out = runner.invoke(main, ["report"], env=env_cli)
    assert out.exit_code == 0 and "2 merged" in out.output and "claude-code" in out.output
    bad_since = runner.invoke(main, ["report", "--since", "soon"], env=env_cli)
    assert bad_since.exit_code == 2 and "--since" in bad_since.output

    # Prometheus: counters by repository, backend and model, that add up to the bill.
    metrics = _metrics(env, redis)
    spent = [
        float(v) for v in re.findall(r"^loopbot_spend_usd_total\{[^}]*\} (\S+)$", metrics, re.M)
    ]
    assert sum(spent) == pytest.approx(billed, abs=1e-5)
    assert f'loopbot_spend_usd_total{{backend="claude-code",model="{MODEL}",repo="{OTHER}"}}' in (
        metrics
    )
    assert 'kind="cache_read"' in metrics or 'kind="input"' in metrics

    # The dashboard's spend page, in a real browser: the chart and the figures.
    _dashboard(env, redis, Path(os.environ.get("LOOPBOT_SCREENSHOT_DIR", tmp_path)))


def _metrics(env: dict[str, str], redis: Redis) -> str:
    app = create_app(load_settings(env, role="web"), redis)
    return app.test_client().get("/metrics").get_data(as_text=True)


def _dashboard(env: dict[str, str], redis: Redis, shots: Path) -> None:
    chromium = chromium_or_skip()
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    s = load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": "s3cret-token"}, role="web")
    server = make_server("127.0.0.1", 0, create_app(s, redis), threaded=True)
    run_in_thread(server)
    base = f"http://127.0.0.1:{server.server_port}"
    shots.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"{base}/dashboard/login")
            page.fill("input[name=token]", "s3cret-token")
            page.click("button")
            page.click("text=spend")
            page.wait_for_selector("#spend-chart")
            bars = page.locator("#spend-chart rect title").all_text_contents()
            assert any(t.startswith(REPO) for t in bars), bars
            assert any(t.startswith(OTHER) for t in bars), bars
            figures = page.inner_text("#figures")
            assert REPO in figures and OTHER in figures and "(total)" in figures
            assert "claude-code" in page.inner_text("#models")
            page.screenshot(path=str(shots / "spend.png"), full_page=True)
            browser.close()
    finally:
        server.shutdown()
    assert (shots / "spend.png").stat().st_size > 5000
