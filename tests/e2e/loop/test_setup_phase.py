"""`setup` apart from the agent (jobs/loop/setup_phase.py): its own network (``setup_network``)
and the repository's dependency caches. A local package index on a loopback address the
operator allows (LOOPBOT_EGRESS_ALLOWED_NETWORKS, as for an internal mirror) stands for
PyPI; pip runs inside the sandbox and reaches it only through the egress proxy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.pkgindex import PackageIndex
from tests.conftest import Web
from tests.helpers import CALC, REPO, label, open_issue, sample_repo

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the index listens on port 80")
# One loopback address per xdist worker: each test's index has port 80 to itself.
HOST = f"127.0.0.{40 + int(os.environ.get('PYTEST_XDIST_WORKER', 'gw0')[2:] or 0)}"
APPROVE = m.structured({"verdict": "approve", "summary": "ok", "findings": []})


@pytest.fixture
def index() -> Iterator[PackageIndex]:
    server = PackageIndex(["tinydep"], host=HOST, port=80).start()
    yield server
    server.stop()


@pytest.fixture
def env_extra() -> dict[str, str]:
    return {"LOOPBOT_EGRESS_ALLOWED_NETWORKS": f"{HOST}/32"}


def yml(network: str = "") -> str:
    return (
        "verify: python3 -m unittest -q\nmax_turns: 2\ntriage:\n  enabled: false\n"
        # A private mirror over plain http: pip caches its answers once it is trusted.
        f"setup: python3 -m pip install -q --no-deps --target .deps --retries 0 --timeout 5 "
        f"--trusted-host {HOST} "
        f"--index-url http://{HOST}/simple/ tinydep && python3 -c "
        "\"import sys; sys.path.insert(0, '.deps'); import tinydep; print(tinydep.VALUE)\"\n"
        f"setup_network: [{HOST}]\n{network}"
    )


def events(redis: Redis, key: str, kind: str) -> list[Any]:
    return [e["data"] for e in Store(redis).events(key) if e["kind"] == kind]


def test_setup_reaches_its_index_the_agent_does_not_and_the_next_loop_uses_the_cache(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    index: PackageIndex,
    env: dict[str, str],
) -> None:
    """Loop 1: setup installs ``tinydep`` from the index over ``setup_network``; the
    agent, asking the same host from its own commands, is refused (no network: the
    sandbox has no proxy). Loop 2 of the same repository: setup asks the index's page
    again but takes the wheel from the repository's cache."""
    probe = (
        f"python3 -c \"import urllib.request; urllib.request.urlopen('http://{HOST}/simple/"
        "tinydep/', timeout=5)\" 2>&1 | tail -1; ls /tmp/loopbot-cache 2>&1; echo AGENT-DONE"
    )
    model.play(
        m.bash(probe),
        m.replace("calc.py", "a - b", "a + b"),
        m.text("Fixed add."),
        APPROVE,
    )
    sample_repo(github, loop_yml=yml())
    label(github, "writer", open_issue(github))
    drain()
    key = f"{REPO}#1"
    r = Store(redis).get(key)
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), [
        (e["kind"], e["data"]) for e in Store(redis).events(key)
    ]
    (setup,) = events(redis, key, "setup")
    assert setup["exit_code"] == 0
    assert index.files["tinydep"] == 1 and index.pages["tinydep"] == 1  # setup's, only
    seen = json.dumps(model.requests[1]["messages"])
    assert "AGENT-DONE" in seen
    assert "URLError" in seen or "Errno" in seen  # refused inside the sandbox
    assert "cannot access '/tmp/loopbot-cache'" in seen  # the cache is setup's alone
    assert github.file_at(REPO, "main", "calc.py") == CALC.replace("a - b", "a + b")
    assert github.file_at(REPO, "main", ".deps/tinydep/__init__.py") is None  # not pushed
    caches = list((Path(env["LOOPBOT_DATA_DIR"]) / "caches").iterdir())
    assert len(caches) == 1 and (caches[0] / "pip").is_dir()

    # Loop 2, same repository, a new worktree: setup runs again; the wheel comes from
    # the cache. (How the loop ends does not matter here.)
    model.play(m.text("Nothing to change."), m.text("Still nothing."), APPROVE)
    second = open_issue(github, "add order", "Write add as b + a.")
    label(github, "writer", second)
    drain()
    assert events(redis, f"{REPO}#{second}", "setup")[0]["exit_code"] == 0
    assert index.pages["tinydep"] == 2 and index.files["tinydep"] == 1  # from the cache


def test_without_setup_network_setup_has_the_agent_s_network_none(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    index: PackageIndex,
) -> None:
    """No ``setup_network`` and no ``sandbox.network``: setup reaches nothing, as before,
    and the loop says setup failed."""
    model.play(m.replace("calc.py", "a - b", "a + b"), m.text("Fixed."), APPROVE)
    sample_repo(github, loop_yml=yml().replace(f"setup_network: [{HOST}]\n", ""))
    label(github, "writer", open_issue(github))
    drain()
    key = f"{REPO}#1"
    assert events(redis, key, "setup")[0]["exit_code"] != 0
    assert index.files["tinydep"] == 0 and index.pages["tinydep"] == 0


def test_a_cache_past_its_bound_ends_setup_and_is_emptied_and_repositories_never_share(
    tmp_path: Path,
) -> None:
    """LOOPBOT_SETUP_CACHE_MB=1: a setup that writes 3 MB into its cache is killed as a
    resource limit and leaves the cache empty; another repository (another GitHub id,
    even under the same name) has another cache directory."""
    import subprocess

    from jobs.loop import setup_phase
    from tests.helpers import worker_settings

    settings = worker_settings(tmp_path).model_copy(update={"setup_cache_mb": 1})
    work = tmp_path / "wt"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    cache = setup_phase.cache_dir(settings.data_dir, 7, 1234, "acme/widgets")
    phase = setup_phase.SetupPhase(
        work, settings=settings, network=False, timeout=60, readonly=(), cache=cache
    )
    try:
        fill = 'head -c 3000000 /dev/zero > "$PIP_CACHE_DIR.bin"; sleep 10; echo survived'
        result = phase.run(f'mkdir -p "$PIP_CACHE_DIR"; {fill}')
        assert result.over_limit and "dependency cache passed 1 MiB" in result.over_limit
        assert "survived" not in result.output
        assert list(cache.iterdir()) == []  # emptied: the next loop starts under the bound
        ok = phase.run('mkdir -p "$PIP_CACHE_DIR" && echo kept > "$PIP_CACHE_DIR/x"')
        assert ok.passed and (cache / "pip" / "x").read_text() == "kept\n"
    finally:
        phase.close()
    assert setup_phase.cache_dir(settings.data_dir, 7, 1235, "acme/widgets") != cache
    assert setup_phase.cache_dir(settings.data_dir, 8, 1234, "acme/widgets") != cache


def test_setup_run_again_on_the_agent_s_tree_gets_neither_setup_network_nor_the_cache(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    env: dict[str, str],
) -> None:
    """The agent rewrites the setup script and deletes what setup made: setup runs again
    before verify, but in the agent's sandbox: no proxy, no cache; nothing lands in the
    repository's cache for the next loop (the red team's attack)."""
    base = "mkdir -p .deps && touch .deps/ready && echo base-setup\n"
    evil = (
        'echo "AGENT SETUP proxy=[$HTTPS_PROXY] cache=[$PIP_CACHE_DIR]"\n'
        "mkdir -p /tmp/loopbot-cache/pip && echo planted > /tmp/loopbot-cache/pip/PLANTED\n"
        "mkdir -p .deps && touch .deps/ready\n"
    )
    yml_text = (
        "verify: python3 -m unittest -q\nmax_turns: 1\ntriage:\n  enabled: false\n"
        f"setup: sh tools/setup.sh\nsetup_network: [{HOST}]\n"
    )
    model.play(
        m.write_file("tools/setup.sh", evil),
        m.bash("rm -rf .deps && echo removed"),
        m.replace("calc.py", "a - b", "a + b"),
        m.text("Fixed add."),
        APPROVE,
    )
    sample_repo(github, loop_yml=yml_text, extra={"tools/setup.sh": base, ".gitignore": ".deps/\n"})
    label(github, "writer", open_issue(github))
    drain()
    key = f"{REPO}#1"
    runs = events(redis, key, "setup")
    assert len(runs) == 2 and runs[1].get("again"), runs  # it did run again
    caches = Path(env["LOOPBOT_DATA_DIR"]) / "caches"
    assert caches.is_dir()  # the first setup used the repository's cache
    assert list(caches.rglob("PLANTED")) == []


def test_all_caches_together_stay_within_their_total_the_least_recently_used_go(
    tmp_path: Path,
) -> None:
    import time as _time

    from jobs.loop import setup_phase

    root = tmp_path / "caches"
    paths = []
    for i in range(6):  # 1 MiB each, used in this order
        path = root / f"1-{i}"
        path.mkdir(parents=True)
        (path / "blob").write_bytes(b"x" * (1 << 20))
        os.utime(path, (_time.time() - 100 + i, _time.time() - 100 + i))
        paths.append(path)
    os.utime(paths[0])  # the oldest was just used again
    gone = setup_phase.evict(root, (3 << 20) + (64 << 10), keep=paths[5])
    assert gone == [paths[1], paths[2], paths[3]]
    assert sorted(p.name for p in root.iterdir()) == ["1-0", "1-4", "1-5"]
