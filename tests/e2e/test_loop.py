"""The loop job end to end: real RQ worker, real git, real sandbox, local GitHub and model."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import CALC, REPO, comment, label, open_issue, sample_repo

NO_REVIEW = """\
verify: python3 -m unittest -q
max_turns: {max_turns}
{extra}critic:
  enabled: false
merge:
  enabled: false
"""


def config(max_turns: int = 3, extra: str = "") -> str:
    return NO_REVIEW.format(max_turns=max_turns, extra=extra)


FIX = m.replace("calc.py", "return a - b", "return a + b")


def start(github: GitHubServer, drain: Any, yml: str | None = None) -> int:
    sample_repo(github, loop_yml=yml or config())
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def user_texts(request: dict[str, Any]) -> str:
    last = request["messages"][-1]
    content = last["content"]
    return (
        "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
        if isinstance(content, list)
        else content
    )


def bot_comments(github: GitHubServer) -> list[dict[str, Any]]:
    return [c for c in github.repo(REPO).comments.values() if c["user"]["type"] == "Bot"]


def test_fails_then_passes_opens_one_pr(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.bash("cat calc.py"),
        m.text("I read the code; it looks fine."),  # turn 1: no fix
        FIX,
        m.text("Fixed add to use +."),  # turn 2
    )
    n = start(github, drain)
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    assert record.status == Status.COMPLETED and record.turn == 2, record
    assert record.pr_number is not None
    pr = github.repo(REPO).pulls[record.pr_number]
    body = github.repo(REPO).issues[record.pr_number].body
    assert f"Closes #{n}" in body and "Fixed add" in body
    assert github.file_at(REPO, "loop/issue-1", "calc.py") == CALC.replace("a - b", "a + b")
    assert pr.head == "loop/issue-1"
    # Turn 2 starts with a continuation prompt naming the failure, not the issue body.
    turn2 = model.requests[2]
    prompt = user_texts(turn2)
    assert "verify failed" in prompt and "FAIL" in prompt
    assert "add(2, 3) should be 5" not in prompt
    assert turn2["messages"][0]["content"][0]["text"].startswith("Resolve issue #1")
    # One status comment, edited; a successful check run on the head.
    comments = bot_comments(github)
    assert len(comments) == 1 and "completed" in comments[0]["body"]
    runs = [r for r in github.repo(REPO).check_runs.values() if r["name"] == "loopbot"]
    assert len(runs) >= 1 and runs[-1]["conclusion"] == "success"
    events = [e["kind"] for e in Store(redis).events(f"{REPO}#{n}")]
    assert events.count("turn_started") == 2 and events.count("turn_completed") == 2
    assert Store(redis).counter("turns") == 2  # loopbot_turns_total, which never drops
    # Commits by the harness, one per turn that changed something.
    log = github.repo(REPO).path
    from bot.standins.gitrepo import git

    subjects = git(log, "log", "--format=%s", "loop/issue-1").splitlines()
    assert subjects[0].startswith("loop(turn-2): Fixed add")


def test_verify_passes_on_turn_one_no_second_turn(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed."))
    n = start(github, drain)
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None and record.status == Status.COMPLETED and record.turn == 1
    assert len(model.requests) == 2


def test_max_turns_reached(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The agent changes something every turn (a turn that changes nothing stops the loop
    # sooner, for no_changes: tests/e2e/test_evidence.py), but never what fixes verify.
    def flail(body: dict[str, Any]) -> m.Item:
        if "tool_result" in json.dumps(body["messages"][-1]):
            return m.text("I give up")
        return m.write_file(f"attempt{len(model.requests)}.txt", "x\n")

    model.responder = flail
    n = start(github, drain)
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    assert (record.status, record.reason, record.turn) == (Status.FAILED, "max_turns_reached", 3)
    assert len(model.requests) == 6
    assert "max_turns_reached" in bot_comments(github)[0]["body"]


def test_issue_closed_between_turns_stops_without_model_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def close_then_answer(body: dict[str, Any]) -> m.Item:
        # The maintainer closes the issue while turn 1 runs.
        with github.as_user("writer") as u:
            u.patch(f"/repos/{REPO}/issues/1", json={"state": "closed"})
        return m.text("done")

    model.responder = close_then_answer
    n = start(github, drain)
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    assert record.status == Status.CANCELLED and record.reason == "issue_inactive"
    assert len(model.requests) == 1  # no second model call after the close


def test_step_cap_tool_budget_doom_loop_and_cost_cap(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # Doom loop: the same call three times ends the turn, with its reason recorded.
    model.play(m.bash("ls"), m.bash("ls"), m.bash("ls"), FIX, m.text("ok"))
    n = start(github, drain, config(extra="max_steps: 10\ntool_budget: 50\n"))
    capped = [e["data"] for e in Store(redis).events(f"{REPO}#{n}") if e["kind"] == "turn_capped"]
    assert capped[0]["reason"] == "doom_loop"
    # The tool_use blocks of the cut turn were answered, so the conversation stays valid.
    conv = Store(redis).conversation(f"{REPO}#{n}")
    for i, msg in enumerate(conv):
        if msg["role"] == "assistant":
            uses = [b["id"] for b in msg["content"] if b.get("type") == "tool_use"]
            if uses:
                answered = [
                    b["tool_use_id"]
                    for b in conv[i + 1]["content"]
                    if b.get("type") == "tool_result"
                ]
                assert answered == uses


def test_step_cap(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.bash("ls"), m.bash("pwd"), FIX, m.text("ok"))
    n = start(github, drain, config(extra="max_steps: 2\n"))
    capped = [e["data"] for e in Store(redis).events(f"{REPO}#{n}") if e["kind"] == "turn_capped"]
    assert capped[0]["reason"] == "step_cap"
    assert Store(redis).get(f"{REPO}#{n}").status == Status.COMPLETED  # type: ignore[union-attr]


def test_tool_budget(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.bash("ls"), m.bash("pwd"), m.bash("id"), FIX, m.text("ok"))
    n = start(github, drain, config(extra="tool_budget: 2\n"))
    capped = [e["data"] for e in Store(redis).events(f"{REPO}#{n}") if e["kind"] == "turn_capped"]
    assert capped[0]["reason"] == "tool_budget"


def test_cost_cap(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    expensive = {"input_tokens": 1_000_000, "output_tokens": 10}
    model.play(m.bash("ls", usage=expensive), m.bash("pwd", usage=expensive))
    n = start(github, drain, config(extra="max_cost_usd: 2.5\n"))
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    assert (record.status, record.reason) == (Status.FAILED, "budget_exhausted")
    assert record.cost_usd >= 2.5
    assert len(model.requests) == 1  # the cap is checked before every step
    # A restart does not refill the budget: it says so, and no model call is made.
    comment(github, "writer", n, "/loop-restart")
    drain()
    replies = [
        c["body"] for c in github.repo(REPO).comments.values() if "loopbot:reply" in c["body"]
    ]
    assert any("Not restarted" in b and "raise `max_cost_usd`" in b for b in replies), replies
    assert len(model.requests) == 1
    assert Store(redis).get(f"{REPO}#{n}").status == Status.FAILED  # type: ignore[union-attr]


def test_text_only_when_max_steps_zero(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.responder = lambda body: m.text("just talking")
    start(github, drain, config(max_turns=1, extra="max_steps: 0\n"))
    assert all("tools" not in r for r in model.requests)


def test_job_run_twice_gives_one_pr_and_one_status_comment(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any, rt: Any
) -> None:
    model.play(FIX, m.text("Fixed."))
    n = start(github, drain)
    from jobs.loop import run_loop

    assert "nothing to run" in run_loop(REPO, n)
    # Force it to run again as if redelivered after a crash: still one PR, one comment.
    Store(redis).update(f"{REPO}#{n}", lambda r: setattr(r, "status", Status.QUEUED))
    model.play(m.text("Nothing more to do."))
    run_loop(REPO, n)
    assert len(github.repo(REPO).pulls) == 1
    assert len(bot_comments(github)) == 1


def test_usage_and_cache_control_are_recorded(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    usage = {
        "input_tokens": 1000,
        "output_tokens": 100,
        "cache_creation_input_tokens": 2000,
        "cache_read_input_tokens": 5000,
    }
    model.play(
        m.replace("calc.py", "return a - b", "return a + b", usage=usage),
        m.text("Fixed.", usage=usage),
    )
    n = start(github, drain)
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    u = record.usage["claude-test/agent"]
    assert (
        u.input_tokens,
        u.output_tokens,
        u.cache_write_tokens,
        u.cache_read_tokens,
        u.messages,
    ) == (2000, 200, 4000, 10000, 2)
    # Sonnet-priced: 2000*3 + 200*15 + 4000*3.75 + 10000*0.3 = 27000 per million.
    assert abs(record.cost_usd - 0.027) < 1e-9
    req = model.requests[1]
    assert req["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert req["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert {t["type"] for t in req["tools"]} == {"bash_20250124", "text_editor_20250728"}
    assert "sk-ant-local-test" not in json.dumps(model.requests)
