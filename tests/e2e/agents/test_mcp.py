"""MCP servers from loop.yml (``agent.mcp_servers``): a small stdio server the test
ships in the repository (tests/data/mcp_notes.py), started by the backend inside the
sandbox, called by the agent; its config lives in the backend's private HOME and never
in a pushed commit. A server that cannot start is a clear error on the issue.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.agents import claude_code, mcp, opencode
from tests.conftest import Web
from tests.helpers import CALC, DATA, REPO, label, open_issue, sample_repo

SERVER = (DATA / "mcp_notes.py").read_text()
KEY = f"{REPO}#1"
APPROVE = m.structured({"verdict": "approve", "summary": "ok", "findings": []})
MCP_YML = (
    "  mcp_servers:\n    notes:\n      command: python3\n      args: [tools/mcp_notes.py]\n"
    "      env:\n        MCP_WORD: KIWI-7\n"
)


def yml(backend: str, servers: str = MCP_YML) -> str:
    return (
        "verify: python3 -m unittest -q\nmax_turns: 2\ntriage:\n  enabled: false\n"
        f"agent:\n  backend: {backend}\n{servers}"
    )


@pytest.fixture
def env_extra(request: pytest.FixtureRequest) -> dict[str, str]:
    return {
        "LOOPBOT_AGENT_BACKENDS": "builtin,claude-code,opencode",
        "LOOPBOT_MODEL": "claude-sonnet-4-6",
    }


def events(redis: Redis, kind: str) -> list[Any]:
    return [e["data"] for e in Store(redis).events(KEY) if e["kind"] == kind]


def agent_requests(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if "format" not in (b.get("output_config") or {})]


def pushed_files(github: GitHubServer) -> set[str]:
    """Every path any commit of the loop's pull request touched (every commit pushed)."""
    repo = github.repo(REPO)
    (pull,) = repo.pulls.values()
    base = gitrepo.git(repo.path, "merge-base", "main~1", repo.head_sha(pull)).strip()
    log = gitrepo.git(
        repo.path, "log", "--name-only", "--format=", f"{base}..{repo.head_sha(pull)}"
    )
    return {line for line in log.splitlines() if line.strip()}


@pytest.mark.parametrize(
    "backend, tool, edit",
    [
        pytest.param(
            "opencode",
            "notes_lookup",
            m.oc_edit,
            marks=pytest.mark.skipif(opencode.cli_path() is None, reason="no opencode"),
        ),
        pytest.param(
            "claude-code",
            "mcp__notes__lookup",
            m.cc_edit,
            marks=pytest.mark.skipif(claude_code.cli_path() is None, reason="no Claude Code"),
        ),
    ],
)
def test_the_agent_calls_the_repository_s_mcp_server_and_its_config_is_never_pushed(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    backend: str,
    tool: str,
    edit: Any,
) -> None:
    model.play(
        m.tool(tool, {"topic": "calc"}),
        edit("calc.py", "a - b", "a + b"),
        m.text("Fixed add."),
        APPROVE,
    )
    sample_repo(github, loop_yml=yml(backend), extra={"tools/mcp_notes.py": SERVER})
    label(github, "writer", open_issue(github))
    drain()
    r = Store(redis).get(KEY)
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), [
        (e["kind"], e["data"]) for e in Store(redis).events(KEY)
    ]
    calls = agent_requests(model)
    assert tool in {t["name"] for t in calls[0]["tools"]}  # the server's tool, offered
    # Its answer (with the word loop.yml's env gave the server) reached the model.
    assert "the word for calc is KIWI-7" in json.dumps(calls[1]["messages"])
    assert events(redis, "mcp_checked") == [{"servers": {"notes": ["lookup"]}}]
    assert pushed_files(github) == {"calc.py"}  # no config of the backend's, no HOME file
    assert github.file_at(REPO, "main", "calc.py") == CALC.replace("a - b", "a + b")


@pytest.mark.skipif(opencode.cli_path() is None, reason="no opencode")
def test_a_server_that_cannot_start_is_a_clear_error_on_the_issue_not_a_hang(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    broken = MCP_YML.replace("tools/mcp_notes.py", "tools/missing.py")
    sample_repo(github, loop_yml=yml("opencode", broken), extra={"tools/mcp_notes.py": SERVER})
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = Store(redis).get(KEY)
    assert r is not None and (r.status, r.reason) == (Status.FAILED, "bad_config")
    assert agent_requests(model) == []  # nothing ran without it
    said = json.dumps([c["body"] for c in github.repo(REPO).comments.values()])
    assert "the MCP server `notes` (`agent.mcp_servers`) it exited" in said
    assert "missing.py" in said


def test_the_built_in_agent_is_told_it_runs_without_the_servers(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.replace("calc.py", "a - b", "a + b"), m.text("Fixed."), APPROVE)
    sample_repo(github, loop_yml=yml("builtin"), extra={"tools/mcp_notes.py": SERVER})
    label(github, "writer", open_issue(github))
    drain()
    r = Store(redis).get(KEY)
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged")
    said = json.dumps([c["body"] for c in github.repo(REPO).comments.values()])
    assert "the built-in agent does not start MCP servers" in said


@pytest.mark.parametrize(
    "output, code, problem",
    [
        (
            '{"jsonrpc":"2.0","id":1,"result":{}}\n{"jsonrpc":"2.0","id":2,"result":'
            '{"tools":[{"name":"a"},{"name":"b"}]}}\n',
            137,
            None,
        ),
        ("python3: can't open file 'x.py'\n", 2, "exited (2) without answering: python3"),
        ('{"jsonrpc":"2.0","id":1,"result":{}}\n', 124, "answered initialize but not"),
        ('{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}\n', 1, "with an error"),
        ("", 124, "did not answer within 20 s"),
        # Killed by the check once it ended: its own status, not the kill's.
        ("python3: can't open file\nloopbot-mcp-exited:2\n", 137, "exited (2) without"),
    ],
)
def test_a_handshake_is_judged_by_what_the_server_answered(
    output: str, code: int, problem: str | None
) -> None:
    got = mcp.judge("notes", output, code, 1.0)
    if problem is None:
        assert got.problem is None and got.tools == ("a", "b")
    else:
        assert got.problem is not None and problem in got.problem, got.problem


@pytest.mark.parametrize(
    "servers, problem",
    [
        ("    notes:\n      command: x\n      env: {ANTHROPIC_API_KEY: k}\n", "loopbot's to set"),
        ("    notes:\n      command: x\n      env: {LD_PRELOAD: /x.so}\n", "loopbot's to set"),
        ("    notes:\n      command: x\n      env: {HTTPS_PROXY: http://x}\n", "loopbot's to set"),
        ("    Bad.Name:\n      command: x\n", "lower-case letters"),
        ('    notes:\n      command: "a\\nb"\n', "newline"),
        ("".join(f"    s{i}:\n      command: x\n" for i in range(9)), "at most 8"),
    ],
)
def test_loop_yml_mcp_servers_are_validated(servers: str, problem: str) -> None:
    from bot.core import repo_config

    text = f"verify: x\nagent:\n  backend: opencode\n  mcp_servers:\n{servers}"
    with pytest.raises(repo_config.ConfigError) as e:
        repo_config.load(text, repo_config.DEFAULT_CEILINGS)
    assert problem in " ".join(e.value.problems), e.value.problems
    ok = "    notes:\n      command: python3\n      args: [s.py]\n      env: {WORD: x}\n"
    config = repo_config.parse(f"verify: x\nagent:\n  mcp_servers:\n{ok}")
    assert config.agent.mcp_servers["notes"].env == {"WORD": "x"}
