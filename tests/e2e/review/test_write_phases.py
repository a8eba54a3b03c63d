"""Which phase of which job made each GitHub write (issue 43: count first, so each write
is justified or cut): two loops of one repository, the second catching up with the
first's merge, counted by ``bot/io/github/tally.py`` as the worker ran them."""

from __future__ import annotations

from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.github import tally
from bot.io.store import Store
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.review.test_same_change import start_two
from tests.helpers import REPO


def _writes(redis: Redis) -> dict[tuple[str, str, str], int]:
    """(job, phase, route) -> writes."""
    return {
        (c.job, c.phase, c.what): n for c, n in tally.by_phase(redis).items() if c.kind == "write"
    }


def test_every_write_of_a_loop_names_the_phase_that_made_it(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    issues = list(start_two(github, model))
    drain(rounds=30)
    store = Store(redis)
    records = [store.get(f"{REPO}#{n}") for n in issues]
    assert all(
        r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged") for r in records
    )
    carried = [
        n for n in issues if any(e["kind"] == "review_carried" for e in store.events(f"{REPO}#{n}"))
    ]
    assert len(carried) == 1, "the second loop caught up with the first's merge, cleanly"

    writes = _writes(redis)
    # Every write of a loop's jobs is counted in a phase of its job.
    unnamed = {k: n for k, n in writes.items() if k[0] in {"loop", "critic", "gate"} and not k[1]}
    assert not unnamed, unnamed
    routes: dict[str, set[tuple[str, str]]] = {}
    for (job, phase, what), _ in writes.items():
        routes.setdefault(what, set()).add((job, phase))
    assert routes["POST /pulls"] == {("loop", "pull_request")}
    assert routes["POST /pulls/N/reviews"] == {("critic", "review")}
    assert routes["PUT /pulls/N/merge"] == {("gate", "merge")}
    # The merged branches go by git push (jobs/tree/remote_branch.py): no REST write.
    assert "DELETE /git/refs/heads/{branch}" not in routes
    assert all(github.ref(REPO, f"loop/issue-{n}") is None for n in issues)
    # The status comment is made in the loop's first seconds, held for what comes next
    # (here the whole loop, which takes less than the hold: the pull request's edit
    # makes it); its last edit (the receipt) is the tidy-up's.
    made = {("loop", "start"), ("loop", "turn"), ("loop", "pull_request")}
    assert routes["POST /issues/N/comments"] <= made
    assert ("gate", "tidy") in routes["PATCH /issues/comments/N"]
    # The catch-up's one write is the critic's check run saying the approval carried and
    # verify passed on the merged head (no review; the loop's own run left to it).
    assert ("loop", "catch_up", "POST /check-runs") not in writes
    assert writes[("critic", "carried", "POST /check-runs")] == 1
    # What the gate reads before it decides writes nothing.
    assert not [k for k in writes if k[:2] == ("gate", "facts")], writes
    # Counted by job as before too: the phases add up to the totals.
    total = {k: n for k, n in tally.counts(redis).items() if k[1] == "write"}
    assert sum(total.values()) == sum(writes.values())


def test_counts_written_before_phases_read_as_no_phase(redis: Redis) -> None:
    """An upgrade keeps the counts of the release before (no phase in the field)."""
    redis.hset(tally.KEY, "loop|write|POST /pulls", 3)
    redis.hset(tally.KEY, "loop|write|POST /pulls|pull_request", 2)
    got = tally.by_phase(redis)
    assert got[tally.Count("loop", "", "write", "POST /pulls")] == 3
    assert got[tally.Count("loop", "pull_request", "write", "POST /pulls")] == 2
    assert tally.counts(redis)[("loop", "write", "POST /pulls")] == 5
