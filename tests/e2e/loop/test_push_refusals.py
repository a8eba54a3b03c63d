"""Pushes GitHub refuses, end to end: real loops (RQ worker, git, sandbox) against the
local GitHub with its receive-pack rules on (bot/standins/receive_hook.py). No loop
passes by retrying against a rule: the refused pushes are counted per cause."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.loop.test_loop import FIX, bot_comments, events, record_of, turn_prompt
from tests.helpers import CALC, REPO, label, open_issue, sample_repo

MERGE = "verify: python3 -m unittest -q\nmax_turns: 4\n"
NO_MERGE = MERGE + "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
CI = "on: push\njobs: {}\n"
SECRET = "ghp_" + "Zq7Lm2Xw9Rt4" * 3  # a GitHub personal access token's shape
FIXED = CALC.replace("a - b", "a + b")


def is_critic(body: dict[str, Any]) -> bool:
    return bool((body.get("output_config") or {}).get("format"))


APPROVE = m.structured({"verdict": "approve", "summary": "Fine.", "findings": []})


def scripted(*turns: list[m.Item]) -> Any:
    """A responder: the critic approves; each agent turn plays its replies in order."""
    queue = [item for turn in turns for item in turn]

    def reply(body: dict[str, Any]) -> m.Item:
        return APPROVE if is_critic(body) else queue.pop(0)

    return reply


def start(github: GitHubServer, drain: Any, yml: str, **repo: Any) -> int:
    sample_repo(github, loop_yml=yml, extra={".github/workflows/ci.yml": CI})
    for key, value in repo.items():
        setattr(github.repo(REPO), key, value)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def refused(github: GitHubServer) -> list[str]:
    return [r["cause"] for r in github.repo(REPO).refused_pushes()]


def agent_prompts(model: AnthropicServer) -> list[str]:
    return [turn_prompt(b) for b in model.requests if not is_critic(b)]


def pushed_history(github: GitHubServer) -> str:
    """Every commit GitHub has on a branch, with its whole diff."""
    return gitrepo.git(github.repo(REPO).path, "log", "--branches", "-p", "--format=%H")


def test_the_agents_workflow_change_stays_out_and_the_fix_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.responder = scripted(
        [
            m.write_file(".github/workflows/ci.yml", "on: [push, pull_request]\njobs: {}\n"),
            m.text("CI runs on pull requests now."),
        ],
        [FIX, m.text("Fixed add.")],
    )
    n = start(github, drain, MERGE)
    r = record_of(redis, n)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r.detail
    assert refused(github) == []
    assert github.file_at(REPO, "main", "calc.py") == FIXED
    assert github.file_at(REPO, "main", ".github/workflows/ci.yml") == CI  # untouched
    assert ".github/workflows/ci.yml" in r.workflow_patches
    # The agent was told in its next turn; the issue and the pull request carry the patch.
    assert any("were left out of the commit" in p for p in agent_prompts(model))
    (pull,) = github.repo(REPO).pulls.values()
    body = github.repo(REPO).issues[pull.number].body
    for text in [body, *(c["body"] for c in bot_comments(github))]:
        if "Workflow changes left out" in text:
            assert "```diff\n" in text and "+on: [push, pull_request]" in text
    said = [c for c in bot_comments(github) if "Workflow changes left out" in c["body"]]
    assert len(said) == 1 and "Workflow changes left out" in body
    assert [e["paths"] for e in events(redis, n, "workflows_left_out")] == [
        [".github/workflows/ci.yml"]
    ]


def test_a_base_that_changed_a_workflow_and_conflicts_is_brought_in_without_a_refusal(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """While the loop works, a maintainer changes CI and the very line the fix changes.
    The gate finds the conflict and sends the loop back; a merge commit of main would
    update the workflow against the branch (GitHub refuses it from the App): the loop
    brings main in as one commit on it instead, pushed with a lease."""
    maintainer_ci = "on: [push, pull_request]\njobs: {}\n"
    theirs = CALC.replace("return a - b", "return a - b  # maintainer")
    moved: list[str] = []

    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            return APPROVE
        last = body["messages"][-1]["content"]
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
            return m.text("Done.")
        if "conflict markers" in json.dumps(last):
            return m.write_file("calc.py", FIXED.replace("a + b", "a + b  # maintainer"))
        if not moved:  # the loop has its checkout: main moves under it
            bare = github.repo(REPO).path
            moved.append(
                gitrepo.seed(
                    bare, "main", {"calc.py": theirs, ".github/workflows/ci.yml": maintainer_ci}
                )
            )
        return FIX

    model.responder = agent
    n = start(github, drain, MERGE)
    r = record_of(redis, n)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r.detail
    assert refused(github) == []
    assert events(redis, n, "base_merged")[0]["conflicts"] == ["calc.py"]
    assert len(events(redis, n, "merge_linearized")) == 1
    assert github.file_at(REPO, "main", ".github/workflows/ci.yml") == maintainer_ci
    assert "a + b  # maintainer" in (github.file_at(REPO, "main", "calc.py") or "")


def test_a_planted_secret_is_refused_once_then_removed_by_the_agent(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.write_file("settings.py", f"TOKEN = '{SECRET}'\n"),
        m.text("Fixed add."),
        m.write_file("settings.py", "import os\n\nTOKEN = os.environ.get('TOKEN', '')\n"),
        m.text("The token comes from the environment now."),
    )
    n = start(github, drain, NO_MERGE, push_protection=True)
    r = record_of(redis, n)
    assert (r.status, r.reason, r.turn) == (Status.COMPLETED, "pr_opened", 2), r.detail
    assert refused(github) == ["secret"]
    assert r.push_refusals == {"secret": 1}
    (second,) = [p for p in agent_prompts(model) if "push protection" in p]
    assert "push protection found a secret" in second
    assert "GitHub Personal Access Token in `settings.py` line 1" in second
    assert SECRET not in pushed_history(github)
    assert github.file_at(REPO, "loop/issue-1", "calc.py") == FIXED


def test_a_file_over_100_mb_refused_while_the_next_turn_ran_is_that_turns_news(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """GitHub takes seconds over each push: turn 2 starts (and commits) before turn 1's
    push is refused. Turn 2's commit is not pushed (it still holds the file, the agent
    did not know); turn 3 is told, removes it, and one commit without it is pushed."""
    github.push_delay = 4.0
    model.play(
        m.bash("truncate -s 120M fixture.bin"),  # sparse: no disk, and git compresses it
        m.text("Added a fixture."),
        m.write_file("NOTES.md", "Looked at calc.py.\n"),
        m.text("Notes written."),
        m.bash("rm fixture.bin"),
        FIX,
        m.text("Removed the large file and fixed add."),
    )
    n = start(github, drain, NO_MERGE)
    r = record_of(redis, n)
    assert (r.status, r.reason, r.turn) == (Status.COMPLETED, "pr_opened", 3), r.detail
    assert refused(github) == ["large_file"] and r.push_refusals == {"large_file": 1}
    told = [i for i, p in enumerate(agent_prompts(model)) if "`fixture.bin` (120.00 MB)" in p]
    assert len(told) == 1 and "over its 100 MB limit" in agent_prompts(model)[told[0]]
    assert [e["turn"] for e in events(redis, n, "turn_started")] == [1, 2, 3]
    assert [e["turn"] for e in events(redis, n, "pushed")] == [3]
    tree = gitrepo.git(github.repo(REPO).path, "log", "--branches", "--name-only", "--format=")
    assert "fixture.bin" not in tree and "NOTES.md" in tree


def test_a_ruleset_restricting_loop_branches_stops_the_loop_before_any_work(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."))
    n = start(github, drain, NO_MERGE, restrict_creation=["refs/heads/loop/*"])
    r = record_of(redis, n)
    assert (r.status, r.reason) == (Status.FAILED, "push_refused"), r.detail
    assert refused(github) == []  # read from the rules: no push was tried
    assert not agent_prompts(model) and not events(redis, n, "turn_started")
    assert "Stopped before any work" in r.detail and "creating branches" in r.detail
    assert "Narrow the ruleset's pattern" in r.detail and "bypass" not in r.detail
    assert github.ref(REPO, "loop/issue-1") is None and not github.repo(REPO).pulls
    status = [c for c in bot_comments(github) if "<!-- loopbot:status -->" in c["body"]]
    assert "push_refused" in status[0]["body"]


def test_signed_commits_required_on_loop_branches_stop_the_loop_before_any_work(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."))
    signed = {"type": "required_signatures"}
    n = start(github, drain, NO_MERGE, listed_rules=[("loop/*", signed)])
    r = record_of(redis, n)
    assert (r.status, r.reason) == (Status.FAILED, "push_refused"), r.detail
    assert "requires signed commits" in r.detail and "not signed" in r.detail
    assert not agent_prompts(model) and refused(github) == []
    assert github.ref(REPO, "loop/issue-1") is None


def test_signed_commits_required_on_the_default_branch_only_do_not_stop_a_loop(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # GitHub signs the squash merge it makes, so a rule on main alone is no obstacle.
    model.play(FIX, m.text("Fixed add."))
    n = start(github, drain, NO_MERGE, listed_rules=[("main", {"type": "required_signatures"})])
    r = record_of(redis, n)
    assert r.reason != "push_refused", r.detail
    assert agent_prompts(model) and github.ref(REPO, "loop/issue-1") is not None


def test_a_secret_the_agent_keeps_is_refused_twice_then_the_loop_stops(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.write_file("settings.py", f"TOKEN = '{SECRET}'\n"),
        m.text("Fixed add."),
        m.write_file("NOTES.md", "The token is needed.\n"),
        m.text("Kept it."),
    )
    n = start(github, drain, NO_MERGE, push_protection=True)
    r = record_of(redis, n)
    assert (r.status, r.reason, r.turn) == (Status.FAILED, "push_refused", 2), r.detail
    assert refused(github) == ["secret", "secret"] and r.push_refusals == {"secret": 2}
    assert "(2 times): push protection found a secret" in r.detail
    assert "Push cannot contain secrets" in r.detail
    assert github.ref(REPO, "loop/issue-1") is None and SECRET not in pushed_history(github)
