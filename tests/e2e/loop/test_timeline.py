"""What the issue and the pull request say while a loop goes: the status comment's
timeline, a pull request body that stays true after a review-fix turn, and no secret of
the worker's in anything loopbot writes to GitHub. Real RQ workers, real git, the local
GitHub and model."""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import asdict
from typing import Any

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Status
from bot.core.text.defuse import JOINER as J
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, label, open_issue, sample_repo

YML = "verify: python3 -m unittest -q\nmax_turns: 4\n"
FIX = m.replace("calc.py", "return a - b", "return a + b")
TEST_NEG = (
    "import unittest\nfrom calc import add\n\n\n"
    "class T(unittest.TestCase):\n    def test_neg(self):\n"
    "        self.assertEqual(add(-1, -1), -2)\n"
)


def report(verdict: str, findings: list[dict[str, Any]], **extra: Any) -> m.Reply:
    return m.structured({"verdict": verdict, "summary": "Reviewed.", "findings": findings} | extra)


SEV1 = {
    "severity": "sev1",
    "category": "tests",
    "path": "calc.py",
    "line": 2,
    "title": "no test for negatives",
    "body": "add(-1, -1) is not tested",
}
TOKENS = {"input_tokens": 100_000, "output_tokens": 10}
RESOLVED = [{"id": "F1", "status": "resolved", "why": "test_neg covers it"}]


class Script:
    """The agent's replies and the critic's, each in order; what the pull request's body
    said at each call of either (None before there is a pull request)."""

    def __init__(self, github: GitHubServer, agent: list[m.Reply], critic: list[m.Reply]):
        self.github = github
        self.agent, self.critic = deque(agent), deque(critic)
        self.bodies: list[tuple[str, str | None]] = []  # ("agent" | "critic", body)

    def __call__(self, body: dict[str, Any]) -> m.Item:
        critic = "output_config" in body
        repo = self.github.repo(REPO)
        pulls = list(repo.pulls)
        self.bodies.append(
            ("critic" if critic else "agent", repo.issues[pulls[0]].body if pulls else None)
        )
        return self.critic.popleft() if critic else self.agent.popleft()

    def at(self, who: str) -> list[str]:
        """The pull request's body at each call by ``who`` once it was open."""
        return [b for w, b in self.bodies if w == who and b is not None]


def record(redis: Redis) -> LoopRecord:
    found = Store(redis).get(LoopId(REPO, 1).key)
    assert found is not None
    return found


def pull_body(github: GitHubServer, r: LoopRecord) -> str:
    assert r.pr_number is not None, r
    return github.repo(REPO).issues[r.pr_number].body


def status_body(github: GitHubServer) -> str:
    (body,) = [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if "<!-- loopbot:status -->" in c["body"]
    ]
    return str(body)


def checklist(body: str) -> list[str]:
    """The status comment's timeline: its task-list lines, without the boxes (and the
    invisible joiners that keep a "#2" from linking)."""
    lines = body.replace(J, "").splitlines()
    return [line[6:] for line in lines if re.match(r"- \[[ x]\] ", line)]


def table_row(body: str) -> tuple[int, float, str]:
    """(turns, cost, verify) from the pull request body's table."""
    row = re.search(r"^\| (\d+) \| \$([\d.]+) \| `[^`]*` ([^|]+) \|$", body, re.MULTILINE)
    assert row is not None, body
    return int(row[1]), float(row[2]), row[3].strip()


def run_two_turns_and_a_sev1_round(
    github: GitHubServer, model: AnthropicServer, drain: Any, secret: str
) -> Script:
    """Turn 1 fails verify; turn 2 fixes it and opens the pull request; review round 1
    finds a sev1; the fix turn adds a test; review round 2 approves; the gate merges.
    The agent's final words of turn 2 and of the fix turn carry ``secret``."""
    script = Script(
        github,
        agent=[
            m.bash("cat calc.py"),
            m.text("I read the code; it looks fine."),
            FIX,
            m.text(f"Fixed add to use +. (debug: the webhook secret is {secret})", usage=TOKENS),
            m.write_file("test_neg.py", TEST_NEG),
            # The fix turn costs something the table can show ($0.30 at Sonnet's price).
            m.text(f"Added a test for negatives.\n\nSECRET={secret}", usage=TOKENS),
        ],
        critic=[
            report("request_changes", [SEV1]),
            report("approve", [], earlier_findings=RESOLVED),
        ],
    )
    model.responder = script
    sample_repo(github, loop_yml=YML)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    return script


def test_status_comment_timeline_pr_body_and_no_secret_on_github(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    secret = github.webhook_secret
    script = run_two_turns_and_a_sev1_round(github, model, drain, secret)
    r = record(redis)
    assert (r.status, r.reason, r.critic_round, r.total_turns) == (
        Status.COMPLETED,
        "merged",
        2,
        3,
    ), r

    # The status comment: its one-line state on top, then each step in order.
    body = status_body(github)
    assert body.index("completed") < body.index("- [x] ")
    lines = checklist(body)
    expected = [
        "turn 1 — verify failed (test_add)",
        "turn 2 — verify passed",
        f"[PR #{r.pr_number}]({r.pr_url}) opened",  # loopbot's own pull request: a link
        "review round 1 — 1 sev1",
        "back to coding (findings)",
        "turn 3 — verify passed",  # the fix turn, numbered over the issue's whole life
        "review round 2 — no findings",
        f"merged as {r.merge_sha[:7]}",
    ]
    assert len(lines) == len(expected), lines
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(start), (line, start, lines)

    # The pull request's body after the review-fix turn: three turns, the cost then,
    # verify passed; the summary is still the one the pull request was opened with.
    before, after = script.at("critic")
    assert table_row(before)[0] == 2 and table_row(before)[2] == "passed"
    turns, cost, verify = table_row(after)
    assert (turns, verify) == (3, "passed") and cost > table_row(before)[1] > 0
    final = pull_body(github, r)
    assert final == after and "Fixed add to use +." in final
    assert final.startswith(f"Closes #{r.issue}\n\n")

    # The secret in the agent's words reached nothing on GitHub: comments, bodies,
    # reviews, check runs, commit messages on the branch and on main.
    repo = github.repo(REPO)
    written = json.dumps(
        [
            list(repo.comments.values()),
            [asdict(i) for i in repo.issues.values()],
            repo.reviews,
            repo.review_comments,
            list(repo.check_runs.values()),
        ],
        default=str,
    )
    assert "[redacted]" in final and secret not in written
    pushed = [e["data"]["sha"] for e in Store(redis).events(r.key) if e["kind"] == "pushed"]
    assert len(pushed) == 2  # turn 2 and the fix turn (turn 1 changed nothing)
    for ref in ("main", *pushed):  # the branch is deleted; its commits are still there
        assert secret not in gitrepo.git(repo.path, "log", "--format=%B", ref)


def test_a_failing_fix_turn_shows_in_the_pull_request_body(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    script = Script(
        github,
        agent=[
            FIX,
            m.text("Fixed add to use +."),
            m.replace("calc.py", "return a + b", "return a * b"),  # the fix turn breaks it
            m.text("Tried something.", usage=TOKENS),
            m.replace("calc.py", "return a * b", "return a + b"),
            m.write_file("test_neg.py", TEST_NEG),
            m.text("Added a test for negatives."),
        ],
        critic=[
            report("request_changes", [SEV1]),
            report("approve", [], earlier_findings=RESOLVED),
        ],
    )
    model.responder = script
    sample_repo(github, loop_yml=YML)
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    assert (r.status, r.reason, r.total_turns) == (Status.COMPLETED, "merged", 3), r
    # The agent's calls once the pull request was open: the failing fix turn's two, then
    # the next fix turn's first, by which time the failed turn is in the body.
    reviewed, during_fix, after_failed_fix = script.at("agent")[:3]
    assert reviewed == during_fix == script.at("critic")[0]
    assert table_row(reviewed)[0] == 1 and table_row(reviewed)[2] == "passed"
    turns, cost, verify = table_row(after_failed_fix)
    assert (turns, verify) == (2, "failed (exit 1)") and cost >= 0.30
    assert "Fixed add to use +." in after_failed_fix  # the summary it was opened with
    turns, _, verify = table_row(pull_body(github, r))
    assert (turns, verify) == (3, "passed")
