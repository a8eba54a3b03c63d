"""Issue 27 through real loops: what setup and verify leave never reaches the pull
request, setup's output the agent deleted is made again before verify judges the turn,
and one failing reconciler step does not skip the others. Real worker jobs, git, the
sandbox and the local GitHub and model servers."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs import reconciler
from jobs.runtime import Runtime
from tests.conftest import Web
from tests.e2e.loop.test_loop import FIX, events, record_of
from tests.helpers import REPO, label, open_issue, sample_repo


def test_what_verify_compiles_never_reaches_the_pull_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """verify byte-compiles (``py_compile`` writes ``__pycache__`` whatever
    PYTHONDONTWRITEBYTECODE says) and writes a report, neither ignored by the repository:
    the merged change is the agent's edit alone."""
    yml = (
        "verify: python3 -m py_compile calc.py && python3 -m unittest -q && "
        "echo done > verify-report.txt\nmax_turns: 2\ntriage:\n  enabled: false\n"
    )
    approve = m.structured({"verdict": "approve", "summary": "ok", "findings": []})
    model.play(FIX, m.text("Fixed add."), approve)
    sample_repo(github, loop_yml=yml)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = record_of(redis, n)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    tree = gitrepo.git(github.repo(REPO).path, "ls-tree", "-r", "--name-only", "main")  # type: ignore[arg-type]
    assert "calc.py" in tree.split()
    assert "__pycache__" not in tree and "verify-report" not in tree, tree
    assert events(redis, n, "leftovers_excluded")


def test_setup_output_the_agent_deleted_is_made_again_before_verify(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """setup installs an ignored file verify depends on to be strict; the agent deletes
    it and fixes nothing, so a verify on what it left would pass. loopbot runs setup again
    first: verify runs the tests, fails, and nothing is merged. The note the agent wrote in
    the same turn is its own work, pushed."""
    yml = (
        "setup: mkdir -p .venv && touch .venv/strict\n"
        "verify: if [ -f .venv/strict ]; then python3 -m unittest -q; else exit 0; fi\n"
        "max_turns: 1\ntriage:\n  enabled: false\ncritic:\n  enabled: false\n"
    )
    model.play(m.bash("rm -rf .venv && echo notes > NOTES.md"), m.text("Done."))
    sample_repo(github, loop_yml=yml, extra={".gitignore": ".venv/\n"})
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = record_of(redis, n)
    assert r.status == Status.FAILED and r.reason == "max_turns_reached", r
    assert events(redis, n, "ignored_missing")[0]["paths"] == [".venv/strict"]
    assert [e for e in events(redis, n, "setup") if e.get("again")]
    verify = events(redis, n, "verify")
    assert verify and verify[-1]["passed"] is False
    assert not github.repo(REPO).pulls
    # setup ran again with the agent's new file in the tree: that file is still the
    # agent's (pushed), not taken for setup's output.
    assert github.file_at(REPO, "loop/issue-1", "NOTES.md") == "notes\n"


def test_one_failing_reconciler_step_does_not_skip_the_others(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that raises (a worktree the reaper cannot handle, a GitHub error) is logged,
    and the pass goes on: before, ``reap`` raising ended every pass on that worker before
    the lapsed-lease resume, the sweep and the pace."""
    ran: list[str] = []

    def broken(_rt: Runtime) -> None:
        raise RuntimeError("a tree no git can clean")

    monkeypatch.setattr(reconciler, "reap", broken)
    for name in ("keep_pace", "resume_lapsed", "revive_stranded", "show_places"):
        monkeypatch.setattr(reconciler, name, lambda _rt, name=name: ran.append(name))
    r = reconciler.Reconciler(rt)
    rt.redis.delete("loopbot:reconciler")
    r.tick()
    assert ran == ["keep_pace", "resume_lapsed", "revive_stranded", "show_places"]
    monkeypatch.setattr(reconciler, "keep_pace", broken)
    ran.clear()
    rt.redis.delete("loopbot:reconciler")
    r.tick()
    assert ran == ["resume_lapsed", "revive_stranded", "show_places"]
