"""Evidence from the base, end to end: verify on the base commit before any change, no
pull request for a turn that changes nothing, and a test asked for when verify could not
tell a fix from no fix. Real RQ workers, real git and sandbox, local GitHub and model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Reason, Status
from bot.core.rules.loop import turns as transitions
from bot.core.text import prompts
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.loop import evidence
from tests.conftest import Web
from tests.helpers import REPO, label, open_issue, sample_repo

NO_REVIEW = """\
verify: {verify}
max_turns: {max_turns}
critic:
  enabled: false
merge:
  enabled: false
"""
REVIEWED = "verify: python3 -m unittest -q\nmax_turns: 4\n"  # critic and merge gate on
# add() is right and tested; mul() is wrong and untested: verify passes on the base.
CALC_OK_ADD = """\
def add(a, b):
    return a + b


def mul(a, b):
    return a + b
"""
TEST_ADD = """\
import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)
"""
TEST_MUL = """\
import unittest

from calc import mul


class MulTest(unittest.TestCase):
    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)
"""
FIX_MUL = m.replace(
    "calc.py", "def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b"
)
UNFIX_MUL = m.replace(
    "calc.py", "def mul(a, b):\n    return a * b", "def mul(a, b):\n    return a + b"
)
FIX_ADD = m.replace("calc.py", "return a - b", "return a + b")
CLAIM = "I fixed the issue; all tests pass."


def config(verify: str = "python3 -m unittest -q", max_turns: int = 4) -> str:
    return NO_REVIEW.format(verify=verify, max_turns=max_turns)


def passing_base(github: GitHubServer, yml: str) -> int:
    """The repository whose verify passes before any change, and an issue verify misses."""
    sample_repo(github, loop_yml=yml, extra={"calc.py": CALC_OK_ADD, "test_calc.py": TEST_ADD})
    return open_issue(github, "mul() adds", "mul(2, 3) returns 5; it should be 6.")


def record(redis: Redis, n: int = 1) -> Any:
    r = Store(redis).get(f"{REPO}#{n}")
    assert r is not None
    return r


def events(redis: Redis, n: int = 1, kind: str | None = None) -> list[dict[str, Any]]:
    found = Store(redis).events(f"{REPO}#{n}")
    return [e for e in found if kind is None or e["kind"] == kind]


def agent_requests(model: AnthropicServer) -> list[dict[str, Any]]:
    return [b for b in model.requests if "output_config" not in b]  # not the critic's


def first_prompt(request: dict[str, Any]) -> str:
    content = request["messages"][0]["content"]
    return content if isinstance(content, str) else json.dumps(content)


def last_prompt(request: dict[str, Any]) -> str:
    content = request["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))


def status_comment(github: GitHubServer, n: int) -> str:
    bodies = [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if c["_issue"] == n and c["user"]["type"] == "Bot" and "### loopbot" in c["body"]
    ]
    assert len(bodies) == 1, bodies
    return str(bodies[0])


def main_sha(github: GitHubServer) -> str:
    sha = github.ref(REPO, "main")
    assert sha is not None
    return sha


# -- end to end ---------------------------------------------------------------------------


def test_base_passes_and_the_agent_only_claims_a_fix_no_pull_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Issue 11's story: verify already passes on the default branch, the agent changes
    nothing and says it fixed the issue, twice. No pull request, no merge, the issue
    stays open and its status comment says why."""
    n = passing_base(github, REVIEWED)  # critic and gate on: nothing may reach them
    model.play(
        m.bash("cat calc.py test_calc.py"),
        m.text(CLAIM),  # turn 1: read, then claim
        m.bash("python3 -m unittest -q"),
        m.text(CLAIM),  # turn 2: ran the tests, which pass, and claims again
    )
    base = main_sha(github)
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert (r.status, r.reason, r.turn, r.idle_turns) == (Status.FAILED, "no_changes", 2, 2), r
    assert r.base_sha == base
    assert r.base_verify["passed"] is True and r.base_verify["exit_code"] == 0
    assert r.base_verify["cached"] is False and r.base_verify["sha"] == base
    assert "OK" in r.base_verify["tail"]
    repo = github.repo(REPO)
    assert repo.pulls == {}  # no pull request was ever opened
    assert github.ref(REPO, "loop/issue-1") is None  # nothing to push either
    assert repo.issues[n].state == "open" and main_sha(github) == base
    # The first prompt said verify passing proves nothing; the second, that no change is
    # no fix; there was no third model turn and no critic call.
    requests = agent_requests(model)
    assert len(requests) == len(model.requests) == 4
    first = first_prompt(requests[0])
    assert f"ran on the base commit {base[:12]} and passed (exit 0)" in first
    assert "proves nothing" in first and "test that fails without your fix" in first
    second = last_prompt(requests[2])
    assert "identical to the base commit" in second and "not a fix" in second
    assert "add(2, 3)" not in second  # the continuation never re-sends the issue
    comment = status_comment(github, n)
    assert "no_changes" in comment and "changed nothing" in comment
    assert "no pull request was opened" in comment and "/loop-restart" in comment
    assert [e["data"]["idle_turns"] for e in events(redis, n, "no_change")] == [1, 2]


def test_an_edit_and_its_revert_is_no_change(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A flip-flopping agent: it fixes mul(), is asked for a test, reverts the fix
    instead, then claims success. Its commits add up to nothing: no pull request."""
    n = passing_base(github, config(max_turns=5))
    model.play(
        FIX_MUL,
        m.text("Fixed mul."),  # turn 1: a real change, no test
        UNFIX_MUL,
        m.text("On reflection the original was right; reverted."),  # turn 2
        m.text(CLAIM),  # turn 3
    )
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert (r.status, r.reason, r.turn) == (Status.FAILED, "no_changes", 3), r
    assert len(events(redis, n, "test_requested")) == 1
    # The branch was pushed (two commits), yet nothing was proposed.
    branch = github.ref(REPO, "loop/issue-1")
    assert branch is not None and branch != main_sha(github)
    assert github.repo(REPO).pulls == {}
    assert [e["data"]["turn"] for e in events(redis, n, "no_change")] == [2, 3]


def test_base_failure_reaches_the_first_prompt_and_the_pull_request_body(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=config())  # add() subtracts; its test fails on the base
    n = open_issue(github)
    base = main_sha(github)
    model.play(
        m.bash("python3 -m unittest -q"),
        FIX_ADD,
        m.text("Fixed add to use +."),
    )
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert (r.status, r.reason) == (Status.COMPLETED, "pr_opened"), r
    assert r.base_verify["passed"] is False and r.base_verify["exit_code"] == 1
    first = first_prompt(model.requests[0])
    assert f"ran on the base commit {base[:12]} and failed (exit 1)" in first
    assert "AssertionError: -1 != 5" in first  # the tail of the base run
    assert "proves nothing" not in first
    # A fix shown by the pair: failed on the base, passes on the head. No test asked for.
    assert r.last_verify["passed"] is True and r.last_verify["sha"] == r.head_sha
    assert events(redis, n, "test_requested") == [] and r.tests_changed == []
    body = github.repo(REPO).issues[r.pr_number].body
    line = f"verify on base {base[:7]}: failed (exit 1) → on head {r.head_sha[:7]}: passed"
    assert line in body and "tests changed: none" in body


def test_base_verify_is_cached_per_base_commit(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # A slow verify, so that a second run could not hide inside the cached path.
    n1 = passing_base(github, config("sleep 1; python3 -m unittest -q", max_turns=2))
    n2 = open_issue(github, "mul() is wrong", "mul(3, 3) is 6.")
    model.responder = lambda body: m.text(CLAIM)
    base = main_sha(github)

    label(github, "writer", n1)
    drain()
    label(github, "writer", n2)
    drain()

    first = events(redis, n1, "base_verify")
    second = events(redis, n2, "base_verify")
    assert len(first) == len(second) == 1
    assert first[0]["data"]["cached"] is False and first[0]["data"]["seconds"] >= 1
    assert second[0]["data"]["cached"] is True and second[0]["data"]["sha"] == base
    r2 = record(redis, n2)
    assert r2.base_verify["cached"] is True and r2.base_verify["passed"] is True
    # The cached path ran no command: from the worktree to the evidence took far less
    # than the one-second verify.
    ready = events(redis, n2, "worktree_ready")[-1]["at"]
    assert second[0]["at"] - ready < 0.9
    key = evidence.cache_key(REPO, base, "sleep 1; python3 -m unittest -q", None, [False, 600])
    assert 0 < int(redis.ttl(key)) <= evidence.CACHE_TTL

    # A new base commit is a new result.
    gitrepo.seed(github.repo(REPO).path, "main", {"NOTES.md": "notes\n"}, "notes")
    n3 = open_issue(github, "mul() once more", "still wrong")
    label(github, "writer", n3)
    drain()
    third = events(redis, n3, "base_verify")
    assert third[0]["data"]["cached"] is False and third[0]["data"]["sha"] == main_sha(github)
    assert third[0]["data"]["sha"] != base


def test_base_passes_so_one_turn_asks_for_a_test(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    n = passing_base(github, config())
    base = main_sha(github)
    model.play(
        FIX_MUL,
        m.text("Fixed mul; all tests pass."),  # turn 1: the fix, no test
        m.write_file("test_mul.py", TEST_MUL),
        m.text("Added a test for mul."),  # turn 2: the test
    )
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert (r.status, r.reason, r.turn) == (Status.COMPLETED, "pr_opened", 2), r
    asked = last_prompt(model.requests[2])
    assert "also passed on the base commit" in asked and "Add a test" in asked
    assert [e["data"]["turn"] for e in events(redis, n, "test_requested")] == [1]
    assert r.tests_changed == ["test_mul.py"]
    body = github.repo(REPO).issues[r.pr_number].body
    assert f"verify on base {base[:7]}: passed (exit 0) → on head {r.head_sha[:7]}: passed" in body
    assert "tests changed: `test_mul.py`" in body


def test_a_stubborn_agent_gets_one_request_for_a_test_then_the_pull_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    n = passing_base(github, config(max_turns=6))
    model.play(
        FIX_MUL,
        m.text("Fixed mul."),
        m.text("The existing tests pass; a new test is not needed."),  # refuses
    )
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert (r.status, r.reason, r.turn) == (Status.COMPLETED, "pr_opened", 2), r
    assert len(model.requests) == 3  # asked once, never again
    assert len(events(redis, n, "test_requested")) == 1
    assert r.tests_changed == []
    assert "tests changed: none" in github.repo(REPO).issues[r.pr_number].body


# -- the pure rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "tests/test_calc.py",
        "test/unit/helpers.py",
        "pkg/tests/data.json",
        "test_calc.py",
        "calc_test.py",
        "pkg/server_test.go",
        "src/app.test.ts",
        "src/App.test.jsx",
        "web/button.spec.tsx",
        "spec/models/user_spec.rb",
        "src/__tests__/thing.js",
        "conftest.py",
    ],
)
def test_these_are_tests(path: str) -> None:
    assert evidence.is_test_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "calc.py",
        "testing_utils.py",  # "test" in a name is not a test
        "src/contest.py",
        "latest/app.py",
        "docs/testing.md",
        "attestation/main.go",
        "",
    ],
)
def test_these_are_not(path: str) -> None:
    assert not evidence.is_test_path(path)


def test_tests_changed_keeps_only_tests_sorted_once() -> None:
    paths = ["calc.py", "tests/b_test.py", "test_a.py", "README.md", "test_a.py"]
    assert evidence.tests_changed(paths) == ["test_a.py", "tests/b_test.py"]


def _after(**kw: Any) -> transitions.Verified | transitions.Continue | transitions.Stop:
    args: dict[str, Any] = {
        "end": "finished",
        "verify_passed": True,
        "has_changes": True,
        "cost": 0.0,
        "max_cost": 5.0,
        "verify_tail": "FAIL: test_x",
        "idle_turns": 0,
        "base_passed": True,
        "tests_changed": ["test_x.py"],
        "test_asked": False,
    }
    return transitions.after_turn(**{**args, **kw})


def test_no_change_continues_once_then_stops_whatever_verify_says() -> None:
    for passed in (True, False):
        first = _after(has_changes=False, idle_turns=1, verify_passed=passed)
        assert isinstance(first, transitions.Continue)
        assert "identical to the base commit" in first.failure
        assert ("verify failed" in first.failure) is not passed
        second = _after(has_changes=False, idle_turns=2, verify_passed=passed)
        assert isinstance(second, transitions.Stop)
        assert (second.status, second.reason) == (Status.FAILED, Reason.NO_CHANGES)
        assert "/loop-restart" in second.detail


def test_a_test_is_asked_for_once_and_only_when_verify_proved_nothing() -> None:
    asked = _after(tests_changed=[])
    assert isinstance(asked, transitions.AskForTest)
    assert isinstance(_after(tests_changed=[], test_asked=True), transitions.Verified)
    assert isinstance(_after(), transitions.Verified)  # a test changed
    assert isinstance(_after(tests_changed=[], base_passed=False), transitions.Verified)
    assert isinstance(_after(tests_changed=[], base_passed=None), transitions.Verified)
    failing = _after(tests_changed=[], verify_passed=False)
    assert type(failing) is transitions.Continue and "verify failed" in failing.failure


def test_evidence_line_and_prompt_texts() -> None:
    base = {"sha": "a" * 40, "passed": False, "exit_code": 1, "tail": "x ``` y"}
    head = {"sha": "b" * 40, "passed": True, "exit_code": 0}
    assert evidence.evidence_line(base, head) == (
        "verify on base aaaaaaa: failed (exit 1) → on head bbbbbbb: passed"
    )
    timed = {**base, "timed_out": True, "exit_code": 124}
    assert "failed (timed out)" in evidence.evidence_line(timed, head)
    assert evidence.evidence_line({}, head).startswith("verify on base: not run")
    text = prompts.base_evidence("make test", base)
    assert "failed (exit 1)" in text and "````\nx ``` y\n````" in text
    passed = prompts.base_evidence("make test", {**base, "passed": True, "exit_code": 0})
    assert "proves nothing" in passed and "x ``` y" not in passed
    assert "Before any change" not in prompts.issue_prompt("o/r", 1, "t", "b", "make test")


def test_cache_key_names_the_commands() -> None:
    a = evidence.cache_key(REPO, "s" * 40, "make test", None)
    assert a == evidence.cache_key(REPO, "s" * 40, "make test", "")
    assert a != evidence.cache_key(REPO, "s" * 40, "make check", None)
    assert a != evidence.cache_key(REPO, "s" * 40, "make test", "make deps")
    assert a != evidence.cache_key(REPO, "t" * 40, "make test", None)
    # The sandbox it ran in too: network on or off, the timeout (red team).
    assert evidence.cache_key(REPO, "s" * 40, "make test", None, [False, 600]) != (
        evidence.cache_key(REPO, "s" * 40, "make test", None, [True, 600])
    )
    assert not evidence.cacheable({"passed": False, "timed_out": True})


def test_files_hidden_in_ignored_paths_never_make_verify_pass(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Red team: a ``calc/`` package in a directory the agent made git ignore shadows
    ``calc.py``, so verify passed on files the commit never carried and the gate merged
    the bug. The harness removes ignored files the turn left before verify runs."""
    from tests.e2e.review.test_review_merge import YML, main_log, record, report

    new_test = (
        "import unittest\nfrom calc import add\n\n"
        "class T(unittest.TestCase):\n    def test_one(self):\n"
        "        self.assertEqual(add(1, 1), 2)\n"
    )
    model.play(
        m.write_file("calc/.gitignore", "*\n"),
        m.write_file("calc/__init__.py", "def add(a, b):\n    return a + b\n"),
        m.write_file("test_more.py", new_test),
        m.text("Fixed add."),
        # Told what was removed, the agent now fixes the real file.
        m.replace("calc.py", "return a - b", "return a + b"),
        m.text("Fixed calc.py itself."),
        report(),
    )
    sample_repo(github, loop_yml=YML)
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    removed = [e["data"] for e in Store(redis).events(r.key) if e["kind"] == "ignored_removed"]
    assert removed and "calc/__init__.py" in removed[0]["paths"], removed
    prompts_ = [b for b in model.requests if "output_config" not in b]
    assert any("calc/__init__.py" in json.dumps(b["messages"][-1]) for b in prompts_[1:])
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    path = github.repo(REPO).path
    assert "a + b" in gitrepo.git(path, "show", "main:calc.py")  # merged only the real fix
    assert len(main_log(github)) == 2


def test_an_empty_test_file_is_not_a_test(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Red team: a file named like a test but empty (or blank lines) counted as a changed
    test, so loopbot never asked for a real one."""
    n = passing_base(github, config())
    model.play(
        FIX_MUL,
        m.write_file("test_mul.py", "\n\n"),
        m.text("Fixed mul and added a test."),  # turn 1: the fix and an empty "test"
        m.write_file("test_mul.py", TEST_MUL),
        m.text("Added a real test for mul."),  # turn 2, asked for a test
    )
    label(github, "writer", n)
    drain()
    r = record(redis, n)
    assert [e["data"]["turn"] for e in events(redis, n, "test_requested")] == [1]
    assert (r.status, r.tests_changed) == (Status.COMPLETED, ["test_mul.py"]), r
