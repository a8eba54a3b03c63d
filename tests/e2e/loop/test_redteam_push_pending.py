"""Red team of 3076c56: a turn no longer waits for its push after verify. These drive the
loop job (real git, sandbox, local GitHub taking seconds over each push) and check the
rules the commit claims: a push is never lost or left unreported, nothing that needs the
remote branch runs before it ended, and the job never ends with it running."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.loop.test_loop import FIX, config
from tests.helpers import REPO, started_loop

BRANCH = "loop/issue-1"
DELAY = 4.0  # seconds the local GitHub takes over each push


def _events(redis: Redis, n: int, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in Store(redis).events(LoopId(REPO, n).key) if e["kind"] == kind]


def test_redteam_push_a_push_that_landed_is_reported_when_the_next_turn_errors(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
) -> None:
    """Turn 1 commits and pushes (slowly); verify fails fast, so turn 2 starts with the
    push still on the wire; turn 2's model call fails (an error RQ retries). Before the
    error is handled the push is waited for and, having landed, reported: the record's
    head_sha, the ``pushed`` event and the check run for that head. (Found by the red
    team: the job's end waited for the push but never reported it.)"""
    from jobs.loop.job import run_loop

    n = started_loop(github, redis, env, config(max_turns=5))
    model.play(
        m.write_file("NOTES.md", "Looked at calc.py.\n"),
        m.text("Notes written."),  # turn 1: a change, verify still fails
        m.Fail(400, "injected", "invalid_request_error"),  # turn 2: the job errors
    )
    github.push_delay = DELAY
    with pytest.raises(Exception):  # noqa: B017 - the error RQ would retry
        run_loop(REPO, n)

    pushed_sha = github.ref(REPO, BRANCH)
    assert pushed_sha is not None, "the push did not land (it is waited for at the end)"
    record = Store(redis).get(LoopId(REPO, n).key)
    assert record is not None
    runs = [
        r
        for r in github.repo(REPO).check_runs.values()
        if r["name"] == "loopbot" and r["head_sha"] == pushed_sha
    ]
    pushed = _events(redis, n, "pushed")
    assert (record.head_sha, [e["sha"] for e in pushed], len(runs)) == (
        pushed_sha,
        [pushed_sha],
        1,
    ), "the head on GitHub is not the record's, has no pushed event or no check run"


def test_redteam_push_slow_push_then_verify_passes_opens_the_pull_on_the_pushed_head(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
) -> None:
    """Control (expected to hold): the pull request waits for the push."""
    from jobs.loop.job import run_loop

    n = started_loop(github, redis, env, config(max_turns=3))
    model.play(FIX, m.text("Fixed add."))
    github.push_delay = DELAY
    result = run_loop(REPO, n)
    record = Store(redis).get(LoopId(REPO, n).key)
    assert record is not None and record.status == Status.COMPLETED, result
    assert record.head_sha == github.ref(REPO, BRANCH)
    kinds = [e["kind"] for e in Store(redis).events(LoopId(REPO, n).key)]
    assert kinds.index("pushed") < kinds.index("pr_opened")
    (pull,) = github.repo(REPO).pulls.values()
    assert github.ref(REPO, pull.head) == record.head_sha


class _RacingTime:
    """Stands in for ``time`` in the local GitHub's git endpoint: while a push is held
    (``push_delay``), someone else's commit lands on the loop's branch first, so the
    held push is no longer a fast-forward and git refuses it."""

    def __init__(self, github: GitHubServer) -> None:
        self.github = github
        self.raced = 0

    def time(self) -> float:
        import time

        return time.time()

    def sleep(self, seconds: float) -> None:
        import time

        from bot.standins.gitrepo import git

        if not self.raced:
            self.raced += 1
            bare = self.github.repo(REPO).path
            main = git(bare, "rev-parse", "refs/heads/main").strip()
            git(bare, "update-ref", f"refs/heads/{BRANCH}", main)
        time.sleep(seconds)


def test_redteam_push_a_refused_push_and_the_last_error_still_finish_the_loop(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Turn 1's push is slow and then refused (not a fast-forward any more); turn 2's
    model call fails, the loop's third error. The loop ends FAILED, as that error says:
    the refused push is logged when the error is handled, not raised again out of its
    end. (Found by the red team: ``_finish``'s wait for the push raised it out of
    ``_error``, and the record was left RUNNING.)"""
    from bot.standins.github import git_http
    from jobs.loop.job import run_loop

    n = started_loop(github, redis, env, config(max_turns=5))
    key = LoopId(REPO, n).key
    Store(redis).set_fields(key, error_count=2)  # the next error is the last allowed
    model.play(
        m.write_file("NOTES.md", "Looked at calc.py.\n"),
        m.text("Notes written."),
        m.Fail(400, "injected", "invalid_request_error"),
    )
    monkeypatch.setattr(git_http, "time", _RacingTime(github))
    github.push_delay = DELAY
    try:
        result: str | None = run_loop(REPO, n)
        raised = ""
    except Exception as exc:  # noqa: BLE001
        result, raised = None, f"{type(exc).__name__}: {exc}"[:300]
    record = Store(redis).get(key)
    assert record is not None
    assert (record.status, raised) == (Status.FAILED, ""), (record.status, raised, result)


def test_redteam_push_drain_during_a_pending_push_hands_over_after_it(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
) -> None:
    """Control (expected to hold): SIGTERM's drain while turn 1's push is on the wire;
    the hand-over waits for the push and reports it; no push thread outlives the job."""
    import threading

    from jobs.drain import DRAIN
    from jobs.loop.job import run_loop

    n = started_loop(github, redis, env, config(max_turns=5))

    def drain_soon(body: dict[str, Any]) -> m.Item:
        DRAIN.set()
        return m.text("Stopping.")

    model.play(m.write_file("NOTES.md", "Looked at calc.py.\n"), m.text("Notes written."))
    model.responder = drain_soon  # turn 2's call: the worker is told to shut down
    github.push_delay = DELAY
    try:
        result = run_loop(REPO, n)
    finally:
        DRAIN.clear()
    record = Store(redis).get(LoopId(REPO, n).key)
    assert record is not None
    assert record.head_sha and record.head_sha == github.ref(REPO, BRANCH), result
    assert not [t for t in threading.enumerate() if t.name == "push" and t.is_alive()]
    assert result.startswith("handed over"), result
    assert [e["sha"] for e in _events(redis, n, "pushed")] == [record.head_sha]


def test_the_next_turn_starts_while_the_last_push_is_on_the_wire(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
) -> None:
    """A push GitHub takes seconds over, a verify that takes less: turn 2 starts (and
    its model is asked) before turn 1's push has ended, and the push is still reported
    once, with its sha, before the pull request; every pushed head has one check run."""
    from jobs.loop.job import run_loop

    n = started_loop(github, redis, env, config(max_turns=3))
    model.play(
        m.write_file("NOTES.md", "Looked at calc.py.\n"),
        m.text("Notes written."),  # turn 1: a change, verify still fails
        FIX,
        m.text("Fixed add."),  # turn 2: verify passes, the pull request opens
    )
    github.push_delay = DELAY
    result = run_loop(REPO, n)
    record = Store(redis).get(LoopId(REPO, n).key)
    assert record is not None and record.status == Status.COMPLETED, result
    events = [(e["kind"], e["data"]) for e in Store(redis).events(LoopId(REPO, n).key)]
    at = {(k, d.get("turn")): i for i, (k, d) in enumerate(events) if k != "step"}
    assert at[("turn_started", 2)] < at[("pushed", 1)] < at[("pr_opened", None)], events
    pushed = _events(redis, n, "pushed")
    assert [e["turn"] for e in pushed] == [1, 2]
    assert pushed[-1]["sha"] == record.head_sha == github.ref(REPO, BRANCH)
    runs = [r for r in github.repo(REPO).check_runs.values() if r["name"] == "loopbot"]
    assert sorted(r["head_sha"] for r in runs) == sorted(e["sha"] for e in pushed)
