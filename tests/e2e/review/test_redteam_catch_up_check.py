"""Red team (issue 43, f26addf): a clean catch-up's head whose `loopbot` check run is
left to the critic. Each test is a way the head could end up needing `loopbot` without
it, or with a run left wrong."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.loop.pull_request import PullRequests
from tests.conftest import Web
from tests.e2e.review.test_redteam_receipt_shown import scheduled_now
from tests.e2e.review.test_same_change import caught_up, events, runs_on, start_two
from tests.helpers import REPO


def test_a_rule_added_after_the_catch_up_left_its_run_still_gets_loopbot(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rules are read when the loop leaves its run to the critic; a maintainer adds
    a ruleset requiring `loopbot` right after. The merged head must still get `loopbot`
    (success), and the loop merges (or at least never ends short of it)."""
    original = PullRequests._check_left_to_critic

    def left_then_rule_added(self: PullRequests, base: str, title: str) -> bool:
        left = original(self, base, title)
        if left:
            github.require_checks(REPO, "main", ["loopbot"], ruleset=True)
        return left

    monkeypatch.setattr(PullRequests, "_check_left_to_critic", left_then_rule_added)
    first, second = start_two(github, model)
    drain(rounds=30)
    late = caught_up(redis, first, second)
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None
    on_head = runs_on(github, r.catch_up.get("to") or r.head_sha)
    assert ("loopbot", "completed", "success") in on_head, (on_head, r.status, r.reason)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), (r.status, r.reason, r.detail)


def test_a_catch_up_whose_rules_read_fails_once_leaves_no_run_in_progress(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop's read of the rules fails (a 502) once, after the catch-up's push and
    the pull request's update: the job errs and RQ retries it (it runs a turn, which
    changes nothing, and writes the run itself). No `loopbot` run is left
    ``in_progress`` on any head, and both loops merge."""
    from bot.io.github.failures import GitHubError

    original = PullRequests._check_left_to_critic
    failed: list[str] = []

    def flaky(self: PullRequests, base: str, title: str) -> bool:
        if not failed:  # the loop's read of the rules, not the gate's
            failed.append(base)
            raise GitHubError("502 Bad Gateway", 502)
        return original(self, base, title)

    monkeypatch.setattr(PullRequests, "_check_left_to_critic", flaky)
    first, second = start_two(github, model)
    drain(rounds=40)
    for _ in range(5):  # the loop's retry, scheduled by RQ (the test worker has none)
        scheduled_now(redis)
        drain(rounds=40)
    assert failed == ["main"]
    runs = list(github.repo(REPO).check_runs.values())
    stuck = [(c["name"], c["head_sha"][:10]) for c in runs if c["status"] != "completed"]
    assert stuck == [], stuck
    store = Store(redis)
    for n in (first, second):
        r = store.get(f"{REPO}#{n}")
        assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), r


@pytest.mark.parametrize("require_checks", [True, False])
def test_a_rule_added_after_the_approval_carried_still_gets_loopbot(
    require_checks: bool,
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same, the ruleset added once the approval carried (the gate is queued);
    also with ``merge.require_checks: false`` (the gate reads no checks, GitHub still
    would refuse the merge)."""
    from jobs.review.critic import Critic

    original = Critic._carried

    def carried_then_rule_added(self: Critic, *args: Any, **kwargs: Any) -> str:
        out = original(self, *args, **kwargs)
        github.require_checks(REPO, "main", ["loopbot"], ruleset=True)
        return out

    monkeypatch.setattr(Critic, "_carried", carried_then_rule_added)
    yml = "verify: test -d notes\n"
    if not require_checks:
        yml += "merge:\n  require_checks: false\n"
    first, second = start_two(github, model, yml=yml)
    drain(rounds=30)
    late = caught_up(redis, first, second)
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None
    on_head = runs_on(github, r.catch_up.get("to") or r.head_sha)
    assert ("loopbot", "completed", "success") in on_head, (on_head, r.status, r.reason)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), (r.status, r.reason)
    assert [e["by"] for e in events(redis, late, "loop_check_written")] == ["gate"]


def test_a_catch_up_whose_base_rules_answer_403_writes_the_loop_s_run(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The rulesets cannot be read (403 on every try): a name may be required that is
    not listed, so the loop writes its own run on the merged head, and the loop merges."""
    github.inject("GET", r"/rules/branches/", 403, times=1000)
    first, second = start_two(github, model)
    drain(rounds=30)
    late = caught_up(redis, first, second)
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    (carried,) = events(redis, late, "review_carried")
    on_head = runs_on(github, carried["sha"])
    assert on_head == [
        ("loopbot", "completed", "success"),
        ("loopbot/critic", "completed", "success"),
    ], on_head
    assert events(redis, late, "loop_check_written") == []  # the loop's, not the gate's
