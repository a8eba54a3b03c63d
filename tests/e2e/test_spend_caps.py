"""Spend caps above the loop (bot/core/spend/caps.py, jobs/spend.py): read against what the
local model server billed, not against loopbot's own count."""

from __future__ import annotations

import json
import multiprocessing
import time
from typing import Any

import pytest
from click.testing import CliRunner
from redis import Redis

from bot.core.record import LoopRecord, Reason, Status, Usage
from bot.core.rules.lifecycle import SPEND_HELD
from bot.core.rules.loop import budget
from bot.core.settings import Settings
from bot.core.spend.caps import MICRO, Period, Scope, caps_for, counter
from bot.io.store import Store
from bot.ops.cli import main
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs import precall, reconciler
from jobs.agents.claude_code import cli_path
from jobs.runtime import Runtime
from jobs.spend import OverCap, SpendGate
from tests.conftest import Web
from tests.helpers import REPO, comment, label, open_issue, sample_repo

# A cheap model, so that a cap of a few cents admits some calls: each call's worst case
# (bot.core.rules.loop.budget.worst_call: 8,192 output tokens at $5/M, the input as cache
# writes) is about five cents.
MODEL = "claude-haiku-4-5"
CAP = 0.07


@pytest.fixture
def env_extra() -> dict[str, str]:
    return {"LOOPBOT_MODEL": MODEL, "LOOPBOT_CRITIC_MODEL": MODEL}


def _yml(day_usd: float) -> str:
    return (
        "verify: python3 -m unittest -q\nmax_turns: 5\nmax_parallel: 1\n"
        f"spend:\n  day_usd: {day_usd}\n"
        "triage:\n  enabled: false\ncritic:\n  enabled: false\nmerge:\n  enabled: false\n"
    )


def _record(redis: Redis, n: int) -> LoopRecord:
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    return record


def _comments(github: GitHubServer, n: int) -> str:
    return "\n".join(c["body"] for c in github.repo(REPO).comments.values() if c.get("_issue") == n)


def test_a_daily_cap_stops_one_loop_holds_the_next_and_a_restart_finishes_it(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    env: dict[str, str],
) -> None:
    sample_repo(github, loop_yml=_yml(CAP))
    # The first loop fixes the bug in two calls; the second never does, and calls on
    # until the cap refuses it; the third then finds no room.
    model.play(m.replace("calc.py", "return a - b", "return a + b"), m.text("Fixed."))
    notes = iter(range(1000))  # a new file each call: never a doom loop, never idle
    model.responder = lambda body: m.write_file(f"note{next(notes)}.txt", "more\n")
    first, second, third = (open_issue(github, title=f"add() subtracts ({i})") for i in range(3))
    for n in (first, second, third):
        label(github, "writer", n)
    drain(30)

    billed = model.billed_usd()
    assert 0 < billed <= CAP, billed  # the model server's own figure, never past the cap
    a, b, c = (_record(redis, n) for n in (first, second, third))
    assert a.status is Status.COMPLETED, (a.status, a.reason, a.detail)
    assert b.status is Status.FAILED and b.reason == Reason.BUDGET.value, b
    assert "the repository's daily spend cap ($0.07" in b.detail
    assert "`spend.day_usd` in `.github/loop.yml`" in b.detail
    assert b.cost_usd > 0  # it worked, and its work stays: branch and conversation
    assert Store(redis).conversation(b.key)
    # The third never started spending: it waits, queued, saying which cap holds it.
    assert c.status is Status.QUEUED and c.phase == SPEND_HELD, c
    assert c.cost_usd == 0 and "Waiting to start" in c.detail and "daily spend cap" in c.detail
    assert "daily spend cap" in _comments(github, third)
    listed = CliRunner().invoke(main, ["status", "--json"], env={"REDIS_URL": env["REDIS_URL"]})
    (row,) = [r for r in json.loads(listed.output) if r["issue"] == third]
    assert "daily spend cap" in row["waiting_for"]  # under its row in `loopbot status`
    assert "daily spend cap" in _comments(github, second)
    # loopbot's count agrees with the bill, and is within the cap too.
    repo_day = caps_for({k: 100.0 for k in _keys()}, CAP)[0]
    day = counter(repo_day, REPO, a.installation_id, time.time())
    counted = int(redis.get(f"loopbot:spend:{day}") or 0) / MICRO
    assert counted == pytest.approx(billed, abs=1e-6)

    # The writer raises the repository's own cap; a restart finishes the held loop.
    github.push_files(REPO, "main", {".github/loop.yml": _yml(1.0)}, "more room", "writer")
    model.responder = None
    model.play(m.replace("calc.py", "return a - b", "return a + b"), m.text("Fixed."))
    comment(github, "writer", third, "/loop-restart")
    drain(30)
    c = _record(redis, third)
    assert c.status is Status.COMPLETED, (c.status, c.reason, c.detail)
    assert c.cost_usd > 0


def _keys() -> list[tuple[Scope, Period]]:
    return [(s, p) for s in Scope for p in Period]


# -- two workers at once ------------------------------------------------------------------------

RACE_CAP = 0.5


def _charge_until_refused(settings: Settings, redis_url: str, out: Any, start: Any) -> None:
    """One worker: calls through the spend gate until a cap refuses it."""
    rt = Runtime(settings, Redis.from_url(redis_url))
    record = LoopRecord(repo=REPO, issue=1, installation_id=7)
    gate = SpendGate(
        SpendGate.of(rt.redis, settings, record, None).meter,
        caps_for(settings.spend_caps(), RACE_CAP),
        repo=REPO,
        installation_id=7,
        backend="builtin",
    )
    rt.model.models  # noqa: B018 - the client built before the race, not in it
    start.wait(timeout=60)  # both workers ready: they charge at the same time
    calls = 0
    request = {"model": MODEL, "max_tokens": 8192, "messages": [{"role": "user", "content": "hi"}]}
    try:
        while True:
            precall.call(rt.model, request, record=None, settings=settings, charge=_no, spend=gate)
            calls += 1
    except OverCap as exc:
        out.put((calls, str(exc)))
    except Exception as exc:  # noqa: BLE001 - said to the test, which fails on it
        out.put((-1, f"{type(exc).__name__}: {exc}"))


def _no(model: str, used: Usage) -> None:
    pass


def test_two_workers_charging_one_repository_never_cross_its_cap(
    settings: Settings, model: AnthropicServer, redis: Redis, env: dict[str, str]
) -> None:
    """The bound: none. Each call's worst case is reserved under the cap atomically before
    it is sent, and a call is never billed past its worst case, so the billed total stays
    within the cap however the two workers interleave (the issue asked for at most one
    call's worst case over it)."""
    # Long answers, so that each call costs a good share of its worst case.
    model.responder = lambda body: m.text("word " * 3000)
    # Spawned, not forked: a fork copies whatever lock a thread of this process (a local
    # server's) holds at that moment, the import lock among them.
    ctx = multiprocessing.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(2)
    url = env["REDIS_URL"]
    procs = [
        ctx.Process(target=_charge_until_refused, args=(settings, url, out, start)) for _ in "ab"
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    calls = sum(n for n, _ in results)
    assert all(n > 0 for n, _ in results), results  # both really charged the repository
    worst = budget.worst_call(MODEL, budget.input_bound({"model": MODEL}) + 100, 8192).usd
    billed = model.billed_usd()
    assert len(model.responses) == calls
    assert billed <= RACE_CAP, (billed, calls)
    # And the cap was used, not left idle: it stopped only for want of one call's room.
    assert billed > RACE_CAP - 2 * worst, (billed, worst)
    assert all("daily spend cap ($0.50" in why for _, why in results)
    # Every reservation settled or given back: the counters hold what was billed, the
    # repository's and its installation's alike.
    caps = caps_for(settings.spend_caps(), RACE_CAP)
    now = time.time()
    for cap in caps:
        counted = int(redis.get(f"loopbot:spend:{counter(cap, REPO, 7, now)}") or 0) / MICRO
        assert counted == pytest.approx(billed, abs=1e-5), cap


# -- a new period --------------------------------------------------------------------------------


@pytest.mark.parametrize("env_extra", [{"LOOPBOT_MODEL": MODEL, "LOOPBOT_CRITIC_MODEL": MODEL}])
def test_held_loops_wait_for_room_and_resume_by_themselves_only_when_the_operator_says(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    rt: Runtime,
    env: dict[str, str],
) -> None:
    """A cap already spent: a new loop waits, queued, before any call. The reconciler's
    spend step leaves it while the operator has not asked for resumes on rollover, and
    while there is no room; on a new day's empty counter it restarts it, and it finishes."""
    sample_repo(github, loop_yml=_yml(CAP))
    n = open_issue(github)
    repo_day = caps_for(rt.settings.spend_caps(), CAP)[0]
    today = f"loopbot:spend:{counter(repo_day, REPO, 0, time.time())}"
    redis.set(today, round((CAP - 0.01) * MICRO))  # spent earlier today, by other loops
    label(github, "writer", n)
    drain()
    held = _record(redis, n)
    assert held.status is Status.QUEUED and held.phase == SPEND_HELD, held
    assert model.requests == [] and held.spend_need_usd > 0.01
    assert "daily spend cap" in held.detail

    assert reconciler.resume_spend(rt, time.time()) == []  # the operator did not ask
    on = Runtime(
        Settings.model_validate({**env, "LOOPBOT_SPEND_RESUME_ON_ROLLOVER": "true"}), redis
    )
    assert reconciler.resume_spend(on, time.time()) == []  # and there is no room yet
    assert _record(redis, n).phase == SPEND_HELD

    redis.delete(today)  # midnight, UTC: today's counter starts from nothing
    model.play(m.replace("calc.py", "return a - b", "return a + b"), m.text("Fixed."))
    assert reconciler.resume_spend(on, time.time()) == [f"{REPO}#{n}"]
    drain()
    done = _record(redis, n)
    assert done.status is Status.COMPLETED, (done.status, done.reason, done.detail)
    assert any(e["kind"] == "spend_resumed" for e in Store(redis).events(done.key))


# -- through the model gateway ------------------------------------------------------------------

CC_CAP = 0.6  # Claude Code's requests are large: each call's worst case is some $0.5


@pytest.mark.skipif(cli_path() is None, reason="Claude Code is not installed")
@pytest.mark.parametrize(
    "env_extra",
    [{"LOOPBOT_AGENT_BACKENDS": "builtin,claude-code", "LOOPBOT_MODEL": "claude-sonnet-4-6"}],
)
def test_a_cap_stops_claude_code_at_the_gateway(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    yml = _yml(CC_CAP) + "agent:\n  backend: claude-code\n"
    sample_repo(github, loop_yml=yml)
    notes = iter(range(1000))
    model.responder = lambda body: m.cc_write(f"note{next(notes)}.txt", "more\n")
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = _record(redis, n)
    assert r.status is Status.FAILED and r.reason == Reason.BUDGET.value, (r.reason, r.detail)
    assert r.detail.startswith("the repository's daily spend cap ($0.60"), r.detail
    assert "issue's budget" not in r.detail  # the loop's own budget had room
    assert len(model.responses) >= 1 and 0 < model.billed_usd() <= CC_CAP
    assert r.cost_usd == pytest.approx(model.billed_usd(), abs=1e-6)
