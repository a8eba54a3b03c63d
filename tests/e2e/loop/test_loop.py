"""The loop job end to end: real RQ worker, real git, real sandbox, local GitHub and model."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from redis import Redis
from rq.registry import FinishedJobRegistry

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Status
from bot.io.queues import CONTROL_QUEUE, LOOP_QUEUE, fetch_job
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.gitrepo import git
from jobs.loop.job import run_loop
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

BRANCH = "loop/issue-1"
# The events that mark a loop's life (not each step of it).
LIFECYCLE = ("loop_created", "loop_cancelled", "loop_restarted", "turn_started", "loop_finished")
NOT_RUN = "not run: the turn ended ({})"  # what the agent answers a tool call it cut


def config(max_turns: int = 3, extra: str = "") -> str:
    return NO_REVIEW.format(max_turns=max_turns, extra=extra)


FIX = m.replace("calc.py", "return a - b", "return a + b")


def start(github: GitHubServer, drain: Any, yml: str | None = None) -> int:
    sample_repo(github, loop_yml=yml or config())
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def key(n: int) -> str:
    return LoopId(REPO, n).key


def record_of(redis: Redis, n: int) -> LoopRecord:
    record = Store(redis).get(key(n))
    assert record is not None, f"no loop record for {key(n)}"
    return record


def events(redis: Redis, n: int, kind: str) -> list[dict[str, Any]]:
    """The data of the loop's events of ``kind``, oldest first."""
    return [e["data"] for e in Store(redis).events(key(n)) if e["kind"] == kind]


def user_texts(request: dict[str, Any]) -> str:
    last = request["messages"][-1]
    content = last["content"]
    return (
        "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
        if isinstance(content, list)
        else content
    )


def turn_prompt(request: dict[str, Any]) -> str:
    """The prompt that opened a turn: the text after the last step's tool results."""
    return user_texts(request).strip()


def opening(request: dict[str, Any]) -> str:
    """The first prompt of the conversation ``request`` continues."""
    return str(request["messages"][0]["content"][0]["text"])


def tool_results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results ``request`` sent back: the answers to the previous step's calls."""
    content = request["messages"][-1]["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def bot_comments(github: GitHubServer) -> list[dict[str, Any]]:
    return [c for c in github.repo(REPO).comments.values() if c["user"]["type"] == "Bot"]


def status_comment(github: GitHubServer) -> dict[str, Any]:
    (status,) = [c for c in bot_comments(github) if "<!-- loopbot:status -->" in c["body"]]
    return status


def triage_cost(record: LoopRecord) -> float:
    """What the readiness triage call before the first turn cost (counted in the total)."""
    return sum(u.cost_usd for k, u in record.usage.items() if k.endswith("/triage"))


def assert_turn_one(redis: Redis, n: int, *, end: str, steps: int, tool_calls: int) -> None:
    """Turn 1 ended ``end`` after ``steps`` model calls and ``tool_calls`` commands run,
    and was verified like any turn (verify fails: calc.py is not fixed yet)."""
    first = events(redis, n, "turn_completed")[0]
    assert (first["turn"], first["end"], first["steps"], first["tool_calls"]) == (
        1,
        end,
        steps,
        tool_calls,
    )
    assert [v["passed"] for v in events(redis, n, "verify") if v["turn"] == 1] == [False]


def assert_fixed_in_turn_two(github: GitHubServer, redis: Redis, n: int) -> None:
    """Turn 2 fixed calc.py: the loop completed with one pull request, nothing after it."""
    record = record_of(redis, n)
    assert (record.status, record.reason, record.turn) == (Status.COMPLETED, "pr_opened", 2)
    assert [c["turn"] for c in events(redis, n, "turn_completed")] == [1, 2]
    assert len(github.repo(REPO).pulls) == 1
    assert github.file_at(REPO, BRANCH, "calc.py") == CALC.replace("a - b", "a + b")
    assert len(bot_comments(github)) == 1


def assert_every_tool_use_answered(conversation: list[dict[str, Any]]) -> None:
    """Each assistant message's tool_use blocks are answered, in order, by the next
    message's tool_result blocks: the Messages API refuses a conversation otherwise."""
    for i, msg in enumerate(conversation):
        uses = [
            b["id"]
            for b in msg["content"]
            if msg["role"] == "assistant" and b.get("type") == "tool_use"
        ]
        if uses:
            answered = [
                b["tool_use_id"]
                for b in conversation[i + 1]["content"]
                if b.get("type") == "tool_result"
            ]
            assert answered == uses, (i, msg)


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
    record = Store(redis).get(key(n))
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
    events = [e["kind"] for e in Store(redis).events(key(n))]
    assert events.count("turn_started") == 2 and events.count("turn_completed") == 2
    assert Store(redis).counter("turns") == 2  # loopbot_turns_total, which never drops
    # Commits by the harness, one per turn that changed something.
    log = github.repo(REPO).path
    subjects = git(log, "log", "--format=%s", "loop/issue-1").splitlines()
    assert subjects[0].startswith("loop(turn-2): Fixed add")


def test_verify_passes_on_turn_one_no_second_turn(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed."))
    n = start(github, drain)
    record = Store(redis).get(key(n))
    assert record is not None and record.status == Status.COMPLETED and record.turn == 1
    assert len(model.requests) == 2


def test_max_turns_reached(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The agent changes something every turn (a turn that changes nothing stops the loop
    # sooner, for no_changes: tests/e2e/loop/test_evidence.py), but never what fixes verify.
    def flail(body: dict[str, Any]) -> m.Item:
        if "tool_result" in json.dumps(body["messages"][-1]):
            return m.text("I give up")
        return m.write_file(f"attempt{len(model.requests)}.txt", "x\n")

    model.responder = flail
    n = start(github, drain)
    record = Store(redis).get(key(n))
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
    record = Store(redis).get(key(n))
    assert record is not None
    assert record.status == Status.CANCELLED and record.reason == "issue_inactive"
    assert len(model.requests) == 1  # no second model call after the close


# -- a turn cut short: each limit stops the turn, says why, and runs nothing past it -------------
#
# Turn 1 appends to ran.txt (so it changes the tree: a turn that changes nothing gets the
# no-change prompt instead) until its limit cuts it; turn 2 fixes calc.py. ran.txt on the
# branch shows which of turn 1's commands ran.


def test_step_cap_ends_the_turn_without_another_model_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(m.bash("echo 1 >> ran.txt"), m.bash("echo 2 >> ran.txt"), FIX, m.text("Fixed."))
    n = start(github, drain, config(extra="max_steps: 2\n"))
    assert events(redis, n, "turn_capped") == [
        {"turn": 1, "reason": "step_cap", "detail": "2 steps"}
    ]
    assert_turn_one(redis, n, end="step_cap", steps=2, tool_calls=2)
    # Both steps' commands ran; the third model call was never made (2 + 2 requests).
    assert github.file_at(REPO, BRANCH, "ran.txt") == "1\n2\n"
    assert len(model.requests) == 4 and all("tools" in r for r in model.requests)
    assert [r["is_error"] for r in tool_results(model.requests[2])] == [False]
    assert turn_prompt(model.requests[2]).startswith(
        "Turn 2. You reached the step limit for one turn. verify failed:"
    )
    assert_fixed_in_turn_two(github, redis, n)


def test_tool_budget_answers_the_call_past_it_without_running_it(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.bash("echo 1 >> ran.txt"),
        m.bash("echo 2 >> ran.txt"),
        m.bash("echo 3 >> ran.txt"),  # the third tool call: over the budget of 2
        FIX,
        m.text("Fixed."),
    )
    n = start(github, drain, config(extra="tool_budget: 2\n"))
    assert events(redis, n, "turn_capped") == [
        {"turn": 1, "reason": "tool_budget", "detail": "2 tool calls"}
    ]
    assert_turn_one(redis, n, end="tool_budget", steps=3, tool_calls=2)
    assert github.file_at(REPO, BRANCH, "ran.txt") == "1\n2\n"
    assert len(model.requests) == 5
    # The call over the budget is answered (the conversation stays valid), not run.
    assert [(r["content"], r["is_error"]) for r in tool_results(model.requests[3])] == [
        (NOT_RUN.format("tool_budget"), True)
    ]
    assert turn_prompt(model.requests[3]).startswith(
        "Turn 2. You used the whole tool-call budget for one turn. verify failed:"
    )
    assert_fixed_in_turn_two(github, redis, n)


def test_doom_loop_ends_the_turn_on_the_third_identical_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    same = "echo x >> ran.txt"
    model.play(m.bash(same), m.bash(same), m.bash(same), FIX, m.text("Fixed."))
    n = start(github, drain, config(extra="max_steps: 10\ntool_budget: 50\n"))
    assert events(redis, n, "turn_capped") == [
        {"turn": 1, "reason": "doom_loop", "detail": "bash called 3 times with the same input"}
    ]
    assert_turn_one(redis, n, end="doom_loop", steps=3, tool_calls=2)
    assert github.file_at(REPO, BRANCH, "ran.txt") == "x\nx\n"  # the third never ran
    assert len(model.requests) == 5
    assert [(r["content"], r["is_error"]) for r in tool_results(model.requests[3])] == [
        (NOT_RUN.format("doom_loop"), True)
    ]
    assert turn_prompt(model.requests[3]).startswith(
        "Turn 2. You repeated the same tool call three times; try something else. verify failed:"
    )
    assert_fixed_in_turn_two(github, redis, n)
    assert_every_tool_use_answered(Store(redis).conversation(key(n)))


def test_cost_cap_is_checked_before_every_model_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    expensive = {"input_tokens": 1_000_000, "output_tokens": 10}
    model.play(
        m.bash("echo 1 >> ran.txt", usage=expensive), m.bash("echo 2 >> ran.txt", usage=expensive)
    )
    n = start(github, drain, config(extra="max_cost_usd: 2.5\n"))
    capped = events(redis, n, "turn_capped")
    assert [(c["turn"], c["reason"]) for c in capped] == [(1, "budget_exhausted")]
    record = record_of(redis, n)
    assert (record.status, record.reason, record.turn) == (Status.FAILED, "budget_exhausted", 1)
    assert record.detail == capped[0]["detail"] and "$2.50" in record.detail
    # claude-test is no listed model: priced as the most expensive one, $10 in, $50 out.
    assert record.cost_usd - triage_cost(record) == pytest.approx(10.0005)
    # One model call; the second would cross the cap, so it was never sent. The turn's
    # one command ran and is committed; verify did not run and no pull request opened.
    assert len(model.requests) == 1 and len(model.script) == 1
    assert github.file_at(REPO, BRANCH, "ran.txt") == "1\n"
    assert events(redis, n, "turn_completed") == [] and events(redis, n, "verify") == []
    assert github.repo(REPO).pulls == {}
    assert "loop:needs-human" in github.repo(REPO).issues[n].labels
    assert "budget_exhausted" in status_comment(github)["body"]
    # A restart does not refill the budget: it says so, and no model call is made.
    comment(github, "writer", n, "/loop-restart")
    drain()
    replies = [
        c["body"] for c in github.repo(REPO).comments.values() if "loopbot:reply" in c["body"]
    ]
    assert any("Not restarted" in b and "raise `max_cost_usd`" in b for b in replies), replies
    assert len(model.requests) == 1
    assert record_of(redis, n).status == Status.FAILED


def test_text_only_when_max_steps_zero(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.responder = lambda body: m.text("just talking")
    n = start(github, drain, config(max_turns=2, extra="max_steps: 0\n"))
    # Each turn is one model call, offered no tools; its text is the whole turn.
    assert len(model.requests) == 2
    assert all("tools" not in r for r in model.requests)
    conversation = Store(redis).conversation(key(n))
    assert [msg["role"] for msg in conversation] == ["user", "assistant"] * 2
    assert not any(
        b.get("type") in ("tool_use", "tool_result")
        for msg in conversation
        if isinstance(msg["content"], list)
        for b in msg["content"]
    )
    completed = events(redis, n, "turn_completed")
    assert [(c["turn"], c["end"], c["steps"], c["tool_calls"]) for c in completed] == [
        (1, "text_only", 1, 0),
        (2, "text_only", 1, 0),
    ]
    assert events(redis, n, "turn_capped") == []  # text only is how the turn is meant to end
    # Talk changes nothing: two idle turns stop the loop, with no pull request.
    record = record_of(redis, n)
    assert (record.status, record.reason, record.turn) == (Status.FAILED, "no_changes", 2)
    assert github.repo(REPO).pulls == {}


def test_double_label_delivery_gives_one_loop(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=config())
    n = open_issue(github)
    label(github, "writer", n)
    with github.as_user("writer") as u:  # remove and add again: a second labeled event
        u.delete(f"/repos/{REPO}/issues/{n}/labels/loop:ready")
    # A second later, as a person would: GitHub's payload (updated_at, to the second)
    # differs, so it is not taken for a replay of the first.
    time.sleep(1.1)
    label(github, "writer", n)
    model.play(FIX, m.text("Fixed."))
    drain()
    # Every delivery reached dispatch (none was deduped at the door): the first label
    # starts the loop, the unlabel cancels it while queued, the second label resumes it.
    dispatched = [
        fetch_job(job_id, redis).return_value()
        for job_id in FinishedJobRegistry(CONTROL_QUEUE, connection=redis).get_job_ids()
    ]
    assert len(dispatched) == 3 and dispatched.count("cancelled") == 1, dispatched
    history = [e["kind"] for e in Store(redis).events(key(n)) if e["kind"] in LIFECYCLE]
    assert history == [
        "loop_created",
        "loop_cancelled",
        "loop_restarted",
        "turn_started",
        "loop_finished",
    ]
    # One loop record, in one loop job that ran once.
    assert [r.key for r in Store(redis).all()] == [key(n)]
    record = record_of(redis, n)
    assert (record.status, record.turn) == (Status.COMPLETED, 1)
    loop_jobs = FinishedJobRegistry(LOOP_QUEUE, connection=redis).get_job_ids()
    assert loop_jobs == [LoopId(REPO, n).job_id]
    assert len(events(redis, n, "turn_started")) == 1
    # One status comment, one pull request.
    assert len(bot_comments(github)) == 1 and "completed" in status_comment(github)["body"]
    assert len(github.repo(REPO).pulls) == 1
    # One model conversation: two calls, the second continuing the first.
    first, second = model.requests
    assert len(first["messages"]) == 1
    assert opening(second) == opening(first) and opening(first).startswith("Resolve issue #1")
    assert len(Store(redis).conversation(key(n))) == 4


def test_job_run_twice_gives_one_pr_and_one_status_comment(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any, rt: Any
) -> None:
    model.play(FIX, m.text("Fixed."))
    n = start(github, drain)
    assert "nothing to run" in run_loop(REPO, n)
    # Force it to run again as if redelivered after a crash: still one PR, one comment.
    Store(redis).update(key(n), lambda r: setattr(r, "status", Status.QUEUED))
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
    record = Store(redis).get(key(n))
    assert record is not None
    u = record.usage["claude-test/agent"]
    assert (
        u.input_tokens,
        u.output_tokens,
        u.cache_write_tokens,
        u.cache_read_tokens,
        u.messages,
    ) == (2000, 200, 4000, 10000, 2)
    # Priced as the most expensive listed model: 2000*10 + 200*50 + 4000*12.5 + 10000*1
    # (the dearest cache read, Fable 5's) = 90000 per million.
    assert abs(record.cost_usd - triage_cost(record) - 0.09) < 1e-9
    req = model.requests[1]
    assert req["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert req["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert {t["type"] for t in req["tools"]} == {"bash_20250124", "text_editor_20250728"}
    assert "sk-ant-local-test" not in json.dumps(model.requests)


def test_commit_subjects_name_no_issue_and_ping_nobody(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # A pushed commit that says "#2" cross-links that issue on GitHub: the agent's first
    # line becomes the subject only defused.
    model.play(FIX, m.text("Fixes #2, closes acme/other#3; thanks @alice\n\nDetails."))
    n = start(github, drain)
    assert record_of(redis, n).status == Status.COMPLETED
    subject = git(github.repo(REPO).path, "log", "-1", "--format=%s", BRANCH).strip()
    assert subject.startswith("loop(turn-1): ")
    assert "#2" not in subject and "#3" not in subject and "@alice" not in subject
    assert subject.replace("\u2060", "") == (
        "loop(turn-1): Fixes #2, closes acme/other#3; thanks @alice"
    )
