"""``loopbot demo``: the whole story on one machine, with no GitHub App and no API key.

Everything that runs is the real loopbot — the web app, a ``loopbot worker`` process,
Redis, git, the sandbox. Only GitHub and the model are local stand-ins (the same test
servers the test suite uses), and the model's answers are scripted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rq import Worker
from werkzeug.serving import make_server

from bot.core.ids import LoopId
from bot.core.record import TERMINAL, LoopRecord, Status
from bot.core.rules.loop import metric as metric_rules
from bot.core.settings import load_settings
from bot.io.logs import configure
from bot.io.redis import connect
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer, free_port
from bot.web.app import create_app

REPO = "demo/calculator"
LOOP_YML = "verify: python3 -m unittest -q\nmax_turns: 5\n"
CALC = "def add(a, b):\n    return a - b\n"
TEST = (
    "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
DEADLINE = 55.0

_SAY = {
    "loop_created": "loop created for {loop} by @{actor}",
    "loop_started": "worker picked up the loop",
    "worktree_ready": "worktree ready (bare mirror + git worktree)",
    "turn_started": "turn {turn}: the agent works",
    "pushed": "turn {turn}: harness committed and pushed {sha:.10}",
    "verify": "turn {turn}: verify {result} in the sandbox ({seconds}s)",
    "pr_opened": "pull request #{pr} opened",
    "review_started": "critic reviews {sha:.10} (round {round})",
    "reviewed": "critic verdict: {verdict} (sev1 {sev1}, sev2 {sev2}, sev3 {sev3}, "
    "inline {inline})",
    "gate": "merge gate: {decision}",
    "merged": "squash-merged as {sha:.10}",
    "loop_finished": "loop {status}: {reason}",
    # The metric story (loop:optimize)
    "metric_baseline": "phase 0 on the base: metric {value:g}, guard passes, scope matches",
    "metric_iteration": "iteration {iteration}: {status} ({why})",
    "metric_finished": "metric loop over ({why}): {kept} kept of {iterations}; "
    "loop-results.tsv committed",
}


def _script(model: AnthropicServer) -> None:
    # Turn 1 misses the bug (verify fails); turn 2 fixes it; the critic approves.
    model.play(
        m.tool(
            "str_replace_based_edit_tool",
            {"command": "view", "path": "calc.py"},
            say="Let me read calc.py.",
        ),
        m.replace("calc.py", "def add(a, b):\n", 'def add(a, b):\n    """Add two numbers."""\n'),
        m.text("Documented add()."),
        m.bash("python3 -m unittest -q 2>&1 | tail -5", say="The test still fails; checking."),
        m.replace("calc.py", "return a - b", "return a + b"),
        m.text("Fixed add(): it subtracted instead of adding."),
    )
    model.responder = lambda body: m.structured(
        {
            "verdict": "approve",
            "summary": "The fix is correct and minimal; the test covers it.",
            "findings": [
                {
                    "severity": "sev3",
                    "category": "tests",
                    "path": "calc.py",
                    "line": 3,
                    "title": "Consider a test with negative numbers",
                    "body": "add(-1, -1) would document the behaviour for negatives.",
                }
            ],
        }
    )


# -- the metric story: shrink src/report.py (lower is better), guarded by its tests ---------------

METRIC_REPO = "demo/report"
METRIC_YML = """\
verify: python3 -m unittest -q
metric:
  command: python3 metric.py
  direction: lower
  scope: ['src/**']
  max_iterations: 3
"""
REPORT = (
    "def total(values):\n    result = 0\n    for v in values:\n        result += v\n"
    "    return result\n\n\ndef unused_helper(x):\n    # nothing calls this any more\n"
    "    return x * 2\n"
)
SHORTER = REPORT.split("\n\n\n")[0] + "\n"  # without the unused helper
LINES = (
    "print('non-blank lines in src/report.py:',\n"
    "      sum(1 for s in open('src/report.py') if s.strip()))\n"
)
REPORT_TEST = (
    "import unittest\n\nfrom src.report import total\n\n\nclass TotalTest(unittest.TestCase):\n"
    "    def test_total(self):\n        self.assertEqual(total([1, 2, 3]), 6)\n"
)


def _metric_script(model: AnthropicServer) -> None:
    # One change kept (a dead function removed), one discarded as worse (a docstring adds a
    # line), one discarded by the guard (shorter, but wrong); the critic approves.
    model.play(
        m.write_file("src/report.py", SHORTER),
        m.text("Remove the unused helper"),
        m.replace("src/report.py", "def total(values):\n", 'def total(values):\n    """Sum."""\n'),
        m.text("Document total()"),
        m.write_file("src/report.py", "def total(values):\n    return 0\n"),
        m.text("Collapse total() to one line"),
    )
    model.responder = lambda body: m.structured(
        {"verdict": "approve", "summary": "The kept change removes dead code.", "findings": []}
    )


@dataclass(frozen=True)
class Story:
    repo: str
    files: dict[str, str]
    created: str  # what the story says of the repository
    title: str
    body: str
    label: str
    script: Callable[[AnthropicServer], None]
    finale: Callable[[GitHubServer, LoopRecord, float], None]


def _fix_finale(github: GitHubServer, record: LoopRecord, start: float) -> None:
    repo = github.repo(REPO)
    commit = gitrepo.git(repo.path, "log", "-1", "--format=%h %s", "main").strip()
    click.echo("")
    _line(
        start,
        f"main is now at {commit}; issue #{record.issue} is {repo.issues[record.issue].state}",
    )
    _line(start, f"the fix on main: {github.file_at(REPO, 'main', 'calc.py')!r}")


def _metric_finale(github: GitHubServer, record: LoopRecord, start: float) -> None:
    rows = metric_rules.rows_of(record.metric_results)
    rep = metric_rules.report(rows, "lower")
    click.echo("")
    _line(
        start,
        f"non-blank lines of src/report.py: {metric_rules.fmt(rep.baseline)} -> "
        f"{metric_rules.fmt(rep.best)}; {rep.kept} kept, {rep.discarded} discarded",
    )
    click.echo("\n  loop-results.tsv, as merged into main:\n")
    tsv = github.file_at(METRIC_REPO, "main", metric_rules.TSV_NAME) or ""
    for row in tsv.splitlines():
        cells = row.split("\t")
        click.echo(
            "    " + "  ".join(c.ljust(w) for c, w in zip(cells, (9, 10, 6, 6, 8, 0), strict=False))
        )


STORIES = {
    "fix": Story(
        REPO,
        {
            "calc.py": CALC,
            "test_calc.py": TEST,
            ".github/loop.yml": LOOP_YML,
            "README.md": "# calculator\n",
        },
        "add() subtracts, and its test fails",
        "add() returns the wrong result",
        "`add(2, 3)` returns -1; it should return 5.",
        "loop:ready",
        _script,
        _fix_finale,
    ),
    "metric": Story(
        METRIC_REPO,
        {
            "src/report.py": REPORT,
            "test_report.py": REPORT_TEST,
            "metric.py": LINES,
            ".github/loop.yml": METRIC_YML,
            "README.md": "# report\n",
        },
        "src/report.py carries dead code; the metric counts its lines (lower is better)",
        "Shrink src/report.py",
        "Fewer lines in src/report.py, with its test still passing.",
        "loop:optimize",
        _metric_script,
        _metric_finale,
    ),
}


def _line(start: float, text: str) -> None:
    click.echo(f"  {time.monotonic() - start:5.1f}s  {text}")


def _describe(event: dict[str, Any]) -> str | None:
    template = _SAY.get(event["kind"])
    if template is None:
        return None
    data = {"loop": event["loop"], **event["data"]}
    if event["kind"] == "verify":
        data["result"] = "passed" if data.get("passed") else "failed"
    if event["kind"] == "metric_iteration":
        shown = f"metric {metric_rules.fmt(data.get('metric'))}"
        data["why"] = shown + (f", {data['reason']}" if data.get("reason") else "")
    try:
        return str(template.format(**data))
    except (KeyError, ValueError):
        return str(event["kind"])


def run_demo(keep: bool = False, story: str = "fix") -> int:
    tale = STORIES[story]
    if shutil.which("bwrap") is None:
        click.echo("loopbot demo: bubblewrap is missing (run ./scripts/setup first)", err=True)
        return 2
    start = time.monotonic()
    configure("console", level=logging.WARNING)  # the story below is the demo's output
    root = Path(tempfile.mkdtemp(prefix="loopbot-demo-"))
    click.echo(
        "loopbot demo — everything runs for real on this machine, except that GitHub\n"
        "and the model are local stand-ins: a local GitHub API backed by real git\n"
        "repositories, and a model server that plays scripted answers.\n"
    )
    redis_srv = RedisServer().start()  # a private one: the demo never touches your Redis
    github = GitHubServer(root / "github").start()
    model = AnthropicServer().start()
    worker: subprocess.Popen[bytes] | None = None
    server = None
    try:
        token = secrets.token_urlsafe(16)
        env = {
            "REDIS_URL": redis_srv.url,
            "GITHUB_APP_ID": str(github.app_id),
            "GITHUB_PRIVATE_KEY": github.private_key_pem,
            "GITHUB_WEBHOOK_SECRET": github.webhook_secret,
            "GITHUB_API_URL": github.url,
            "ANTHROPIC_API_KEY": "sk-ant-demo-local",
            "ANTHROPIC_BASE_URL": model.url,
            "LOOPBOT_DATA_DIR": str(root / "data"),
            "LOOPBOT_MODEL": "claude-sonnet-4-6",
            "LOOPBOT_DASHBOARD_TOKEN": token,
            "LOOPBOT_LOG_FORMAT": "json",
            # The local GitHub has no secondary limit to keep writes under.
            "LOOPBOT_GITHUB_WRITE_GAP": "0",
        }
        settings = load_settings(env, role="worker")
        redis = connect(redis_srv.url)
        port = free_port()
        server = make_server("127.0.0.1", port, create_app(settings, redis), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        github.webhook_url = f"http://127.0.0.1:{port}/webhook"
        _line(
            start,
            f"redis-server, local GitHub ({github.url}), local model ({model.url}) "
            f"and the web app (:{port}) are up",
        )
        log = open(root / "worker.log", "wb")  # noqa: SIM115 - closed with the process
        worker = subprocess.Popen(
            [sys.executable, "-m", "bot.ops.cli", "worker"],
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # Wait for the worker to register, so the times below are loopbot's, not Python's
        # start-up.
        while not Worker.all(connection=redis) and worker.poll() is None:
            if time.monotonic() - start > DEADLINE:
                break
            time.sleep(0.05)
        _line(start, "`loopbot worker` is up (a forking RQ worker)")

        iid = github.add_installation("demo")
        github.add_repo(
            tale.repo,
            tale.files,
            installation_id=iid,
            collaborators={"maintainer": "write"},
        )
        _line(start, f"created {tale.repo}: {tale.created}")
        tale.script(model)
        with github.as_user("maintainer") as u:
            number = u.post(
                f"/repos/{tale.repo}/issues",
                json={"title": tale.title, "body": tale.body},
            ).json()["number"]
            _line(start, f"@maintainer opened issue #{number} and added the label {tale.label}")
            u.post(f"/repos/{tale.repo}/issues/{number}/labels", json={"labels": [tale.label]})
        key = LoopId(tale.repo, number).key
        store = Store(redis)
        last = "0"
        record = None
        finished = False
        settled_at: float | None = None
        while time.monotonic() - start < DEADLINE:
            for event in store.follow(key, last, block_ms=200):
                last = event["id"]
                finished = finished or event["kind"] == "loop_finished"
                text = _describe(event)
                if text:
                    _line(start, text)
            record = store.get(key)
            if record is not None and record.status in TERMINAL:
                # The record turns terminal a moment before its closing event is written;
                # wait (briefly) for that event so the story ends with it.
                settled_at = settled_at or time.monotonic()
                if finished or time.monotonic() - settled_at > 5:
                    break
            if worker.poll() is not None:
                click.echo((root / "worker.log").read_text(errors="replace")[-3000:], err=True)
                click.echo("loopbot demo: the worker exited", err=True)
                return 1
        for event in store.events(key, after=last):  # what came after the last read
            text = _describe(event)
            if text:
                _line(start, text)
        if record is None or record.status != Status.COMPLETED:
            click.echo(
                f"loopbot demo: the loop did not complete in {DEADLINE:.0f}s "
                f"({record.status.value if record else 'no loop'})",
                err=True,
            )
            return 1
        tale.finale(github, record, start)
        click.echo(f"\n  dashboard: http://127.0.0.1:{port}/dashboard (sign in with {token})")
        click.echo(
            f"  cost of the scripted model: ${record.cost_usd:.4f} "
            f"({sum(u.messages for u in record.usage.values())} model calls)"
        )
        if keep:
            click.echo("\n  --keep: the demo stays up; press Ctrl-C to stop it.")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
        click.echo(f"\nloopbot demo: done in {time.monotonic() - start:.1f}s; cleaned up.")
        return 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(10)
            except subprocess.TimeoutExpired:
                worker.kill()
        if server is not None:
            server.shutdown()
        github.stop()
        model.stop()
        redis_srv.stop()
        shutil.rmtree(root, ignore_errors=True)
