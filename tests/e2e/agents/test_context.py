"""A loop that reads far more than the model's context window still completes: the local
model enforces a 60k-token window as the API does (``prompt is too long: N tokens > M
maximum``), and the agent shrinks its conversation before it gets there. Real RQ workers,
real git, the local GitHub and model."""

from __future__ import annotations

import itertools
import json
from collections import deque
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.core.rules.loop.context import BRIEF_MARK
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.loop.test_loop import assert_every_tool_use_answered, events, key, record_of
from tests.helpers import REPO, label, open_issue, sample_repo

WINDOW = 60_000
YML = "verify: python3 -m unittest -q\nmax_turns: 4\n"  # critic and merge gate on
FIX = m.replace("calc.py", "return a - b", "return a + b")
# 20 KB of code-like text: about 5,000 tokens each time it is read.
BIG = "".join(f"def helper_{i:04d}(x):\n    return x * {i} + {i % 7}  # pad\n" for i in range(410))
READS = 24
APPROVE = m.structured({"verdict": "approve", "summary": "Looks right.", "findings": []})


class Script:
    """The agent's replies in order; the critic (asked with a JSON schema) approves."""

    def __init__(self, agent: list[m.Item]) -> None:
        self.agent = deque(agent)

    def __call__(self, body: dict[str, Any]) -> m.Item:
        if "format" in (body.get("output_config") or {}):
            return APPROVE
        return self.agent.popleft()


def start(github: GitHubServer, drain: Any, files: dict[str, str] | None = None) -> int:
    """A repository (with ``files``), an issue, the ready label by a writer; run it all."""
    sample_repo(github, loop_yml=YML, extra=files)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def agent_requests(model: AnthropicServer) -> list[tuple[dict[str, Any], int]]:
    """The agent's requests (not the critic's) with their input tokens as counted."""
    return [
        (body, tokens)
        for body, tokens in zip(model.requests, model.input_tokens, strict=True)
        if "format" not in (body.get("output_config") or {})
    ]


def test_a_turn_that_reads_far_more_than_the_window_completes_and_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    assert len(BIG) >= 20_000
    model.window_override = WINDOW
    reads = [m.bash(f"cat big.txt  # read {i}") for i in range(READS)]  # distinct: no doom loop
    model.responder = Script([*reads, FIX, m.text("Fixed add to use +.")])
    n = start(github, drain, {"big.txt": BIG})

    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), record
    assert record.turn == 1  # one turn: every read and the fix on one conversation
    sent = agent_requests(model)
    assert len(sent) == READS + 2
    # 24 reads of 5,000 tokens are twice the window; no request came near it.
    read_total = READS * len(BIG) // 4
    assert read_total > 1.5 * WINDOW
    peak = max(tokens for _, tokens in sent)
    assert peak < WINDOW * 0.75, peak
    assert not any("prompt is too long" in json.dumps(r) for r in model.responses)

    shrinks = events(redis, n, "context_shrunk")
    assert shrinks, "the conversation never shrank"
    for s in shrinks:
        assert s["window"] == WINDOW
        assert s["tokens_after"] < s["tokens_before"], s
        assert s["tokens_before"] > WINDOW * 0.7  # shrunk at the threshold, not before
        assert s["tokens_after"] <= WINDOW * 0.45
    # Each shrink rewrote the conversation sent next: old results became notes.
    after_first = next(body for body, _ in sent if "loopbot cleared" in json.dumps(body))
    assert_every_tool_use_answered(after_first["messages"])
    # The issue never left the conversation: the first message is the issue prompt or a
    # brief holding it.
    for body, _ in sent:
        first = json.dumps(body["messages"][0])
        assert "add(2, 3) should be 5" in first, first[:300]
    # The stored conversation is the shrunk one, valid, and far smaller than what was read.
    stored = Store(redis).conversation(key(n))
    assert_every_tool_use_answered(stored)
    assert len(json.dumps(stored)) < WINDOW * 4 * 0.75
    # The fix is there, and every read's call with its answer (whole or as a note).
    assert any(
        b.get("name") == "str_replace_based_edit_tool"
        for msg in stored
        if msg["role"] == "assistant"
        for b in msg["content"]
    )
    assert github.repo(REPO).issues[n].state == "closed"


def test_prompt_too_long_is_never_fatal(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The window is smaller than the agent believes (the Models API says 200k): the API's
    answer names both sizes, the agent believes it, shrinks and goes on."""
    model.window_override = 30_000
    model.advertised_window = 200_000
    reads = [m.bash(f"cat big.txt  # read {i}") for i in range(10)]
    model.responder = Script([*reads, FIX, m.text("Fixed add to use +.")])
    n = start(github, drain, {"big.txt": BIG})

    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), record
    shrinks = events(redis, n, "context_shrunk")
    assert any(s["reason"] == "prompt_too_long" for s in shrinks), shrinks
    # After the first "too long", the agent knows the window: no second one in a row.
    answers = [t for _, t in agent_requests(model)]
    over = [i for i, t in enumerate(answers) if t > 30_000]
    assert over and all(b - a > 1 for a, b in itertools.pairwise(over)), answers
    assert record.error_count == 0


def test_a_brief_keeps_the_issue_when_results_are_not_enough(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Many small steps (nothing big to clear) outgrow the window too: older steps fold
    into a brief that keeps the issue, and the loop still finishes."""
    model.window_override = 12_000
    say = "I looked at this part of the code and decided to keep going. " * 12
    steps = [m.bash(f"echo step {i}", say=say) for i in range(60)]
    model.responder = Script([*steps, FIX, m.text("Fixed add to use +.")])
    n = start(github, drain)

    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), record
    shrinks = events(redis, n, "context_shrunk")
    assert any(s["level"] == "brief" for s in shrinks), shrinks
    stored = Store(redis).conversation(key(n))
    head = stored[0]["content"][0]["text"]
    assert head.startswith(BRIEF_MARK)
    assert "add(2, 3) should be 5" in head
    assert "decided to keep going" in head  # what the model wrote along the way
    assert max(t for _, t in agent_requests(model)) < 12_000
