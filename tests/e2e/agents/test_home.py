"""A backend CLI's HOME is the agent's: a link it plants there must never lead the
worker, which saves the session from HOME after every turn, to a directory of the host
(issue 37, item 4: the red team's Codex moved ``~/.codex`` away and linked a host
directory in its place; the worker, as root, packed that directory's ``sessions/**`` into
the saved session, and the next turn unpacked it into the sandbox: another repository's
worktree on the same worker came across. opencode has the same shape through
``~/.local``). Real CLIs, real RQ workers, the local model servers.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import openai as o
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.openai import OpenAIServer
from jobs.agents import codex, opencode
from tests.conftest import Web
from tests.e2e.agents import test_codex, test_opencode
from tests.e2e.agents.test_codex import openai  # noqa: F401  (a fixture)
from tests.helpers import REPO, label, open_issue, sample_repo

KEY = f"{REPO}#1"
SECRET = "another-loops-worktree-secret-7f3a"


@pytest.fixture
def env_extra(request: pytest.FixtureRequest) -> dict[str, str]:
    """The backend's settings: Codex's with the local Responses server, else opencode's."""
    more = getattr(request, "param", {})
    if "openai" in request.fixturenames:
        server = request.getfixturevalue("openai")
        return {
            "LOOPBOT_AGENT_BACKENDS": "builtin,codex",
            "OPENAI_API_KEY": test_codex.REAL_KEY,
            "OPENAI_BASE_URL": server.base_url,
            **more,
        }
    return {**test_opencode.ENV, **more}


def _victim(tmp_path: Path, *parts: str) -> tuple[Path, Path]:
    """A host directory the sandbox cannot see (another loop's worktree, on this worker),
    shaped as the backend's session directory, holding a secret."""
    victim = tmp_path / "other-loop" / "wt"
    target = victim.joinpath(*parts)
    target.parent.mkdir(parents=True)
    target.write_text(f"{SECRET}\n")
    return victim, target


def _saved(redis: Redis, backend: str) -> bytes:
    saved = Store(redis).agent_session(KEY, backend)
    assert saved is not None, "a session was saved"
    return gzip.decompress(saved[1])


def _start(github: GitHubServer, drain: Any, yml: str) -> None:
    sample_repo(github, loop_yml=yml.replace("max_turns: 3", "max_turns: 2"))
    label(github, "writer", open_issue(github))
    drain()


@pytest.mark.skipif(codex.cli_path() is None, reason="Codex is not installed")
def test_a_link_planted_for_codex_home_never_brings_a_host_directory_into_the_session(
    github: GitHubServer,
    model: AnthropicServer,
    openai: OpenAIServer,  # noqa: F811
    web: Web,
    redis: Redis,
    drain: Any,
    tmp_path: Path,
) -> None:
    victim, target = _victim(tmp_path, "sessions", "2026", "11", "rollout-victim.jsonl")
    plant = f"mv ~/.codex ~/.codex-away && ln -s {victim} ~/.codex && ls -la ~ && echo planted"
    look = "cat ~/.codex/sessions/*/*/* 2>&1; ls -laR ~/.codex/ 2>&1 | head -40"
    openai.play(o.cx_shell(plant), o.text("Moved."), o.cx_shell(look), o.text("Looked."))
    _start(github, drain, test_codex.YML)
    assert "planted" in json.dumps(openai.requests[1]["input"])  # the link was made
    assert SECRET.encode() not in _saved(redis, "codex"), "the host file is in the session"
    assert SECRET not in json.dumps(openai.requests)
    assert SECRET not in json.dumps(test_codex.events(redis))
    assert target.read_text() == f"{SECRET}\n"  # and nothing written there


@pytest.mark.skipif(opencode.cli_path() is None, reason="opencode is not installed")
def test_a_link_planted_for_opencode_s_data_never_brings_a_host_directory_into_the_session(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    tmp_path: Path,
) -> None:
    victim, target = _victim(tmp_path, "share", "opencode", "opencode.db")
    plant = f"mv ~/.local ~/.local-away && ln -s {victim} ~/.local && ls -la ~ && echo planted"
    look = "cat ~/.local/share/opencode/opencode.db 2>&1 | head -c 2000; ls -la ~/.local/"
    model.play(m.oc_bash(plant), m.text("Moved."), m.oc_bash(look), m.text("Looked."))
    _start(github, drain, test_opencode.YML)
    requests = test_opencode.agent_requests(model)
    assert len(requests) > 1, test_opencode.events(redis)
    assert "planted" in json.dumps(requests[1]["messages"])  # the link was made
    assert SECRET.encode() not in _saved(redis, "opencode"), "the host file is in the session"
    assert SECRET not in json.dumps(model.requests)
    assert SECRET not in json.dumps(test_opencode.events(redis))
    assert target.read_text() == f"{SECRET}\n"


@pytest.mark.skipif(opencode.cli_path() is None, reason="opencode is not installed")
@pytest.mark.parametrize("env_extra", [{"LOOPBOT_SANDBOX_TMP_MB": "64"}], indirect=True)
def test_a_cli_s_home_is_bounded_by_its_file_system_not_by_a_poll(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
) -> None:
    """Issue 37, item 7: the CLI's HOME was a directory in the host's /tmp, checked once a
    second (``fallocate`` put 8 GiB there first). It is the sandbox's /tmp tmpfs now: past
    LOOPBOT_SANDBOX_TMP_MB the allocation itself fails, and the session still carries over
    to the next turn."""
    fill = "stat -f -c %T ~; fallocate -l 200M ~/fill; echo rc=$?"
    model.play(
        m.oc_bash(fill),
        m.text("Filled."),
        m.oc_bash("echo second turn"),
        m.text("Again."),
    )
    _start(github, drain, test_opencode.YML)
    requests = test_opencode.agent_requests(model)
    assert len(requests) >= 3, test_opencode.events(redis)
    shown = json.dumps(requests[1]["messages"])
    assert "tmpfs" in shown and "No space left on device" in shown and "rc=1" in shown, shown
    # Turn 2 resumed opencode's session (its database, saved from the tmpfs HOME).
    assert "Filled." in json.dumps(requests[2]["messages"])
