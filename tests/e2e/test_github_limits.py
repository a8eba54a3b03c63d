"""GitHub's secondary limit, per installation, across workers: two worker processes run
one loop each in two repositories of one installation against a local GitHub that
refuses writes past its limit with 403 and ``Retry-After`` (as github.com does). The pace
they share through Redis (``bot/io/github/pace.py``) holds both workers until the time
given, then spaces writes so the limit is not hit again; no write is lost or repeated and
both loops merge."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import TERMINAL, Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web, wait_for
from tests.helpers import CALC, TEST_CALC, reply_between_turns

YML = "verify: python3 -m unittest -q\nmax_turns: 3\ntriage:\n  enabled: false\n"
REPOS = ("acme/widgets", "acme/gadgets")


def respond(body: dict[str, Any]) -> m.Item:
    return reply_between_turns(body) or m.replace("calc.py", "a - b", "a + b")


def test_two_workers_pause_together_at_the_installation_s_limit_and_both_loops_merge(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    workers: Any,
) -> None:
    github.write_limit, github.write_window = 3, 2.0
    model.responder = respond
    iid = github.add_installation("acme")
    numbers = {}
    for repo in REPOS:
        files = {"calc.py": CALC, "test_calc.py": TEST_CALC, ".github/loop.yml": YML}
        github.add_repo(repo, files, installation_id=iid, collaborators={"writer": "write"})
        with github.as_user("writer") as u:
            r = u.post(f"/repos/{repo}/issues", json={"title": "add", "body": "Fix calc.add."})
            numbers[repo] = int(r.json()["number"])
    for name in ("a", "b"):
        # Faster than the limit (3 in 2 s) until it is hit; twice as slow after, as the
        # pace makes it then, slower than the limit: so it is hit once, by design.
        workers(name, LOOPBOT_GITHUB_WRITE_GAP="0.4")
    for repo, n in numbers.items():
        with github.as_user("writer") as u:
            u.post(f"/repos/{repo}/issues/{n}/labels", json={"labels": ["loop:ready"]})
    keys = [LoopId(repo, n).key for repo, n in numbers.items()]
    store = Store(redis)

    def done() -> bool:
        return all((r := store.get(k)) is not None and r.status in TERMINAL for k in keys)

    wait_for(done, 150, "both loops to end")
    for k in keys:
        r = store.get(k)
        assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), [
            (e["kind"], e["data"]) for e in store.events(k)
        ]
    # The limit was hit, and once: every refusal came at the moment it was first hit
    # (writes already on their way), none after the pause.
    assert github.limited, "the local GitHub's limit was never reached"
    first, retry_after = github.limited[0][3], github.limited[0][4]
    assert all(t - first < 0.5 for _, _, _, t, _ in github.limited), github.limited
    # No write of either worker reached GitHub while the installation was paused (the
    # refused ones on their way when it was hit aside).
    during = [
        (t, method, path)
        for t, method, path, _ in github.write_log
        if first + 0.5 < t < first + retry_after - 0.05
    ]
    assert not during, during
    # Nothing lost or repeated: one pull request and one status comment per issue, the
    # fix merged in each repository.
    for repo, n in numbers.items():
        repo_state = github.repo(repo)
        assert len(repo_state.pulls) == 1
        statuses = [
            c
            for c in repo_state.comments.values()
            if c["_issue"] == n and "<!-- loopbot:status -->" in c["body"]
        ]
        assert len(statuses) == 1, json.dumps(statuses)[:500]
        assert github.file_at(repo, "main", "calc.py") == CALC.replace("a - b", "a + b")
