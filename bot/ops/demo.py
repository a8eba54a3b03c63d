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
from pathlib import Path
from typing import Any

import click
from rq import Worker
from werkzeug.serving import make_server

from bot.core.ids import LoopId
from bot.core.record import TERMINAL, Status
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


def _line(start: float, text: str) -> None:
    click.echo(f"  {time.monotonic() - start:5.1f}s  {text}")


def _describe(event: dict[str, Any]) -> str | None:
    template = _SAY.get(event["kind"])
    if template is None:
        return None
    data = {"loop": event["loop"], **event["data"]}
    if event["kind"] == "verify":
        data["result"] = "passed" if data.get("passed") else "failed"
    try:
        return str(template.format(**data))
    except (KeyError, ValueError):
        return str(event["kind"])


def run_demo(keep: bool = False) -> int:
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
            REPO,
            {
                "calc.py": CALC,
                "test_calc.py": TEST,
                ".github/loop.yml": LOOP_YML,
                "README.md": "# calculator\n",
            },
            installation_id=iid,
            collaborators={"maintainer": "write"},
        )
        _line(start, f"created {REPO}: add() subtracts, and its test fails")
        _script(model)
        with github.as_user("maintainer") as u:
            number = u.post(
                f"/repos/{REPO}/issues",
                json={
                    "title": "add() returns the wrong result",
                    "body": "`add(2, 3)` returns -1; it should return 5.",
                },
            ).json()["number"]
            _line(start, f"@maintainer opened issue #{number} and added the label loop:ready")
            u.post(f"/repos/{REPO}/issues/{number}/labels", json={"labels": ["loop:ready"]})
        key = LoopId(REPO, number).key
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
        repo = github.repo(REPO)
        commit = gitrepo.git(repo.path, "log", "-1", "--format=%h %s", "main").strip()
        click.echo("")
        _line(start, f"main is now at {commit}; issue #{number} is {repo.issues[number].state}")
        _line(start, f"the fix on main: {github.file_at(REPO, 'main', 'calc.py')!r}")
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
