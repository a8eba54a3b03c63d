"""A rolling deploy: release 0.1.0 and this release, each installed in its own
virtualenv, on one Redis. A loop started by 0.1.0's worker is finished by this release's
worker after the old one is stopped (SIGTERM, as a deploy does): one pull request,
merged, with the old worker's commit in it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web, wait_for
from tests.helpers import CALC, REPO, ROOT, label, open_issue, sample_repo

# The first release: the commit this work started from (tagged v0.1.0).
FIRST_RELEASE = "5b89688a081c2a851268bd069d68572a1d6bce5e"
YML = "verify: python3 -m unittest -q\nmax_turns: 5\n"
FAST = {"LOOPBOT_LEASE_TTL": "3", "LOOPBOT_RECONCILE_INTERVAL": "1"}
KEY = f"{REPO}#1"


def _install_release(sha: str, where: Path) -> Path:
    """``loopbot`` of commit ``sha``, installed (not editable) in a virtualenv of its own."""
    done = where / "installed"
    exe = where / "venv" / "bin" / "loopbot"
    if done.exists() and exe.exists():
        return exe
    src = where / "src"
    subprocess.run(["rm", "-rf", str(src), str(where / "venv")], check=True)
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    # Without a pip of its own (ensurepip: about 4 s of CPU), installed by this venv's pip,
    # and not byte-compiled ahead (pip compiles every module of every dependency, about
    # 12 s of CPU; Python compiles the few the old worker imports as it imports them).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where / "venv")], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(where / "venv" / "bin" / "python")]
    subprocess.run(
        [*pip, "install", "-q", "--disable-pip-version-check", "--no-compile", str(src)],
        check=True,
    )
    done.touch()
    return exe


@pytest.fixture(scope="session")
def first_release(request: pytest.FixtureRequest) -> Path:
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{FIRST_RELEASE}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip(f"the first release's commit {FIRST_RELEASE[:7]} is not in this clone")
    # Kept between runs (pytest's cache): installing it takes about 10 s.
    return _install_release(FIRST_RELEASE, request.config.cache.mkdir(f"release-{FIRST_RELEASE}"))


def test_a_loop_started_by_the_first_release_is_finished_by_this_one(
    first_release: Path,
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    workers: Any,
) -> None:
    version = subprocess.run(
        [str(first_release), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert "0.1.0" in version
    sample_repo(github, loop_yml=YML)
    os.environ.pop("PYTHONPATH", None)
    old = workers("old", exe=first_release, **FAST)
    # Turn 1 on the old release pushes a commit; turn 2's model call takes 3 s: the deploy
    # stops the old worker then.
    model.play(m.write_file("NOTES.md", "turn one\n"), m.text("Started."), m.bash("ls", delay=3.0))
    n = open_issue(github)
    label(github, "writer", n)
    wait_for(lambda: len(model.requests) >= 3, 90, "turn 2's model call on the old release")
    # Turn 2 may start while turn 1's push is still on the wire: wait for it to land.
    wait_for(lambda: github.ref(REPO, "loop/issue-1"), 30, "turn 1's push")
    stopping = time.monotonic()
    assert old.terminate(timeout=60) == 0, old.output()
    assert time.monotonic() - stopping < 30
    store = Store(redis)
    r = store.get(KEY)
    kinds = [e["kind"] for e in store.events(KEY)]
    # Handed over and queued. (The old worker's reconciler, still running while its job
    # drains, may already have taken the handed-over loop: queued again, not marked.)
    assert r is not None and r.status == Status.QUEUED and "handoff" in kinds, (r, kinds)

    # This release's worker takes the handed-over job the old one queued, and finishes.
    model.play(
        m.replace("calc.py", "return a - b", "return a + b"),
        m.text("Fixed add."),
        m.structured({"verdict": "approve", "summary": "Looks right.", "findings": []}),
    )
    new = workers("new", **FAST)

    def done() -> bool:
        rec = store.get(KEY)
        return rec is not None and rec.status == Status.COMPLETED

    wait_for(done, 120, "this release to finish the loop\n" + new.output()[-3000:])
    r = store.get(KEY)
    assert r is not None and r.reason == "merged", r
    assert r.auto_resumes == 0  # handed over, not lost
    repo = github.repo(REPO)
    assert len(repo.pulls) == 1 and next(iter(repo.pulls.values())).merged
    # Nothing lost: the old release's commit and the new one's fix are both on main.
    main = gitrepo.git(repo.path, "rev-parse", "main").strip()
    assert github.file_at(REPO, main, "NOTES.md") == "turn one\n"
    assert github.file_at(REPO, main, "calc.py") == CALC.replace("a - b", "a + b")
    kinds = [e["kind"] for e in store.events(KEY)]
    assert kinds.count("loop_created") == 1 and "handoff" in kinds
    resumed = [e["data"] for e in store.events(KEY) if e["kind"] == "loop_resumed"]
    assert resumed == [{"reason": "handoff"}]
    assert "Traceback" not in new.output(), new.output()[-3000:]
