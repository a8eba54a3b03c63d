"""The critic's model, effort and thinking: loop.yml's `critic.model` / `critic.effort`
within the operator's list and ceiling, adaptive thinking with its blocks sent back exactly
as the model wrote them, and a reply cut mid-tool-call dropped and asked for again. Real
RQ worker, real git and sandbox, the local GitHub and model servers (the model server
rejects a thinking block whose signature does not match its text and model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from redis import Redis

from bot.core.models import ModelSpec
from bot.core.rules.pull.review import output_schema
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.gitrepo import resolve
from jobs.review.tools import ReviewCheckout, ReviewLimits, ToolReview, review_checkout
from jobs.review.tools import review_with_tools as _review_with_tools
from jobs.tree.worktree import Worktrees
from tests.conftest import Web
from tests.helpers import CALC, REPO, TEST_CALC, label, open_issue, sample_repo, worker_settings

FIX = m.replace("calc.py", "return a - b", "return a + b")
REPORT = {"verdict": "approve", "summary": "Looks right.", "findings": []}
KEY = f"{REPO}#1"
TEST_MODEL = ModelSpec(
    "claude-test", 200_000, 64_000, adaptive=True, efforts=frozenset({"low", "medium", "high"})
)


@pytest.fixture
def env_extra() -> dict[str, str]:
    """The operator lets a loop.yml choose Sonnet 5.5 and effort up to xhigh."""
    return {
        "LOOPBOT_ALLOWED_MODELS": "claude-sonnet-5-5",
        "LOOPBOT_MAX_EFFORT": "xhigh",
    }


def is_critic(body: dict[str, Any]) -> bool:
    return "output_config" in body


def critic_requests(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if is_critic(b)]


def run(github: GitHubServer, drain: Any, critic: str) -> None:
    sample_repo(github, loop_yml=f"verify: python3 -m unittest -q\ncritic:\n{critic}")
    label(github, "writer", open_issue(github))
    drain()


def events(redis: Redis, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in Store(redis).events(KEY) if e["kind"] == kind]


# -- the critic job ------------------------------------------------------------------------------


def test_loop_yml_chooses_the_critics_model_and_effort(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), m.structured(REPORT))
    run(github, drain, "  model: claude-sonnet-5-5\n  effort: xhigh\n  tools: false\n")
    r = Store(redis).get(KEY)
    assert r is not None and (r.status, r.reason) == ("completed", "merged"), r
    (critic,) = critic_requests(model)
    assert critic["model"] == "claude-sonnet-5-5"
    assert critic["thinking"] == {"type": "adaptive"}
    # The effort joins the report's schema in output_config; neither replaces the other.
    assert critic["output_config"] == {
        "format": {"type": "json_schema", "schema": output_schema()},
        "effort": "xhigh",
    }
    assert all(b["model"] == "claude-test" for b in model.requests if not is_critic(b))
    assert "claude-sonnet-5-5/critic" in r.usage and "claude-test/critic" not in r.usage
    (started,) = events(redis, "review_started")
    assert (started["model"], started["effort"]) == ("claude-sonnet-5-5", "xhigh")
    assert events(redis, "config_clamped") == []


def test_a_model_or_effort_beyond_the_operators_is_clamped_and_the_issue_told(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed add."), m.structured(REPORT))
    run(github, drain, "  model: claude-fable-5-1\n  effort: max\n  tools: false\n")
    r = Store(redis).get(KEY)
    assert r is not None and r.reason == "merged", r
    (critic,) = critic_requests(model)
    # The operator's critic model, at the ceiling's effort; the test model does not take
    # xhigh, so no effort is sent at all (the API would refuse it), only the format.
    assert critic["model"] == "claude-test" and critic["thinking"] == {"type": "adaptive"}
    assert critic["output_config"] == {"format": {"type": "json_schema", "schema": output_schema()}}
    (clamped,) = events(redis, "config_clamped")
    assert any(
        n.startswith("`critic.model`: `claude-fable-5-1` is not one") for n in clamped["notes"]
    )
    assert "`critic.effort`: max asked, lowered to xhigh" in clamped["notes"][1]
    bodies = [c["body"] for c in github.repo(REPO).comments.values()]
    assert any("`critic.model`: `claude-fable-5-1`" in b and "operator" in b for b in bodies)


def test_the_critics_tool_rounds_send_thinking_back_unchanged(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.text("Fixed add."),
        m.tool("read_file", {"path": "calc.py"}),
        m.structured(REPORT),
    )
    run(github, drain, "  model: claude-sonnet-5-5\n  effort: low\n")
    r = Store(redis).get(KEY)
    assert r is not None and r.reason == "merged", r
    first, second = critic_requests(model)
    assert first["thinking"] == second["thinking"] == {"type": "adaptive"}
    assert second["output_config"]["effort"] == "low"
    # The tool step's reply went back with its thinking block first, signed: the server
    # checks the signature against the text and the model, and would have refused a change.
    reply = second["messages"][1]
    assert reply["role"] == "assistant"
    assert reply["content"][0]["type"] == "thinking" and reply["content"][0]["signature"]
    assert reply["content"][-1]["type"] == "tool_use"
    assert events(redis, "critic_looked")[0]["tool_calls"] == 1


# -- the tool loop alone ---------------------------------------------------------------------


@pytest.fixture
def head(github: GitHubServer, tmp_path: Path) -> Iterator[ReviewCheckout]:
    settings = worker_settings(tmp_path)
    iid = github.add_installation("acme")
    repo = github.add_repo(REPO, {"calc.py": CALC, "test_calc.py": TEST_CALC}, installation_id=iid)
    worktrees = Worktrees(settings.data_dir)
    mirror = worktrees.sync_mirror(REPO, f"{github.url}/git/{REPO}.git", github.app_token_for(iid))
    sha = resolve(repo.path, "refs/heads/main")
    assert sha is not None
    with review_checkout(worktrees, REPO, mirror, sha, settings=settings, timeout=60) as co:
        yield co


@pytest.fixture
def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-local-test", base_url=model.url, max_retries=0)


def review(
    client: anthropic.Anthropic, head: ReviewCheckout, spec: ModelSpec, effort: str | None = None
) -> ToolReview:
    return _review_with_tools(
        client,
        model=spec.id,
        system="You review pull requests.",
        prompt="Review the change to calc.py.",
        schema=output_schema(),
        checkout=head.path,
        sandbox=head.sandbox,
        verify_command="python3 -m unittest -q",
        limits=ReviewLimits(),
        after_tests=head.reset,
        spec=spec,
        effort=effort,
    )


def tool_use_ids(request: dict[str, Any]) -> set[str]:
    return {
        b["id"]
        for msg in request["messages"]
        if isinstance(msg["content"], list)
        for b in msg["content"]
        if b.get("type") == "tool_use"
    }


def test_an_effort_the_model_does_not_take_is_never_sent(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(m.structured(REPORT))
    out = review(client, head, TEST_MODEL, effort="max")
    assert json.loads(out.text) == REPORT
    (req,) = model.requests
    assert req["thinking"] == {"type": "adaptive"} and "effort" not in req["output_config"]


def test_a_model_without_adaptive_thinking_is_asked_for_none(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    haiku = ModelSpec("claude-haiku-4-5", 200_000, 64_000, adaptive=False, efforts=frozenset())
    model.play(m.structured(REPORT))
    review(client, head, haiku, effort="high")
    (req,) = model.requests
    assert "thinking" not in req and set(req["output_config"]) == {"format"}


def test_a_reply_cut_mid_tool_call_is_dropped_and_asked_again_with_twice_the_limit(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    cut = m.cut_tool("search", {"pattern": "ad"}, say="Let me search.")
    cut_id = cut.content[-1]["id"]
    model.play(cut, m.tool("read_file", {"path": "calc.py"}), m.structured(REPORT))
    out = review(client, head, TEST_MODEL, effort="low")
    assert out.stopped == "answered" and json.loads(out.text) == REPORT
    first, retry, after = model.requests[0], model.requests[1], model.requests[2]
    assert (first["max_tokens"], retry["max_tokens"], after["max_tokens"]) == (8192, 16384, 8192)
    # The same conversation asked again: the cut call was never kept, so never run.
    assert retry["messages"] == first["messages"]
    assert all(cut_id not in tool_use_ids(r) for r in model.requests)
    assert "Let me search." not in json.dumps(model.requests)
    assert (out.steps, out.tool_calls, len(out.usage)) == (3, 1, 3)  # the dropped call is paid


def test_a_reply_cut_twice_ends_the_tool_rounds_and_the_report_is_asked_for(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(
        m.cut_tool("search", {}),
        m.cut_tool("search", {"pattern": "a"}),
        m.structured(REPORT),
    )
    out = review(client, head, TEST_MODEL)
    assert out.stopped == "output_limit" and "cut off again" in out.detail
    assert "16384 output tokens" in out.detail
    assert json.loads(out.text) == REPORT and not out.error
    limits = [r["max_tokens"] for r in model.requests]
    assert limits == [8192, 16384, 8192]
    final = model.requests[-1]
    assert final["tool_choice"] == {"type": "none"} and tool_use_ids(final) == set()
    assert out.tool_calls == 0


def test_the_retry_stays_within_the_models_output_limit(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    small = ModelSpec("claude-test", 200_000, 10_000, adaptive=True, efforts=frozenset())
    model.play(m.cut_tool("search", {}), m.structured(REPORT))
    review(client, head, small)
    assert [r["max_tokens"] for r in model.requests] == [8192, 10_000]


def test_no_room_above_the_limit_means_no_retry(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    tight = ModelSpec("claude-test", 200_000, 4096, adaptive=False, efforts=frozenset())
    model.play(m.cut_tool("search", {}), m.structured(REPORT))
    out = review(client, head, tight)
    assert out.stopped == "output_limit" and "at 4096 output tokens" in out.detail
    assert "again" not in out.detail
    assert [(r["max_tokens"], r["tool_choice"]["type"]) for r in model.requests] == [
        (4096, "auto"),
        (4096, "none"),
    ]
