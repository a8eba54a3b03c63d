"""Red team: whole loops (real RQ workers, real git, the local GitHub and model) driven by
an unlucky model and an operator's ordinary settings into the corners of the context and
thinking work: a fallback model mid tool loop, a restart on another model, pause_turn,
a model that keeps filling its window, a fallback with a smaller window, and a
maintainer's comment folded into a brief.

Each test states one promise and tries to break it; where a docstring tells how, that is
how the harness failed it before the fix that came with the test. The
local model rejects what the real API rejects (signatures, the thinking rule of a tool
loop, cache_control on a thinking block, the window) before any script item is used, so
``rejected`` lists every request the Messages API would have answered with a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.agents.test_budget import _set_loop_yml
from tests.e2e.loop.test_loop import events, key, record_of
from tests.helpers import comment, label, open_issue, sample_repo

FIX = m.replace("calc.py", "return a - b", "return a + b")
NO_REVIEW = "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
BIG = "".join(f"def helper_{i:04d}(x):\n    return x * {i} + {i % 7}  # pad\n" for i in range(410))


NO_RETRY = {"LOOPBOT_MODEL_RETRIES": "0"}  # a 529 goes to the fallback at once


@pytest.fixture
def env_extra() -> dict[str, str]:
    return NO_RETRY


def rejected(model: AnthropicServer) -> list[tuple[int, str]]:
    """Every request the local model answered 400 (invalid, thinking, cache, window)."""
    out = []
    for i, (body, tokens) in enumerate(zip(model.requests, model.input_tokens, strict=True)):
        spec = model.models.get(str(body.get("model")))
        if spec is None:
            continue
        why = m.invalid(body, spec) or m.thinking_invalid(body, spec)
        if why is None and tokens > model.window(spec):
            why = f"prompt is too long: {tokens} tokens > {model.window(spec)} maximum"
        marks = sum(
            1
            for part in (body.get("system") or [], *(x["content"] for x in body["messages"]))
            if isinstance(part, list)
            for b in part
            if isinstance(b, dict)
            and "cache_control" in b
            and b.get("type") in ("thinking", "redacted_thinking")
        )
        if why is None and marks:
            why = "cache_control on a thinking block"
        if why is not None:
            out.append((i, why))
    return out


def start(github: GitHubServer, drain: Any, yml: str, **extra_files: str) -> int:
    sample_repo(github, loop_yml=yml, extra=extra_files or None)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return n


def scripted(model: AnthropicServer, *steps: m.Item | Callable[[], m.Item]) -> None:
    """Answer with ``steps`` in order; a callable runs at its turn, then answers."""
    queue = list(steps)

    def respond(body: dict[str, Any]) -> m.Item:
        item = queue.pop(0)
        return item() if callable(item) else item

    model.responder = respond


# -- rule 1 and 5: thinking across a model switch -------------------------------------------


@pytest.mark.parametrize("env_extra", [NO_RETRY | {"LOOPBOT_FALLBACK_MODEL": "claude-sonnet-4-6"}])
def test_a_fallback_with_adaptive_thinking_mid_tool_loop_gets_a_valid_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Both models think (an ordinary pair: Sonnet 5.5 with Sonnet 4.6 behind it). The 529
    comes right after a tool result, as it usually does; ``strip_thinking`` leaves the
    fallback a tool loop whose assistant message has no thinking block, with thinking on:
    the API answers 400 and the turn raises instead of going on."""
    scripted(
        model,
        m.bash("cat calc.py"),
        m.Fail(529, "Overloaded", "overloaded_error"),
        FIX,
        m.text("Fixed add to use +."),
    )
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 2\n" + NO_REVIEW)
    assert rejected(model) == []
    record = record_of(redis, n)
    assert (record.status, record.error_count) == (Status.COMPLETED, 0), record


@pytest.mark.parametrize("env_extra", [NO_RETRY | {"LOOPBOT_FALLBACK_MODEL": "claude-haiku-4-5"}])
def test_the_turn_after_a_fallback_that_ended_mid_tool_loop_gets_a_valid_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The fallback (no adaptive thinking) takes over, the turn ends at the step cap with
    tool results last. The next turn's prompt is merged into them, the primary model
    is asked with thinking on, and the last assistant message (the fallback's) has no
    thinking block: a 400 on every attempt, and the loop fails on errors."""
    scripted(
        model,
        m.bash("cat calc.py"),
        m.Fail(529, "Overloaded", "overloaded_error"),
        m.bash("cat test_calc.py"),  # the fallback's call, then the step cap
        FIX,
        m.text("Fixed add to use +."),
        FIX,
        m.text("Fixed add to use +."),
        FIX,
        m.text("Fixed add to use +."),
    )
    yml = "verify: python3 -m unittest -q\nmax_turns: 3\nmax_steps: 2\n" + NO_REVIEW
    n = start(github, drain, yml)
    assert rejected(model) == []
    record = record_of(redis, n)
    assert (record.status, record.error_count) == (Status.COMPLETED, 0), record


def _restart_on(github: GitHubServer, drain: Any, n: int, agent_model: str) -> None:
    _set_loop_yml(
        github,
        f"verify: python3 -m unittest -q\nmax_turns: 2\nagent:\n  model: {agent_model}\n"
        + NO_REVIEW,
    )
    comment(github, "writer", n, "/loop-restart")
    drain()


@pytest.mark.parametrize("env_extra", [NO_RETRY | {"LOOPBOT_ALLOWED_MODELS": "claude-sonnet-4-6"}])
def test_a_restart_on_another_model_never_sends_it_the_old_models_thinking(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The maintainer moves loop.yml to another allowed model and restarts: the stored
    conversation holds claude-test's signed blocks, and the new agent (``_last_model``
    None) sends them to the new model."""
    scripted(model, m.bash("cat calc.py"), m.text("Looked; no change yet."))
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 1\n" + NO_REVIEW)
    assert record_of(redis, n).reason == "max_turns_reached"
    before = len(model.requests)
    scripted(model, FIX, m.text("Fixed add to use +."))
    _restart_on(github, drain, n, "claude-sonnet-4-6")
    later = model.requests[before:]
    assert later and all(r["model"] == "claude-sonnet-4-6" for r in later)
    assert [why for _, why in rejected(model) if "signature" in why] == []


@pytest.mark.parametrize("env_extra", [NO_RETRY | {"LOOPBOT_ALLOWED_MODELS": "claude-sonnet-4-6"}])
def test_a_restart_on_another_model_after_a_step_capped_turn_completes(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """As above, but the last turn ended at the step cap (tool results last). The
    signature 400 is recovered by ``strip_thinking``, which leaves a tool loop without
    thinking: a second 400, raised; RQ retries the same thing until the loop fails."""
    scripted(model, m.bash("cat calc.py"))
    yml = "verify: python3 -m unittest -q\nmax_turns: 1\nmax_steps: 1\n" + NO_REVIEW
    n = start(github, drain, yml)
    assert record_of(redis, n).reason == "max_turns_reached"
    scripted(model, *[FIX, m.text("Fixed add to use +.")] * 3)
    _restart_on(github, drain, n, "claude-sonnet-4-6")
    record = record_of(redis, n)
    assert (record.status, record.error_count) == (Status.COMPLETED, 0), (record, rejected(model))


# -- rule 1: pause_turn ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_extra",
    [{}, {"LOOPBOT_MODEL": "claude-haiku-4-5", "LOOPBOT_CRITIC_MODEL": "claude-haiku-4-5"}],
    ids=["thinking", "no-thinking"],
)
def test_a_paused_reply_without_text_is_sent_back_valid(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """pause_turn with no text. With thinking on the reply kept is ``[thinking]`` and
    ``with_cache_points`` marks its last block, the thinking block, for the cache; with
    thinking off it is ``[]``, valid only while it is the final message: the
    continuation is stored as a second assistant message after it."""
    scripted(model, m.paused(""), FIX, m.text("Fixed add to use +."))
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 2\n" + NO_REVIEW)
    assert rejected(model) == []
    record = record_of(redis, n)
    assert (record.status, record.error_count) == (Status.COMPLETED, 0), record


def test_a_paused_reply_and_its_continuation_are_sent_back_valid(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """pause_turn stores the paused reply and its continuation as two assistant messages
    in a row, as the API's own pause_turn example does; the Messages API combines
    consecutive turns of one role, so what matters is that every later request is one the
    local model (as strict as the API) accepts, and the loop completes."""
    scripted(model, m.paused("Let me look."), FIX, m.text("Fixed add to use +."))
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 2\n" + NO_REVIEW)
    assert record_of(redis, n).status == Status.COMPLETED
    roles = [msg["role"] for msg in Store(redis).conversation(key(n))]
    assert roles[:3] == ["user", "assistant", "assistant"], roles
    assert all(r["stop_reason"] for r in model.responses)


# -- rule 3: a model that keeps filling its window ---------------------------------------------


def test_a_model_that_keeps_filling_the_window_does_not_get_called_again_and_again(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """``model_context_window_exceeded`` with a conversation well under the target: the
    shrink removes nothing but reports level "clear" (``context.shrink``), so
    ``Agent._shrink`` says it shrank, the reply is dropped and the same request goes
    again, paid, until the step cap; "prompt is too long" is bounded at twice in a row,
    this path is not. (The reply is long, as one that fills a window is: its output
    tokens put the "before" figure above the unchanged conversation's estimate.)"""
    model.window_override = 12_000
    filled = {"input_tokens": 4_000, "output_tokens": 8_000}
    full = [m.context_full("I was writing a long answer", usage=filled) for _ in range(8)]
    scripted(model, m.bash("cat calc.py"), *full, FIX, m.text("Fixed add to use +."))
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 3\n" + NO_REVIEW)
    served = [r["stop_reason"] for r in model.responses]
    in_a_row = max(
        (
            len(run)
            for run in "".join(
                "F" if s == "model_context_window_exceeded" else "." for s in served
            ).split(".")
        ),
        default=0,
    )
    noops = [
        s
        for s in events(redis, n, "context_shrunk")
        if s["cleared"] == s["summarised"] == s["clipped"] == 0
    ]
    assert in_a_row <= 3, (served, noops)
    assert noops == [], noops  # a "shrink" event that removed nothing


# -- rule 3: the window of the model actually called -------------------------------------------

WIDE = m.ModelSpec("claude-wide", window=40_000, thinking=frozenset({"disabled"}), efforts=())
NARROW = m.ModelSpec("claude-narrow", window=10_000, thinking=frozenset({"disabled"}), efforts=())


@pytest.mark.parametrize(
    "env_extra",
    [
        NO_RETRY
        | {
            "LOOPBOT_MODEL": "claude-wide",
            "LOOPBOT_CRITIC_MODEL": "claude-wide",
            "LOOPBOT_FALLBACK_MODEL": "claude-narrow",
        }
    ],
)
def test_the_fallback_models_known_window_is_never_exceeded(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The Models API says the fallback's window is 10k; the agent keeps shrinking for
    the primary's 40k, sends the fallback a request over its window, and only learns
    from the 400 (and then keeps the fallback's window for the primary too)."""
    model.add_model(WIDE)
    model.add_model(NARROW)
    scripted(
        model,
        m.bash("cat big.txt  # 1"),
        m.bash("cat big.txt  # 2"),
        m.Fail(529, "Overloaded", "overloaded_error"),
        FIX,
        m.text("Fixed add to use +."),
    )
    n = start(
        github,
        drain,
        "verify: python3 -m unittest -q\nmax_turns: 2\n" + NO_REVIEW,
        **{"big.txt": BIG},
    )
    assert record_of(redis, n).status == Status.COMPLETED
    narrow = [
        t
        for r, t in zip(model.requests, model.input_tokens, strict=True)
        if r["model"] == "claude-narrow"
    ]
    assert narrow and max(narrow) <= NARROW.window, narrow


# -- rule 2 on a real loop: a maintainer's comment folded away ---------------------------------

SAY = "I looked at this part of the code and decided to keep going. " * 12


def test_a_maintainers_comment_survives_the_brief_of_the_turn_it_came_in(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A writer comments during turn 1; turn 2's prompt carries it (once: it is marked
    delivered). In turn 2 one reply is cut at max_tokens, the harness asks to continue,
    and later the brief folds both prompts: "latest instructions" is the continue prompt
    and the comment is in no request after that."""
    model.window_override = 12_000
    posted: list[int] = []

    def comment_then_stop() -> m.Item:
        posted.append(comment(github, "writer", n_box[0], "WRITER-RULE-99: keep add() pure."))
        return m.text("Looked; nothing changed yet.")

    n_box: list[int] = []
    steps = [m.bash(f"echo step {i}", say=SAY) for i in range(45)]
    scripted(
        model,
        m.bash("cat calc.py"),
        comment_then_stop,
        m.cut_text("Let me explain my plan at length: "),
        *steps,
        FIX,
        m.text("Fixed add to use +."),
    )
    sample_repo(github, loop_yml="verify: python3 -m unittest -q\nmax_turns: 3\n" + NO_REVIEW)
    n = open_issue(github)
    n_box.append(n)
    label(github, "writer", n)
    drain()
    assert posted and events(redis, n, "discussion"), "the comment never reached a prompt"
    assert any(s["level"] == "brief" for s in events(redis, n, "context_shrunk"))
    last = model.requests[-1]
    assert "WRITER-RULE-99" in json.dumps(last), "the maintainer's comment was folded away"


def test_a_restart_from_a_stored_brief_sends_valid_requests(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The baseline for the restart findings: a conversation stored after a brief (its
    head the brief, thinking blocks after it) goes on after /loop-restart, valid."""
    model.window_override = 12_000
    steps = [m.bash(f"echo step {i}", say=SAY) for i in range(40)]
    scripted(model, *steps, m.text("Not fixed yet."))
    n = start(github, drain, "verify: python3 -m unittest -q\nmax_turns: 1\n" + NO_REVIEW)
    assert any(s["level"] == "brief" for s in events(redis, n, "context_shrunk"))
    stored = Store(redis).conversation(key(n))
    assert json.dumps(stored[0]).count("[loopbot: conversation brief]") == 1
    scripted(model, FIX, m.text("Fixed add to use +."))
    _set_loop_yml(github, "verify: python3 -m unittest -q\nmax_turns: 2\n" + NO_REVIEW)
    comment(github, "writer", n, "/loop-restart")
    drain()
    assert rejected(model) == []
    record = record_of(redis, n)
    assert (record.status, record.error_count) == (Status.COMPLETED, 0), record
    assert "add(2, 3) should be 5" in json.dumps(model.requests[-1]["messages"][0])
