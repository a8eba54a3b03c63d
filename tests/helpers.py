"""Small helpers shared by the end-to-end tests (not fixtures: plain functions)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from bot.core.rules.pull.merge import Facts, classify_checks
from bot.core.settings import Settings, load_settings
from bot.io.queues import CONTROL_QUEUE, LOOP_QUEUE
from bot.standins import anthropic as m
from bot.standins.github import GitHubServer
from bot.standins.redis_server import free_port

# The repository's root, and the test data: wherever a test file sits under tests/.
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

REPO = "acme/widgets"

LOOP_YML = """\
verify: python -m unittest -q
max_turns: 3
"""

CALC = """\
def add(a, b):
    return a - b
"""

TEST_CALC = """\
import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
"""


def sample_repo(
    github: GitHubServer,
    *,
    loop_yml: str | None = LOOP_YML,
    extra: dict[str, str] | None = None,
    permissions: dict[str, str] | None = None,
) -> int:
    """A repository with a failing test, installed for the App; returns the installation id.
    ``permissions``: what the installation was granted, when not the App's own."""
    iid = github.add_installation("acme", permissions=permissions)
    files = {"calc.py": CALC, "test_calc.py": TEST_CALC, "README.md": "# widgets\n"}
    if loop_yml is not None:
        files[".github/loop.yml"] = loop_yml
    files.update(extra or {})
    github.add_repo(
        REPO, files, installation_id=iid, collaborators={"writer": "write", "reader": "read"}
    )
    return iid


def open_issue(
    github: GitHubServer,
    title: str = "add() subtracts",
    body: str = "add(2, 3) should be 5. Fix calc.add.",
) -> int:
    with github.as_user("writer") as u:
        r = u.post(f"/repos/{REPO}/issues", json={"title": title, "body": body})
        r.raise_for_status()
        return int(r.json()["number"])


def label(github: GitHubServer, user: str, number: int, name: str = "loop:ready") -> None:
    with github.as_user(user) as u:
        u.post(f"/repos/{REPO}/issues/{number}/labels", json={"labels": [name]}).raise_for_status()


def comment(github: GitHubServer, user: str, number: int, body: str) -> int:
    with github.as_user(user) as u:
        r = u.post(f"/repos/{REPO}/issues/{number}/comments", json={"body": body})
        r.raise_for_status()
        return int(r.json()["id"])


def queued(redis: Redis, queue: str = LOOP_QUEUE) -> int:
    return int(redis.llen(f"rq:queue:{queue}"))


def control_queued(redis: Redis) -> int:
    return queued(redis, CONTROL_QUEUE)


def worker_settings(tmp_path: Path) -> Settings:
    """Worker settings for sandbox tests: an App key file and a data directory under
    ``tmp_path``, no Redis, GitHub or model needed."""
    key = tmp_path / "app-key.pem"
    key.write_text(
        "-----BEGIN RSA PRIVATE KEY-----\nsecret-key-material\n-----END RSA PRIVATE KEY-----\n"
    )
    env = {
        "GITHUB_APP_ID": "1",
        "GITHUB_PRIVATE_KEY_PATH": str(key),
        "GITHUB_WEBHOOK_SECRET": "whsec",
        "LOOPBOT_DATA_DIR": str(tmp_path / "data"),
        "ANTHROPIC_API_KEY": "sk-secret",
    }
    (tmp_path / "data").mkdir(exist_ok=True)
    return load_settings(env, role="worker")


def content_text(message: dict[str, Any]) -> str:
    """A request message's text, whether its content is a string or a list of blocks."""
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


# -- the merge gate's input ------------------------------------------------------------------

HEAD = "b" * 40  # the pull request's head in ``merge_facts``
BASE = "d" * 40  # the default branch's tip, contained in that head


def merge_facts() -> Facts:
    """Every fact the merge gate reads, each one as the gate needs it to merge ``HEAD``:
    open issue and pull request, the head reviewed, approved and verified, the one
    required check (``ci/test``) green, within scope, current with the base, mergeable.

    Tests change one fact with ``dataclasses.replace`` and see what the gate does.
    """
    return Facts(
        issue_open=True,
        pr_open=True,
        pr_merged=False,
        head_sha=HEAD,
        reviewed_sha=HEAD,
        open_sev1=0,
        checks="success",
        failing_checks=(),
        mergeable=True,
        require_checks=True,
        fix_turns_used=0,
        max_fix_turns=2,
        waited_seconds=0,
        max_wait_seconds=3600,
        # The evidence fields default to "not established" (a refusal): all set here.
        verify_sha=HEAD,
        verify_passed=True,
        verdict="approve",
        base_included=True,
        base_sha=BASE,
        changed_lines=40,
        changed_files=3,
        check_results=classify_checks(
            [("ci/test", "completed", "success")], [], frozenset({"ci/test"})
        ),
    )


# Debian's chromium, driven by Playwright (no browser download): the dashboard tests.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_or_skip() -> str:
    """The chromium binary. CI must have it (fail); a developer without it is told how
    to get it (skip)."""
    import importlib.util
    import os
    import shutil

    import pytest

    chromium = shutil.which("chromium")
    if chromium is None or importlib.util.find_spec("playwright") is None:
        if os.environ.get("CI"):
            pytest.fail("chromium or playwright is missing: ./scripts/setup --dev")
        pytest.skip("chromium or playwright is missing (./scripts/setup --dev)")
    return chromium


# -- backend CLIs in the sandbox (tests/e2e/agents/test_claude_code.py, test_opencode.py) ---------


def cli_pids(root: int, marker: str) -> set[int]:
    """The processes under process ``root`` (a worker, this test's process) whose command
    line holds ``marker`` (a CLI's path inside the sandbox): other tests may run their
    own at the same time (pytest -n 4)."""
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.add(pid)
        todo += [int(c) for c in children]
    return found


def billed(model: str, calls: int, input_tokens: int, output_tokens: int) -> float:
    """What ``calls`` model calls of these sizes cost, as the price table says."""
    from bot.core.pricing import usage_from

    class Used:
        cache_creation_input_tokens = cache_read_input_tokens = 0

    used = Used()
    used.input_tokens, used.output_tokens = input_tokens, output_tokens  # type: ignore[attr-defined]
    return calls * usage_from(model, used).cost_usd


def reply_between_turns(body: dict[str, Any]) -> m.Item | None:
    """The model's answer a scripted loop gives the same way every time: the critic
    approves (a structured request), and after a tool's result the agent says it is done.
    None: a turn's first call, which the test scripts."""
    if (body.get("output_config") or {}).get("format"):
        return m.structured({"verdict": "approve", "summary": "Fine.", "findings": []})
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
        return m.text("Fixed add.")
    return None


def started_loop(
    github: GitHubServer, redis: Redis, env: dict[str, str], yml: str, **extra: str
) -> int:
    """The sample repository with ``yml``, an issue a writer labelled, and its loop
    enqueued directly (webhooks off, so the test runs the job itself); ``extra``: more
    worker settings. Installs the worker's runtime; returns the issue's number."""
    from bot.core import repo_config
    from jobs import runtime as runtime_mod
    from jobs.dispatch import start_loop
    from jobs.runtime import Runtime

    settings = load_settings({**env, **extra}, role="worker")
    rt = runtime_mod.install(Runtime(settings, redis))
    iid = sample_repo(github, loop_yml=yml)
    github.webhooks_enabled = False
    n = open_issue(github)
    label(github, "writer", n)
    start_loop(rt, REPO, n, iid, "writer", repo_config.parse(yml))
    return n


# -- the web process (tests/io/test_slow_clients.py, test_web_startup.py) -----------------

VENV_BIN = Path(sys.executable).parent


def procfile_command(name: str) -> str:
    """The Procfile's ``name`` line as written (``$PORT`` and all), for ``sh -c``."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        key, sep, command = line.partition(":")
        if sep and key.strip() == name:
            return command.strip()
    raise AssertionError(f"the Procfile has no {name} line")


def web_process(how: str, port: int, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and environment that serve the web on ``port``: the Procfile's line as
    a platform runs it (``sh -c``, ``$PORT``, this virtualenv first on ``PATH``), or
    ``loopbot web``. ``env`` is the whole environment, over PATH and HOME."""
    base = {"PATH": f"{VENV_BIN}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp")}
    if how == "procfile":
        return ["sh", "-c", procfile_command("web")], {**base, **env, "PORT": str(port)}
    if how == "loopbot web":
        command = [str(VENV_BIN / "loopbot"), "web", "--host", "127.0.0.1", "--port", str(port)]
        return command, {**base, **env}
    raise ValueError(how)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``proc``'s process group (it was started in a new session), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextlib.contextmanager
def serving(command: list[str], env: dict[str, str], log: Path, port: int) -> Iterator[str]:
    """``command`` started (in ROOT, in its own session, output to ``log``) and waited
    for until ``/healthz`` on ``port`` answers 200; yields the URL, stops it after."""
    from tests.conftest import wait_for  # not at the top: bench/ imports this module

    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(url + "/healthz", timeout=1).status_code == 200
            return False

        wait_for(up, 20, f"{shlex.join(command)} to answer /healthz")
        yield url
    finally:
        stop_group(proc)


@contextlib.contextmanager
def loopbot_web(env: dict[str, str], log: Path, *extra: str) -> Iterator[str]:
    """The real ``loopbot web`` process on a free port, ``env`` over this process's
    environment; yields its URL once /healthz answers."""
    port = free_port()
    command, _ = web_process("loopbot web", port, {})
    with serving([*command, *extra], {**os.environ, **env}, log, port) as url:
        yield url
