"""One budget per issue over its whole life: dollars, tokens, turns and wall-clock hours.

The pure rules (bot/core/rules/loop/budget.py) first, then the check before a model call against the
local Anthropic server's token counter, then loops end to end with real workers: a
budget is checked before each call (a call that could cross it is never made), summed
across restarts, and its exhaustion ends the loop and asks a person.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import pytest
from redis import Redis

from bot.core import repo_config
from bot.core.pricing import price_of
from bot.core.record import LoopRecord, Status, Usage
from bot.core.rules.loop import budget
from bot.core.rules.loop.budget import Budget, Call, Spent
from bot.core.settings import Settings, load_settings
from bot.core.text import messages
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.web.app import create_app
from jobs import precall
from tests.conftest import Web
from tests.helpers import REPO, comment, label, open_issue, sample_repo

CEILINGS = repo_config.Ceilings(
    max_cost_usd=25.0, max_turns=50, max_hours=12.0, max_tokens=1_000_000, max_total_turns=100
)
LIMITS = Budget(usd=10.0, tokens=500_000, turns=40, hours=2.0, ceilings=CEILINGS)
# claude-test is no listed model, so it is priced as the most expensive one ($10 / $50 per
# million tokens, 10/3 of the Sonnet 4 prices these dollar limits were first set for).
PRICE_IN, PRICE_OUT = (p / 1e6 for p in price_of("claude-test"))


def _record(**fields: Any) -> LoopRecord:
    return LoopRecord(repo=REPO, issue=1, installation_id=1, **fields)


# -- the pure rules ------------------------------------------------------------------------------


def test_budget_from_loop_yml_within_the_ceilings() -> None:
    cfg, notes = repo_config.load(
        "verify: 'true'\nmax_cost_usd: 3\nlimits:\n  max_tokens: 5000000\n"
        "  max_total_turns: 7\n  max_hours: 0.5\n",
        CEILINGS,
    )
    assert notes == [
        "`limits.max_tokens`: 5000000 asked, lowered to 1000000 "
        "(the operator's ceiling, `LOOPBOT_MAX_TOKENS`)"
    ]
    b = Budget.of(cfg, CEILINGS)
    assert (b.usd, b.tokens, b.turns, b.hours) == (3.0, 1_000_000, 7, 0.5)
    # Unset limits are the operator's ceilings, not unlimited.
    unset = Budget.of(repo_config.load("verify: 'true'\n", CEILINGS)[0], CEILINGS)
    assert (unset.tokens, unset.turns, unset.hours) == (1_000_000, 100, 12.0)
    assert unset.limits() == {"dollars": 10.0, "tokens": 1_000_000, "turns": 100, "hours": 12.0}


def test_settings_carry_the_new_ceilings(env: dict[str, str]) -> None:
    s = Settings.model_validate(
        {**env, "LOOPBOT_MAX_TOKENS": "1234", "LOOPBOT_MAX_TOTAL_TURNS": "9"}
    )
    c = repo_config.Ceilings.of(s)
    assert (c.max_tokens, c.max_total_turns) == (1234, 9)


def test_spent_sums_every_role_and_counts_only_active_time() -> None:
    r = _record(status=Status.RUNNING, total_turns=3, active_seconds=100.0, updated_at=1000.0)
    r.record_usage("m", "agent", Usage(input_tokens=10, output_tokens=5, cost_usd=1.0))
    r.record_usage("m", "critic", Usage(cache_read_tokens=7, cache_write_tokens=3, cost_usd=0.5))
    s = Spent.of(r, now=1060.0)
    assert (s.usd, s.tokens, s.turns, s.seconds) == (1.5, 25, 3, 160.0)
    # A failed loop's clock is stopped: the time since its last write is not spent.
    failed = r.model_copy(update={"status": Status.FAILED})
    assert Spent.of(failed, now=999_999.0).seconds == 100.0


def test_next_call_must_fit_whole() -> None:
    call = budget.worst_call("claude-test", 10_000, 8192)
    assert call.tokens == 18_192
    assert call.usd == pytest.approx(10_000 * PRICE_IN * 1.25 + 8192 * PRICE_OUT)
    assert budget.before_call(LIMITS, Spent(usd=9.0), call) is None
    out = budget.before_call(LIMITS, Spent(usd=9.81), Call(tokens=1, usd=0.40))
    assert out is not None and out.budget == "dollars"
    assert out.detail.startswith(
        "dollar budget: $9.81 of $10.00 spent; the next call could cost up to $0.40."
    )
    assert "raise `max_cost_usd` in `.github/loop.yml` (up to $25.00" in out.detail
    tokens = budget.before_call(LIMITS, Spent(tokens=490_000), Call(tokens=10_001, usd=0.0))
    assert tokens is not None and tokens.budget == "tokens"
    assert "490,000 of 500,000 tokens used; the next call could use up to 10,001" in tokens.detail
    assert budget.before_call(LIMITS, Spent(tokens=490_000), Call(10_000, 0.0)) is None  # exact fit


def test_turns_and_hours_before_a_turn_and_a_call() -> None:
    assert budget.before_turn(LIMITS, Spent(turns=39)) is None
    out = budget.before_turn(LIMITS, Spent(turns=40))
    assert out is not None and out.budget == "turns" and "40 of 40 turns" in out.detail
    # Inside the 40th turn its own calls still fit; past the limit they do not.
    assert budget.before_call(LIMITS, Spent(turns=40), Call(1, 0.0)) is None
    hours = budget.before_call(LIMITS, Spent(turns=1, seconds=7200.0), Call(1, 0.0))
    assert hours is not None and hours.budget == "hours"
    assert hours.detail.startswith("wall-clock budget: 2 h of 2 h used.")
    assert "`limits.max_hours`" in hours.detail and "`LOOPBOT_MAX_WALL_HOURS`" in hours.detail


def test_a_turn_needs_room_for_its_smallest_call() -> None:
    smallest = budget.smallest_call("claude-test", 8192)
    assert smallest.usd == pytest.approx(2000 * PRICE_IN * 1.25 + 8192 * PRICE_OUT)
    assert budget.before_turn(LIMITS, Spent(usd=9.95)) is None  # something is left...
    out = budget.before_turn(LIMITS, Spent(usd=9.95), smallest)  # ...but no call fits it
    assert out is not None and out.budget == "dollars"


def test_at_the_ceiling_the_operator_must_raise_it() -> None:
    at_cap = Budget(usd=25.0, tokens=10, turns=5, hours=1.0, ceilings=CEILINGS)
    out = budget.before_turn(at_cap, Spent(usd=25.0))
    assert out is not None
    assert "already at the operator's ceiling ($25.00, `LOOPBOT_MAX_COST_USD`)" in out.detail


def test_restart_refusal_names_the_budget() -> None:
    r = _record(status=Status.FAILED, total_turns=40, cost_usd=1.0)
    why = budget.refusal(LIMITS, r)
    assert why.startswith("this loop has used its turn budget: 40 of 40 turns")
    assert "raise `limits.max_total_turns`" in why
    assert budget.refusal(LIMITS, r.model_copy(update={"total_turns": 2})) == ""


def test_budget_line_in_the_status_comment() -> None:
    r = _record(status=Status.FAILED, total_turns=4, active_seconds=1800.0)
    r.record_usage("m", "agent", Usage(input_tokens=1_200_000, output_tokens=30_000, cost_usd=4.2))
    assert budget.line(r) == ""  # the loop has not stored its limits yet
    r.budget_limits = LIMITS.limits() | {"tokens": 2_000_000}
    line = "budget: $4.20 of $10.00 · tokens 1.23M of 2M · turns 4 of 40 · time 30 min of 2 h"
    assert budget.line(r) == line
    assert line in messages.status_comment(r)
    assert budget.table(r)["dollars"] == {"spent": 4.2, "limit": 10.0}


def test_input_bounds() -> None:
    request = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "é" * 100}]}
    assert budget.input_bound(request) >= 200 + budget.HIDDEN_TOKENS  # two bytes per é
    assert budget.grown_bound(1000, [{"role": "user", "content": "abc"}]) > 1003


# -- the check before a call, against the local API's token counter --------------------------------


def test_precall_counts_near_the_edge_and_refuses_when_it_cannot(model: AnthropicServer) -> None:
    client = anthropic.Anthropic(api_key="sk-test", base_url=model.url, max_retries=0)
    request = {
        "model": "claude-test",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "word " * 20_000}],
    }
    bound = budget.input_bound(request)  # ~102k tokens: $1.28 at cache-write price
    counted = len(json.dumps({k: v for k, v in request.items() if k != "max_tokens"})) // 4
    limits = Budget(usd=0.60, tokens=10**9, turns=10, hours=1.0)
    assert budget.before_call(limits, Spent(), budget.worst_call("claude-test", bound, 1000))
    # The cheap bound does not fit; the exact count (~25k tokens, $0.36) does.
    assert counted < bound
    assert precall.check(client, request, limits, Spent()) is None
    # With $0.30 already spent the counted call does not fit either.
    out = precall.check(client, request, limits, Spent(usd=0.30))
    assert out is not None and out.budget == "dollars"
    # No counter to ask (the server is gone): the bound stands and nothing is sent.
    model.stop()
    assert precall.check(client, request, limits, Spent()) is not None
    assert model.requests == []


def test_a_lost_call_is_charged_its_worst_case_and_a_refused_one_is_retried(
    model: AnthropicServer, env: dict[str, str]
) -> None:
    """``precall.call``, the way triage, the planner and the critic call the model: a
    client built with the SDK's retries on (as the worker's is) still sends a timed-out
    request once, and charges it at the worst case it was judged by; a 429 is retried as
    its retry-after says and only the answer is charged."""
    settings = load_settings({**env, "LOOPBOT_MODEL_RETRIES": "3"}, role="worker")
    client = anthropic.Anthropic(api_key="sk-test", base_url=model.url, max_retries=4)
    request = {
        "model": "claude-test",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "judge this issue"}],
    }
    charged: list[tuple[str, Usage]] = []

    def charge(name: str, used: Usage) -> None:
        charged.append((name, used))

    model.responder = lambda body: m.text("too late", delay=1.0)
    with pytest.raises(anthropic.APITimeoutError):
        precall.call(client, request, record=None, settings=settings, charge=charge, timeout=0.3)
    assert len(model.requests) == 1  # not resent by the SDK
    worst = budget.worst_call("claude-test", budget.input_bound(request), 1000)
    ((name, used),) = charged
    assert name == "claude-test" and used.cost_usd == worst.usd and used.output_tokens == 1000

    charged.clear()
    model.responder = None
    model.play(
        m.Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "0"}),
        m.text("ready"),
    )
    resp, used = precall.call(client, request, record=None, settings=settings, charge=charge)
    assert resp.content[0].text == "ready" and len(model.requests) == 3
    assert charged == [(resp.model, used)] and used.cost_usd < worst.usd


def test_store_banks_active_time_only(redis: Redis) -> None:
    store = Store(redis)
    store.put(_record(status=Status.RUNNING))
    key = f"{REPO}#1"
    time.sleep(0.3)
    r = store.set_fields(key, phase="coding")
    assert 0.3 <= r.active_seconds < 5
    store.set_fields(key, status=Status.FAILED)  # banks the stretch up to the failure
    banked = store.get(key).active_seconds  # type: ignore[union-attr]
    time.sleep(0.3)
    store.set_fields(key, status=Status.QUEUED)  # a restart: the failed stretch is not spent
    assert store.get(key).active_seconds == banked  # type: ignore[union-attr]
    time.sleep(0.2)
    # Waiting in the queue for a worker is not spent either; running again is.
    store.set_fields(key, status=Status.RUNNING)
    assert store.get(key).active_seconds == banked  # type: ignore[union-attr]
    time.sleep(0.2)
    assert store.set_fields(key, phase="x").active_seconds >= banked + 0.2


# -- loops end to end ---------------------------------------------------------------------------

NO_REVIEW = """\
verify: python3 -m unittest -q
max_turns: {max_turns}
{extra}critic:
  enabled: false
merge:
  enabled: false
"""

EXPLORE = ["ls", "cat calc.py", "cat test_calc.py", "grep -n add calc.py", "wc -l calc.py"]


def _counted(body: dict[str, Any]) -> int:
    """The input tokens of ``body`` as the local server's count_tokens counts them."""
    return m.count_tokens(body)


def stubborn(body: dict[str, Any]) -> m.Reply:
    """A model that never stops exploring, writing to its output cap every time; its
    usage matches what the API's token counter says of the request."""
    n = sum(1 for msg in body["messages"] if msg["role"] == "assistant")
    usage = {"input_tokens": _counted(body), "output_tokens": body["max_tokens"]}
    return m.bash(EXPLORE[n % len(EXPLORE)] + f"  # look {n}", usage=usage)


def _start(github: GitHubServer, drain: Any, yml: str) -> int:
    sample_repo(github, loop_yml=yml)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def _status_comment(github: GitHubServer) -> str:
    return next(
        c["body"] for c in github.repo(REPO).comments.values() if "### loopbot" in c["body"]
    )


def _replies(github: GitHubServer) -> list[str]:
    return [c["body"] for c in github.repo(REPO).comments.values() if "loopbot:reply" in c["body"]]


def _set_loop_yml(github: GitHubServer, yml: str) -> None:
    gitrepo.seed(github.repo(REPO).path, "main", {".github/loop.yml": yml}, "loop.yml")


def _calls(record: LoopRecord) -> int:
    """The calls ``model.requests`` holds, as the record counts them: the readiness
    triage call is counted under its own role, and the local model keeps it apart too
    (``model.triage_requests``)."""
    return sum(u.messages for k, u in record.usage.items() if not k.endswith("/triage"))


def test_dollars_stop_before_the_call_that_would_cross(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    env: dict[str, str],
) -> None:
    model.responder = stubborn
    n = _start(github, drain, NO_REVIEW.format(max_turns=5, extra="max_cost_usd: 1.83\n"))
    store = Store(redis)
    r = store.get(f"{REPO}#{n}")
    assert r is not None
    assert (r.status, r.reason) == (Status.FAILED, "budget_exhausted"), r
    assert r.detail.startswith("dollar budget: ") and "raise `max_cost_usd`" in r.detail
    # Stopped inside the first turn, after several calls, and never past the budget.
    assert r.total_turns == 1 and len(model.requests) >= 3
    assert len(model.requests) == _calls(r)  # every call that was made is counted
    assert r.cost_usd <= 1.83
    # The call it refused would have crossed: this model writes to its cap every time.
    last_in = _counted(model.requests[-1])
    assert r.cost_usd + last_in * PRICE_IN + 8192 * PRICE_OUT > 1.83
    capped = [e["data"] for e in store.events(f"{REPO}#{n}") if e["kind"] == "turn_capped"]
    assert capped[-1]["reason"] == "budget_exhausted"
    # A person is asked, with the numbers, and the work so far is on the branch.
    assert "loop:needs-human" in github.repo(REPO).issues[n].labels
    body = _status_comment(github)
    assert f"budget: ${r.cost_usd:.2f} of $1.83 · tokens" in body and "turns 1 of 200" in body
    assert "dollar budget" in body
    # The dashboard's loop page shows the same numbers.
    app = create_app(
        load_settings({**env, "LOOPBOT_DASHBOARD_TOKEN": "t0ken"}, role="web"), redis
    ).test_client()
    shown = app.get(f"/api/loops/{REPO}/{n}", headers={"Authorization": "Bearer t0ken"}).json
    assert shown["budget_line"] == budget.line(r) and shown["budget_line"] in body
    assert shown["budget"]["dollars"] == {"spent": r.cost_usd, "limit": 1.83}
    assert shown["budget"]["turns"] == {"spent": 1, "limit": 200}
    # A restart does not refill it, and the model hears nothing more.
    comment(github, "writer", n, "/loop-restart")
    drain()
    assert any("Not restarted" in b and "dollar budget" in b for b in _replies(github))
    assert len(model.requests) == _calls(r)


def test_tokens_stop_before_the_call_that_would_cross(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.responder = stubborn
    yml = NO_REVIEW.format(max_turns=5, extra="limits:\n  max_tokens: 45000\n")
    n = _start(github, drain, yml)
    r = Store(redis).get(f"{REPO}#{n}")
    assert r is not None
    assert (r.status, r.reason) == (Status.FAILED, "budget_exhausted"), r
    assert r.detail.startswith("token budget: ") and "raise `limits.max_tokens`" in r.detail
    assert len(model.requests) >= 3 and len(model.requests) == _calls(r)
    assert r.cost_usd < 10.0  # dollars were never the limit
    used = budget.tokens_of(r)
    assert used <= 45_000
    assert used + _counted(model.requests[-1]) + 8192 > 45_000


FLIP = m.replace("calc.py", "return a - b", "return a * b")  # a wrong fix
FLOP = m.replace("calc.py", "return a * b", "return a // b")  # and another
FIX_FROM_FLOP = m.replace("calc.py", "return a // b", "return a + b")


def test_wall_clock_counts_every_run_across_a_restart(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # Run 1: a slow model makes a wrong fix; one turn is all the run may take.
    model.play(
        m.replace("calc.py", "return a - b", "return a * b", delay=3.0), m.text("Fixed add.")
    )
    n = _start(github, drain, NO_REVIEW.format(max_turns=1, extra="limits:\n  max_hours: 1\n"))
    store = Store(redis)
    first = store.get(f"{REPO}#{n}")
    assert first is not None and first.reason == "max_turns_reached", first
    run1 = first.active_seconds
    assert run1 >= 3.0
    time.sleep(1.5)  # failed: this time is not spent
    # Run 2 may have 2.5 s more than run 1 took: less than its own slow call needs.
    allowed = run1 + 2.5
    _set_loop_yml(
        github, NO_REVIEW.format(max_turns=3, extra=f"limits:\n  max_hours: {allowed / 3600}\n")
    )
    model.play(m.bash("cat calc.py", delay=4.0), FLOP, m.text("Fixed."))
    restarted = time.time()
    comment(github, "writer", n, "/loop-restart")
    drain()
    wall = time.time() - restarted
    r = store.get(f"{REPO}#{n}")
    assert r is not None
    assert (r.status, r.reason) == (Status.FAILED, "budget_exhausted"), r
    assert r.detail.startswith("wall-clock budget: ") and "`limits.max_hours`" in r.detail
    # Stopped before the call after the slow one: nothing asked of the model past it.
    assert len(model.requests) == 3 and len(model.script) == 2
    run2 = r.active_seconds - run1
    assert run2 >= 4.0
    assert run2 < allowed  # run 2 alone fits: only both runs together exhaust it
    assert run2 <= wall  # the 1.5 s it sat failed before the restart was not counted
    assert "loop:needs-human" in github.repo(REPO).issues[n].labels
    comment(github, "writer", n, "/loop-restart")
    drain()
    assert any("Not restarted" in b and "wall-clock budget" in b for b in _replies(github))
    assert len(model.requests) == 3


def test_turns_are_counted_over_the_issue_life(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # A flip-flopping model: two wrong fixes, each verified and failed.
    model.play(FLIP, m.text("Fixed."), FLOP, m.text("Now it is fixed."))
    yml = NO_REVIEW.format(max_turns=5, extra="limits:\n  max_total_turns: 2\n")
    n = _start(github, drain, yml)
    store = Store(redis)
    r = store.get(f"{REPO}#{n}")
    assert r is not None
    assert (r.status, r.reason, r.total_turns) == (Status.FAILED, "budget_exhausted", 2), r
    assert r.detail.startswith("turn budget: 2 of 2 turns")
    assert len(model.requests) == 4
    comment(github, "writer", n, "/loop-restart")
    drain()
    assert any("Not restarted" in b and "`limits.max_total_turns`" in b for b in _replies(github))
    assert len(model.requests) == 4
    # One more turn, asked for in loop.yml: the restart runs exactly that one.
    _set_loop_yml(github, NO_REVIEW.format(max_turns=5, extra="limits:\n  max_total_turns: 3\n"))
    model.play(FIX_FROM_FLOP, m.text("Fixed add for real."))
    comment(github, "writer", n, "/loop-restart")
    drain()
    r = store.get(f"{REPO}#{n}")
    assert r is not None
    assert (r.status, r.turn, r.total_turns) == (Status.COMPLETED, 1, 3), r


def test_the_critic_call_is_held_to_the_budget(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The agent fixes it in two calls that read a lot; the review would cross the budget.
    heavy = {"input_tokens": 20_000, "output_tokens": 500}
    model.play(
        m.replace("calc.py", "return a - b", "return a + b", usage=heavy),
        m.text("Fixed add to use +.", usage=heavy),
    )
    yml = "verify: python3 -m unittest -q\nmax_cost_usd: 0.78\n"
    n = _start(github, drain, yml)
    r = Store(redis).get(f"{REPO}#{n}")
    assert r is not None
    assert r.pr_number is not None  # the pull request was opened...
    assert (r.status, r.reason) == (Status.FAILED, "budget_exhausted"), r
    assert r.detail.startswith("dollar budget: ")
    assert len(model.requests) == 2  # ...and the critic never called the model
    assert r.cost_usd <= 0.78
    assert "loop:needs-human" in github.repo(REPO).issues[n].labels


@pytest.mark.parametrize(
    "env_extra", [{"LOOPBOT_STALL_TIMEOUT": "0.3", "LOOPBOT_MODEL_RETRIES": "2"}]
)
def test_calls_that_time_out_are_charged_and_cannot_spend_past_the_budget(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Every call stalls past the client's timeout. Each may have reached the API and been
    billed in full, so each is charged at the worst case its pre-check allowed, and the
    pre-check of the next refuses it once that would cross: what the API could have
    billed for every request it received stays within the budget."""
    model.responder = lambda body: m.text("too late", delay=1.0)
    n = _start(github, drain, NO_REVIEW.format(max_turns=5, extra="max_cost_usd: 1.2\n"))
    r = Store(redis).get(f"{REPO}#{n}")
    assert r is not None
    assert (r.status, r.reason) == (Status.FAILED, "budget_exhausted"), r
    # One request per attempt: the SDK does not retry a timeout behind the pre-check.
    agent_calls = [b for b in model.requests if b.get("tools")]
    could_bill = sum(
        budget.worst_call(b["model"], budget.input_bound(b), b["max_tokens"]).usd
        for b in agent_calls
    )
    assert 1 <= len(agent_calls) < 5  # stopped by the budget, not by five stalls
    assert could_bill <= 1.2
    assert r.cost_usd >= could_bill * 0.999  # charged for all of it
    assert r.cost_usd <= 1.2
    steps = [e["data"]["tool"] for e in Store(redis).events(f"{REPO}#{n}") if e["kind"] == "step"]
    assert steps[0] == "stall 1: APITimeoutError"
