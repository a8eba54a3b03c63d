"""The critic's read-only tools and its bounded tool loop, against a real git mirror, the
real sandbox and the local model server (which plays the model, kind or not)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from bot.core.rules.pull.review import output_schema
from bot.core.settings import Settings
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer, Reply
from bot.standins.github import GitHubServer
from bot.standins.gitrepo import git as plain_git
from bot.standins.gitrepo import resolve, seed
from jobs.review.tools import (
    ReviewCheckout,
    ReviewLimits,
    ToolReview,
    review_checkout,
    review_with_tools,
    worst_next,
)
from jobs.tree.worktree import GitError, Worktrees, git
from tests.helpers import CALC, TEST_CALC, worker_settings

REPO = "acme/widgets"
BRANCH = "loop/issue-1"
SECRET = "TOP-SECRET-4711"
VERIFY = "python3 -m unittest -q"
REPORT = {
    "verdict": "request_changes",
    "summary": "add() still subtracts; the tests fail on the head.",
    "findings": [
        {
            "severity": "sev1",
            "category": "correctness",
            "path": "calc.py",
            "line": 2,
            "title": "add subtracts",
            "body": "return a - b",
        }
    ],
}


def _commit(bare: Path, branch: str, files: dict[str, str], links: dict[str, str]) -> str:
    """One more commit on ``branch`` (from main) with ``files`` and symbolic ``links``, as
    the loop would have pushed it: links are what an agent can commit."""
    parent = resolve(bare, f"refs/heads/{branch}") or resolve(bare, "refs/heads/main")
    assert parent is not None
    index = bare / "pr-index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index), "HOME": str(bare)}

    def run(*args: str, data: bytes | None = None) -> str:
        out = subprocess.run(
            ["git", *args], cwd=bare, env=env, input=data, capture_output=True, check=True
        )
        return out.stdout.decode().strip()

    run("read-tree", parent)
    for name, content in [*files.items(), *links.items()]:
        blob = run("hash-object", "-w", "--stdin", data=content.encode())
        mode = "120000" if name in links else "100644"
        run("update-index", "--add", "--cacheinfo", f"{mode},{blob},{name}")
    tree = run("write-tree")
    index.unlink()
    sha = plain_git(bare, "commit-tree", tree, "-p", parent, "-m", "loop(turn-1): fix").strip()
    plain_git(bare, "update-ref", f"refs/heads/{branch}", sha)
    return sha


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    f = tmp_path / "secret.txt"
    f.write_text(SECRET + "\n")
    return f


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return worker_settings(tmp_path)


@pytest.fixture
def pr(github: GitHubServer, settings: Settings, secret: Path) -> tuple[Worktrees, Path, str]:
    """The loop's mirror with a PR head that claims a fix it does not make."""
    iid = github.add_installation("acme")
    repo = github.add_repo(REPO, {"calc.py": CALC, "test_calc.py": TEST_CALC}, installation_id=iid)
    sha = _commit(
        repo.path,
        BRANCH,
        {"NOTES.md": "Fixed add().\n", "docs/guide.md": "# Guide\nadd(a, b) adds.\n"},
        {"link-out": str(secret), "link-up": "../../../secret.txt", "link-in": "calc.py"},
    )
    worktrees = Worktrees(settings.data_dir)
    mirror = worktrees.sync_mirror(REPO, f"{github.url}/git/{REPO}.git", github.app_token_for(iid))
    return worktrees, mirror, sha


@pytest.fixture
def head(pr: tuple[Worktrees, Path, str], settings: Settings) -> Iterator[ReviewCheckout]:
    worktrees, mirror, sha = pr
    with review_checkout(worktrees, REPO, mirror, sha, settings=settings, timeout=60) as co:
        yield co


@pytest.fixture
def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-local-test", base_url=model.url, max_retries=0)


def review(
    client: anthropic.Anthropic,
    head: ReviewCheckout,
    limits: ReviewLimits | None = None,
    verify: str = VERIFY,
    seen: list[Any] | None = None,
    before_call: Any = None,
) -> ToolReview:
    return review_with_tools(
        client,
        model="claude-test",
        system="You review pull requests.",
        prompt="Review the change to calc.py.",
        schema=output_schema(),
        checkout=head.path,
        sandbox=head.sandbox,
        verify_command=verify,
        limits=limits,
        after_tests=head.reset,
        on_usage=(lambda name, u: seen.append((name, u))) if seen is not None else None,
        before_call=before_call,
    )


def results(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a request carries back to the model (its last user message)."""
    content = request["messages"][-1]["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def result_text(request: dict[str, Any], i: int = 0) -> str:
    return str(results(request)[i]["content"])


def many_calls(*calls: tuple[str, dict[str, Any]]) -> Reply:
    """One step asking for several tools at once, as models do."""
    blocks = [
        {"type": "tool_use", "id": f"toolu_multi_{i}", "name": name, "input": args}
        for i, (name, args) in enumerate(calls)
    ]
    return Reply(blocks, stop_reason="tool_use")


def test_reads_lists_and_searches_the_pr_head(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(
        m.tool("read_file", {"path": "calc.py"}, say="Let me check the claim."),
        m.tool("read_file", {"path": "docs/guide.md", "start_line": 2, "end_line": 2}),
        m.tool("list_files", {}),
        m.tool("search", {"pattern": "a - b", "glob": "*.py"}),
        m.tool("search", {"pattern": r"def [a-z]+\(", "regex": True}),
        m.tool("search", {"pattern": "multiply"}),
        m.structured(REPORT),
    )
    seen: list[Any] = []
    out = review(client, head, seen=seen)

    assert out.stopped == "answered" and not out.error
    assert json.loads(out.text) == REPORT
    assert (out.steps, out.tool_calls) == (7, 6)
    assert len(seen) == len(out.usage) == 7
    reqs = model.requests
    assert result_text(reqs[1]) == "     1\tdef add(a, b):\n     2\t    return a - b"
    assert result_text(reqs[2]) == "     2\tadd(a, b) adds."
    listing = result_text(reqs[3]).splitlines()
    assert {"NOTES.md", "calc.py", "docs/", "docs/guide.md", "link-in -> calc.py"} <= set(listing)
    assert ".git" not in listing
    assert result_text(reqs[4]) == "calc.py:2:    return a - b"
    assert "calc.py:1:def add(a, b):" in result_text(reqs[5])
    assert result_text(reqs[6]) == "no match for 'multiply' under ."
    assert not any(r["is_error"] for req in reqs[1:] for r in results(req))
    for req in reqs:  # the report's schema rides on every call, tools usable until the end
        assert req["output_config"]["format"]["schema"] == output_schema()
        assert {t["name"] for t in req["tools"]} == {
            "read_file",
            "list_files",
            "search",
            "run_tests",
        }
        assert req["tool_choice"] == {"type": "auto"}


def test_run_tests_runs_verify_in_the_sandbox_and_leaves_nothing_behind(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    # A verify that writes, as test suites do: a report file, and even a source file.
    verify = "echo junk > made-by-tests.txt; echo '# touched' >> calc.py; " + VERIFY
    model.play(
        m.tool("run_tests", {}),
        m.tool("read_file", {"path": "calc.py"}),
        m.tool("read_file", {"path": "made-by-tests.txt"}),
        m.tool("run_tests", {"command": "rm -rf /"}),  # no other command can be given
        m.structured(REPORT),
    )
    out = review(client, head, verify=verify)

    assert out.stopped == "answered" and json.loads(out.text) == REPORT
    reqs = model.requests
    ran = result_text(reqs[1])
    assert ran.startswith(f"`{verify}` failed: exit code 1")
    assert "AssertionError: -1 != 5" in ran and "FAILED (failures=1)" in ran
    assert not results(reqs[1])[0]["is_error"]  # a failing suite is a result, not an error
    assert "touched" not in result_text(reqs[2])  # the checkout was reset after the run
    assert results(reqs[3])[0]["is_error"] and "does not exist" in result_text(reqs[3])
    again = result_text(reqs[4])
    assert again.startswith("(the same result as the earlier run") and ran in again
    assert not (head.path / "made-by-tests.txt").exists()
    assert (head.path / "calc.py").read_text() == CALC


def test_run_tests_passes_on_a_head_that_fixes_the_bug(
    model: AnthropicServer,
    client: anthropic.Anthropic,
    github: GitHubServer,
    pr: tuple[Worktrees, Path, str],
    settings: Settings,
) -> None:
    worktrees, mirror, _ = pr
    fixed = seed(github.repo(REPO).path, BRANCH, {"calc.py": CALC.replace("a - b", "a + b")})
    # Not synced into the mirror yet: fetched by sha, with the token.
    with (
        pytest.raises(GitError, match="not in the mirror"),
        review_checkout(worktrees, REPO, mirror, fixed, settings=settings),
    ):
        pass
    token = github.app_token_for(github.repo(REPO).installation_id or 0)
    with review_checkout(worktrees, REPO, mirror, fixed, settings=settings, token=token) as co:
        model.play(m.tool("run_tests", {}), m.structured(REPORT))
        review(client, co)
    assert result_text(model.requests[1]).startswith(f"`{VERIFY}` passed: exit code 0")


@pytest.mark.parametrize(
    ("tool", "args", "why"),
    [
        ("read_file", {"path": "../../etc/passwd"}, "outside the repository"),
        ("read_file", {"path": "/etc/passwd"}, "outside the repository"),
        ("read_file", {"path": "link-out"}, "leads outside the repository"),
        ("read_file", {"path": "link-up"}, "leads outside the repository"),
        ("read_file", {"path": ".git"}, "managed by the harness"),
        ("list_files", {"path": ".."}, "outside the repository"),
        ("list_files", {"path": "link-out"}, "leads outside the repository"),
        ("search", {"pattern": "root", "path": "/etc"}, "outside the repository"),
        ("search", {"pattern": "TOP", "path": "link-out"}, "leads outside the repository"),
    ],
)
def test_paths_out_of_the_checkout_are_refused(
    model: AnthropicServer,
    client: anthropic.Anthropic,
    head: ReviewCheckout,
    tool: str,
    args: dict[str, Any],
    why: str,
) -> None:
    model.play(m.tool(tool, args), m.structured(REPORT))
    out = review(client, head)
    (result,) = results(model.requests[1])
    assert result["is_error"] and why in result["content"], result
    assert SECRET not in result["content"] and "root:x:0" not in result["content"]
    assert json.loads(out.text) == REPORT


def test_search_does_not_follow_links_out_and_a_link_inside_is_read(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(
        m.tool("search", {"pattern": SECRET}),
        m.tool("read_file", {"path": "link-in"}),
        m.structured(REPORT),
    )
    review(client, head)
    assert result_text(model.requests[1]) == f"no match for {SECRET!r} under ."
    assert "return a - b" in result_text(model.requests[2])


def test_large_output_is_cut_and_says_how_to_read_on(
    model: AnthropicServer,
    client: anthropic.Anthropic,
    github: GitHubServer,
    pr: tuple[Worktrees, Path, str],
    settings: Settings,
) -> None:
    worktrees, mirror, _ = pr
    big = "".join(f"value_{i} = {i}\n" for i in range(1, 2001))
    sha = seed(github.repo(REPO).path, BRANCH, {"big.py": big})
    token = github.app_token_for(github.repo(REPO).installation_id or 0)
    model.play(
        m.tool("read_file", {"path": "big.py"}),
        m.tool("read_file", {"path": "big.py", "start_line": 1999}),
        m.tool("search", {"pattern": "value_"}),
        m.tool("read_file", {"path": "big.py", "start_line": 5000}),
        m.structured(REPORT),
    )
    with review_checkout(worktrees, REPO, mirror, sha, settings=settings, token=token) as co:
        review(client, co, ReviewLimits(max_output_chars=2000))
    first = result_text(model.requests[1])
    assert len(first) <= 2000 and first.startswith("     1\tvalue_1 = 1")
    last_shown = int(first.splitlines()[-2].split("\t")[0])
    assert first.endswith(f"[cut at line {last_shown}; read on with start_line={last_shown + 1}]")
    assert result_text(model.requests[2]) == "  1999\tvalue_1999 = 1999\n  2000\tvalue_2000 = 2000"
    found = result_text(model.requests[3])
    assert len(found) <= 2000 and found.endswith(
        "more matching lines not shown; narrow the search]"
    )
    assert "has 2000 line(s)" in result_text(model.requests[4])


def test_a_stubborn_model_is_stopped_at_the_step_cap_and_still_answers(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    def stubborn(body: dict[str, Any]) -> Reply:
        if body["tool_choice"] == {"type": "none"}:
            return m.structured(REPORT)
        # One more look, always somewhere else: never a loop a repeat check would catch.
        return m.tool("read_file", {"path": "calc.py", "start_line": len(body["messages"])})

    model.responder = stubborn
    out = review(client, head, ReviewLimits(max_steps=3))

    assert out.stopped == "step_cap" and out.detail == "3 steps"
    assert json.loads(out.text) == REPORT and not out.error
    assert (out.steps, out.tool_calls) == (4, 3)
    reqs = model.requests
    assert [r["tool_choice"]["type"] for r in reqs] == ["auto", "auto", "auto", "none"]
    last = reqs[-1]
    assert last["output_config"]["format"]["schema"] == output_schema()
    final = last["messages"][-1]["content"]
    assert len(results(last)) == 1  # the last tool call was answered before asking
    assert "Your tools are spent (3 steps)" in final[-1]["text"]


def test_a_model_that_will_not_stop_calling_tools_ends_with_a_clear_error(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.responder = lambda body: m.tool("list_files", {})  # even when told not to
    out = review(client, head, ReviewLimits(max_steps=2))
    assert out.stopped == "step_cap" and out.text == "" and len(model.requests) == 3
    assert "asked for its report without tools, the model gave none (tool_use)" in out.error


def test_an_idle_model_answers_at_once_and_an_empty_answer_is_an_error(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(m.structured(REPORT))
    out = review(client, head)
    assert (out.stopped, out.steps, out.tool_calls) == ("answered", 1, 0)
    assert json.loads(out.text) == REPORT
    model.play(Reply([], stop_reason="end_turn"))
    empty = review(client, head)
    assert empty.text == "" and "no answer (end_turn)" in empty.error


def test_the_tool_call_cap_answers_every_call_it_refuses(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(
        many_calls(
            ("read_file", {"path": "calc.py"}),
            ("read_file", {"path": "test_calc.py"}),
            ("read_file", {"path": "NOTES.md"}),
        ),
        m.structured(REPORT),
    )
    out = review(client, head, ReviewLimits(max_tool_calls=2))
    assert out.stopped == "tool_cap" and out.tool_calls == 2
    answered = results(model.requests[1])
    assert [r["tool_use_id"] for r in answered] == [f"toolu_multi_{i}" for i in range(3)]
    assert [r["is_error"] for r in answered] == [False, False, True]
    assert "tool calls are spent" in answered[2]["content"]
    assert model.requests[1]["tool_choice"] == {"type": "none"}


def test_the_cost_cap_stops_before_a_call_that_could_cross_it(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    # claude-test is priced as the most expensive listed model ($10 / $50): $1 a call.
    dear = {"input_tokens": 100_000, "output_tokens": 50}
    cap = 10 / 3

    def greedy(body: dict[str, Any]) -> Reply:
        if body["tool_choice"] == {"type": "none"}:
            return m.structured(REPORT, usage=dear)
        return m.tool("search", {"pattern": "add"}, usage=dear)

    model.responder = greedy
    seen: list[Any] = []
    out = review(client, head, ReviewLimits(max_cost_usd=cap), seen=seen)

    # After one $1 step the next could cost ~$1.66 (all of it read again, a full
    # max_tokens written): a step and the report could pass $3.33, the report alone cannot.
    assert out.stopped == "cost_cap" and "a step could cost" in out.detail
    assert [r["tool_choice"]["type"] for r in model.requests] == ["auto", "none"]
    assert json.loads(out.text) == REPORT
    assert out.cost == pytest.approx(2 * (100_000 * 10 + 50 * 50) / 1e6)
    assert out.cost <= cap and len(seen) == 2
    # The bound held: the report cost less than it could have.
    bound = worst_next("claude-test", model.requests[1], out.usage[0][1], [])
    assert out.usage[1][1].cost_usd < bound <= cap - out.usage[0][1].cost_usd


def test_a_cap_too_small_for_any_call_makes_none(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    out = review(client, head, ReviewLimits(max_cost_usd=0.05))
    assert model.requests == []
    assert out.stopped == "cost_cap" and out.text == "" and out.steps == 0
    assert "cost cap of $0.05 leaves no room for an answer" in out.error


class OverBudget(Exception):
    pass


def test_the_issue_budget_guard_sees_every_request_and_can_stop_the_review(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.responder = lambda body: m.tool("list_files", {})
    asked: list[dict[str, Any]] = []

    def guard(request: dict[str, Any]) -> None:
        asked.append(request)
        if len(asked) == 3:
            raise OverBudget("the issue's dollars are spent")

    seen: list[Any] = []
    with pytest.raises(OverBudget):
        review(client, head, seen=seen, before_call=guard)
    assert len(model.requests) == 2 and len(seen) == 2  # what was spent was reported
    assert asked[2]["messages"][-1]["content"][0]["type"] == "tool_result"


def test_the_time_cap_ends_the_tool_rounds(
    model: AnthropicServer, client: anthropic.Anthropic, head: ReviewCheckout
) -> None:
    model.play(m.tool("read_file", {"path": "calc.py"}, delay=1.2), m.structured(REPORT))
    out = review(client, head, ReviewLimits(max_seconds=1.0))
    assert out.stopped == "time_cap" and json.loads(out.text) == REPORT
    assert [r["tool_choice"]["type"] for r in model.requests] == ["auto", "none"]
    assert "return a - b" in result_text(model.requests[1])  # its tool call still ran


def test_the_review_checkout_is_the_sha_and_is_removed_afterwards(
    pr: tuple[Worktrees, Path, str], settings: Settings
) -> None:
    worktrees, mirror, sha = pr
    with review_checkout(worktrees, REPO, mirror, sha, settings=settings) as co:
        path = co.path
        assert git(path, "rev-parse", "HEAD", git_dir=_admin(mirror, path)).strip() == sha
        assert (path / "NOTES.md").read_text() == "Fixed add().\n"
        assert os.readlink(path / "link-in") == "calc.py"
        assert str(path) in git(mirror, "worktree", "list")
    assert not path.exists()
    assert str(path) not in git(mirror, "worktree", "list")
    assert not (mirror / "worktrees" / path.name).exists()
    with (
        pytest.raises(GitError, match="not a commit id"),
        review_checkout(worktrees, REPO, mirror, "--upload-pack=evil", settings=settings),
    ):
        pass


def test_a_review_checkout_left_by_a_dead_worker_is_swept(
    pr: tuple[Worktrees, Path, str], settings: Settings
) -> None:
    worktrees, mirror, sha = pr
    stale = settings.data_dir / "reviews" / "acme" / "widgets" / "0123abcd-dead"
    (stale / "sub").mkdir(parents=True)
    os.utime(stale, (0, 0))
    with review_checkout(worktrees, REPO, mirror, sha, settings=settings) as co:
        assert co.path.exists()
    assert not stale.exists()


def _admin(mirror: Path, path: Path) -> Path:
    return mirror / "worktrees" / path.name
