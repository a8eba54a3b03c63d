"""Critic and merge gate end to end: real RQ worker, real git, local GitHub and model."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.core.text.defuse import JOINER as J
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, comment, content_text, label, open_issue, sample_repo

YML = "verify: python3 -m unittest -q\nmax_turns: 3\n"
FIX = m.replace("calc.py", "return a - b", "return a + b")
KEY = f"{REPO}#1"


def report(
    verdict: str = "approve",
    findings: list[dict[str, Any]] | None = None,
    summary: str = "Looks right.",
    earlier: list[dict[str, Any]] | None = None,
) -> m.Reply:
    """A critic's answer; ``earlier``: its answers on open findings from earlier rounds."""
    answer = {"verdict": verdict, "summary": summary, "findings": findings or []}
    return m.structured(answer | ({"earlier_findings": earlier} if earlier else {}))


def still(fid: str = "F1", status: str = "open") -> list[dict[str, Any]]:
    return [{"id": fid, "status": status, "why": f"{fid} is {status}"}]


def finding(
    sev: str, path: str, line: int | None, title: str = "t", cat: str = "correctness"
) -> dict[str, Any]:
    return {
        "severity": sev,
        "category": cat,
        "path": path,
        "line": line,
        "title": title,
        "body": f"{title} body",
    }


def run(github: GitHubServer, drain: Any, yml: str = YML) -> None:
    sample_repo(github, loop_yml=yml)
    n = open_issue(github)
    label(github, "writer", n)
    drain()


def record(redis: Redis) -> Any:
    return Store(redis).get(KEY)


def main_log(github: GitHubServer) -> list[str]:
    return gitrepo.git(github.repo(REPO).path, "log", "--format=%s", "main").splitlines()


def ci_status(github: GitHubServer, sha: str | None, state: str, context: str) -> None:
    """A commit status on ``sha``, as another CI system would set it."""
    with github.as_user("acme") as u:
        u.post(f"/repos/{REPO}/statuses/{sha}", json={"state": state, "context": context})


def is_critic(body: dict[str, Any]) -> bool:
    return "output_config" in body


def fixing_agent(
    on_review: Callable[[], object] | None = None,
) -> Callable[[dict[str, Any]], m.Item]:
    """The agent fixes add() in one turn; the critic approves, calling ``on_review`` first
    (a fault injected as the review lands, say)."""

    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            if on_review is not None:
                on_review()
            return report()
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return m.text("Fixed add.")
        return FIX

    return agent


def test_clean_report_reviews_inline_and_squash_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.text("Fixed add."),
        report(
            findings=[
                finding("sev3", "calc.py", 2, "nit: docstring", "docs"),
                finding("sev2", "README.md", 1, "mention add", "docs"),
            ]
        ),
    )
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    repo = github.repo(REPO)
    reviews = repo.reviews[r.pr_number]
    assert len(reviews) == 1 and reviews[0]["state"] == "COMMENTED"
    assert "sev1: 0 · sev2: 1 · sev3: 1" in reviews[0]["body"]
    assert "mention add" in reviews[0]["body"]  # not on a changed line: listed in the body
    inline = repo.review_comments[r.pr_number]
    assert [(c["path"], c["line"]) for c in inline] == [("calc.py", 2)]
    critic_runs = [c for c in repo.check_runs.values() if c["name"] == "loopbot/critic"]
    assert critic_runs[-1]["conclusion"] == "success"
    assert critic_runs[-1]["output"]["annotations"][0]["annotation_level"] == "notice"
    # A real squash merge: one new commit on main, with the fix; branch deleted; issue closed.
    assert main_log(github)[0] == f"loop: add() subtracts (#{r.pr_number})"
    assert "return a + b" in github.file_at(REPO, "main", "calc.py")  # type: ignore[operator]
    assert github.ref(REPO, "loop/issue-1") is None
    assert repo.issues[1].state == "closed"
    assert r.reviewed_sha == repo.pulls[r.pr_number].closed_head_sha
    critic_req = next(b for b in model.requests if is_critic(b))
    assert critic_req["output_config"]["format"]["type"] == "json_schema"
    assert "diff --git a/calc.py" in content_text(critic_req["messages"][0])
    assert "sev3" in json.dumps(critic_req["output_config"])


def test_agent_text_cannot_close_other_issues_or_ping_people(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    n = open_issue(github)
    other = open_issue(github)  # an unrelated issue the agent names
    model.play(FIX, m.text(f"Fixed add(). This also fixes #{other}. cc @writer"), report())
    label(github, "writer", n)
    drain()
    r = record(redis)
    assert r.status == Status.COMPLETED, r
    repo = github.repo(REPO)
    assert repo.issues[n].state == "closed" and repo.issues[other].state == "open"
    body = repo.issues[r.pr_number].body
    assert f"fixes #{J}{other}" in body and f"cc @{J}writer" in body  # no close, no ping
    message = gitrepo.git(repo.path, "log", "-1", "--format=%B", "main")
    assert f"Closes #{n}." in message
    assert "Merged by loopbot after 1 turn and 1 review round" in message


def test_issue_closed_during_review_refuses(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def close_during_review(body: dict[str, Any]) -> m.Item:
        with github.as_user("writer") as u:
            u.patch(f"/repos/{REPO}/issues/1", json={"state": "closed"})
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = close_during_review
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "issue_closed"), r
    assert len(main_log(github)) == 1  # only the initial commit: nothing merged
    pr_comments = [c for c in github.repo(REPO).comments.values() if c["_issue"] == r.pr_number]
    assert any("did not merge" in c["body"] and "closed" in c["body"] for c in pr_comments)


def test_sev1_goes_back_to_coding_then_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.text("Fixed."),
        report("request_changes", [finding("sev1", "calc.py", 2, "no test for negatives")]),
        m.write_file(
            "test_neg.py",
            "import unittest\nfrom calc import add\n\n\n"
            "class T(unittest.TestCase):\n    def test_neg(self):\n"
            "        self.assertEqual(add(-1, -1), -2)\n",
        ),
        m.text("Added a test for negatives."),
        report(earlier=still("F1", "resolved")),
    )
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason, r.critic_round) == (Status.COMPLETED, "merged", 2), r
    # The further turn's prompt carried the finding, on the same conversation.
    fix_turn = [b for b in model.requests if not is_critic(b)][2]
    texts = json.dumps(fix_turn["messages"][-1])
    assert "no test for negatives" in texts and "sev1" in texts
    assert len(github.repo(REPO).reviews[r.pr_number]) == 2
    assert github.file_at(REPO, "main", "test_neg.py") is not None


def test_the_same_sev1_three_times_asks_a_human_and_restart_resets_the_rounds(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The critic raises one problem every round, worded with different case and stops.
    titles = iter(
        [
            "Division by zero is not handled",
            "division by zero is NOT handled.",
            "Division by zero -- is not handled!",
        ]
    )
    attempts: list[int] = []
    rounds: list[int] = []

    def stuck(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            rounds.append(1)
            earlier = still() if len(rounds) > 1 else None  # F1, answered and raised again
            return report(
                "request_changes", [finding("sev1", "calc.py", 2, next(titles))], earlier=earlier
            )
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return m.text("Tried again.")
        attempts.append(1)
        return m.write_file(f"attempt{len(attempts)}.txt", "x\n")

    model.play(FIX, m.text("Fixed."))
    model.responder = stuck
    run(github, drain, YML + "critic:\n  max_rounds: 6\n")
    r = record(redis)
    assert (r.status, r.reason, r.critic_round) == (Status.REFUSED, "needs_human", 3), r
    assert "raised in 3 review rounds" in r.detail
    assert "loop:needs-human" in github.repo(REPO).issues[1].labels
    reviews = github.repo(REPO).reviews[r.pr_number]
    assert len(reviews) == 3 and "A person should take it from here" in reviews[-1]["body"]
    assert "will address them" in reviews[0]["body"]
    assert len(main_log(github)) == 1  # nothing merged
    # A person restarts it: review rounds and the repeat count start again. The head
    # keeps its verdict, so it takes a change for the critic to look again.
    model.responder = None
    model.play(
        m.write_file("zero.txt", "handled\n"),
        m.text("Handled division by zero."),
        report(earlier=still("F1", "resolved")),
    )
    comment(github, "writer", 1, "/loop-restart")
    drain()
    r = record(redis)
    assert (r.status, r.critic_round, r.sev1_rounds) == (Status.COMPLETED, 1, {}), r


def test_a_pull_request_that_edits_ci_goes_to_a_human(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.write_file(".github/workflows/ci.yml", "on: push\njobs: {}\n"),
        m.text("Fixed, and simplified CI."),
        report(),
    )
    # An App granted `workflows` (without it, the change never reaches the pull request:
    # tests/e2e/loop/test_push_refusals.py).
    sample_repo(github, loop_yml=YML, permissions={**github.registered()[0], "workflows": "write"})
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "`.github/workflows/ci.yml`" in r.detail
    assert "loop:needs-human" in github.repo(REPO).issues[1].labels
    assert len(main_log(github)) == 1  # nothing merged
    refusals = [c for c in github.repo(REPO).comments.values() if "did not merge" in c["body"]]
    assert len(refusals) == 1 and "protected paths" in refusals[0]["body"]
    # The agent was told up front.
    assert "`.github/**` alone" in model.requests[0]["system"][0]["text"]


def test_a_diff_too_large_to_review_whole_goes_to_a_human(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    data = "".join(f"row {i}: {'x' * 60}\n" for i in range(3000))  # ~200 KB of diff
    model.play(FIX, m.write_file("data.txt", data), m.text("Fixed, with data."), report())
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "too large for the critic to read whole" in r.detail
    critic = next(b for b in model.requests if is_critic(b))
    assert "The diff was cut at" in json.dumps(critic["messages"])
    assert len(main_log(github)) == 1  # nothing merged


def test_two_loops_on_one_file_the_second_resolves_the_conflict_then_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # A backlog drained in parallel: both loops edit README.md from the same main.
    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            return report()
        which = "one" if "issue #1" in body["messages"][0]["content"][0]["text"] else "two"
        last = body["messages"][-1]["content"]
        if any(b.get("type") == "tool_result" for b in last):
            return m.text(f"Done {which}.")
        if "conflict markers" in json.dumps(last):
            return m.write_file("README.md", "# widgets\nfrom loop one\nfrom loop two\n")
        return m.write_file("README.md", f"# widgets\nfrom loop {which}\n")

    sample_repo(github, loop_yml="verify: grep -q widgets README.md\n")
    first, second = open_issue(github, "one", "Add a line."), open_issue(github, "two", "Too.")
    model.responder = agent
    label(github, "writer", first)
    label(github, "writer", second)
    drain()
    store = Store(redis)
    one, two = store.get(f"{REPO}#{first}"), store.get(f"{REPO}#{second}")
    assert one is not None and one.status == Status.COMPLETED, one
    assert two is not None and (two.status, two.check_fixes) == (Status.COMPLETED, 1), two
    merged = [e["data"] for e in store.events(f"{REPO}#{second}") if e["kind"] == "base_merged"]
    assert merged == [{"base": "main", "conflicts": ["README.md"]}]
    assert github.file_at(REPO, "main", "README.md") == (
        "# widgets\nfrom loop one\nfrom loop two\n"
    )
    assert len(main_log(github)) == 3  # the seed, then one squash per loop
    prompts = [json.dumps(b["messages"][-1]) for b in model.requests if not is_critic(b)]
    assert any("`README.md`" in p and "conflict markers" in p for p in prompts)


def test_loops_of_one_repository_take_turns_to_catch_up_and_all_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Three loops of one repository reach the gate together; each merge moves main. With
    one catch-up allowed (``max_fix_turns: 1``), a loop sent back to merge main in while
    another was doing the same would lose the race and be refused. The repository's
    merge slot makes them take turns: a loop catches up only when no other loop is
    merging or catching up, so every loop merges, catching up at most once."""

    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            return report()
        which = body["messages"][0]["content"][0]["text"].split("issue #")[1].split()[0]
        last = body["messages"][-1]["content"]
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
            return m.text(f"Done {which}.")
        return m.write_file(f"notes/{which.strip('.:')}.md", "noted\n")

    sample_repo(github, loop_yml="verify: test -d notes\nmerge:\n  max_fix_turns: 1\n")
    issues = [open_issue(github, f"note {i}", "Add a note.") for i in range(3)]
    model.responder = agent
    for n in issues:
        label(github, "writer", n)
    drain(rounds=40)
    store = Store(redis)
    records = [store.get(f"{REPO}#{n}") for n in issues]
    assert all(r is not None and r.status == Status.COMPLETED for r in records), records
    assert all(r is not None and r.check_fixes <= 1 for r in records), records
    assert len(main_log(github)) == 4  # the seed, then one squash per loop
    waited = [
        e["data"]
        for n in issues
        for e in store.events(f"{REPO}#{n}")
        if e["kind"] == "gate" and e["data"].get("decision") == "WaitTurn"
    ]
    assert waited, [
        (n, e["kind"], e["data"].get("decision"))
        for n in issues
        for e in store.events(f"{REPO}#{n}")
        if e["kind"] in ("gate", "base_merged", "loop_finished", "conflicts")
    ]
    assert redis.get(f"loopbot:merge-slot:{REPO}") is None  # the last one let go


def test_head_pushed_by_someone_else_is_reviewed_before_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    pushed: list[str] = []

    def push_during_review(body: dict[str, Any]) -> m.Item:
        if not pushed:  # someone pushes to the branch while the critic reads the old head
            path = github.repo(REPO).path
            pushed.append(gitrepo.seed(path, "loop/issue-1", {"EXTRA.md": "sneaky\n"}, "extra"))
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = push_during_review
    run(github, drain)
    r = record(redis)
    # Reviewed, but verify never ran on the pushed head: a person merges it, not loopbot.
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "verify last ran on" in r.detail and len(main_log(github)) == 1
    reviews = github.repo(REPO).reviews[r.pr_number]
    # Two reviews: the old head, then the new one.
    assert len(reviews) == 2
    assert reviews[-1]["commit_id"] == pushed[0] == r.reviewed_sha
    events = [e["data"].get("decision") for e in Store(redis).events(KEY) if e["kind"] == "gate"]
    assert events[0] == "Review" and events[-1] == "Refuse"


def test_checks_pending_then_green_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def ci_starts(body: dict[str, Any]) -> m.Item:
        sha = github.ref(REPO, "loop/issue-1")
        ci_status(github, sha, "pending", "ci")
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = ci_starts
    run(github, drain)
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "waiting_for_checks"), r
    sha = github.ref(REPO, "loop/issue-1")
    ci_status(github, sha, "success", "ci")
    github.complete_check_suite(REPO, sha)  # type: ignore[arg-type]
    drain()
    assert record(redis).status == Status.COMPLETED


def test_only_required_checks_hold_the_merge_and_missing_ones_wait(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def optional_check_fails(body: dict[str, Any]) -> m.Item:
        sha = github.ref(REPO, "loop/issue-1")
        ci_status(github, sha, "failure", "lint")
        return report()

    sample_repo(github, loop_yml=YML)
    github.require_checks(REPO, "main", ["ci/test"], ruleset=True)
    model.play(FIX, m.text("Fixed."))
    model.responder = optional_check_fails
    label(github, "writer", open_issue(github))
    drain()
    # ci/test has not reported at all: that is waiting, not a green light.
    r = record(redis)
    assert (r.status, r.phase, r.check_fixes) == (Status.MERGING, "waiting_for_checks", 0), r
    gate = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "gate"][-1]
    assert gate["required"] == ["ci/test"] and gate["checks"] == "pending"
    sha = github.ref(REPO, "loop/issue-1")
    ci_status(github, sha, "success", "ci/test")
    github.complete_check_suite(REPO, sha)  # type: ignore[arg-type]
    drain()
    # lint still fails, but the branch does not require it, so GitHub would merge too.
    assert record(redis).status == Status.COMPLETED
    assert len(main_log(github)) == 2


def test_failing_checks_get_a_fix_turn(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    failed: list[str] = []

    def ci(body: dict[str, Any]) -> m.Item:
        if not is_critic(body):
            # The fix turn: edit a file, then finish, so the gate sees a new head.
            last = body["messages"][-1]["content"]
            if any(b.get("type") == "tool_result" for b in last):
                return m.text("Fixed the lint problem.")
            return m.write_file("LINT.md", "clean\n")
        sha = github.ref(REPO, "loop/issue-1")
        if not failed:  # CI fails on the first head only
            failed.append(sha)  # type: ignore[arg-type]
            ci_status(github, sha, "failure", "lint")
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = ci
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason, r.check_fixes) == (Status.COMPLETED, "merged", 1), r
    fix_prompt = json.dumps([b for b in model.requests if not is_critic(b)][2]["messages"][-1])
    assert "lint" in fix_prompt
    assert r.reviewed_sha != failed[0]  # the failing head was never merged
    assert github.file_at(REPO, "main", "LINT.md") == "clean\n"


def test_checks_that_keep_failing_are_refused(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def ci(body: dict[str, Any]) -> m.Item:
        if not is_critic(body):
            return m.text("Tried.")
        sha = github.ref(REPO, "loop/issue-1")
        ci_status(github, sha, "failure", "lint")
        return report()

    model.play(FIX, m.text("Fixed."))
    model.responder = ci
    run(github, drain, YML + "merge:\n  max_fix_turns: 1\n")
    r = record(redis)
    assert (r.status, r.reason, r.check_fixes) == (Status.REFUSED, "checks_failed", 1), r
    assert len(main_log(github)) == 1


def test_lost_answer_after_review_still_one_review(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    github.inject("POST", r"/pulls/\d+/reviews$", 502, after=True)
    model.play(FIX, m.text("Fixed."), report())
    run(github, drain)
    r = record(redis)
    assert r.status == Status.COMPLETED
    assert len(github.repo(REPO).reviews[r.pr_number]) == 1


def test_malformed_critic_answer_twice_is_an_error_and_no_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        FIX,
        m.text("Fixed."),
        m.text("LGTM!"),
        m.structured({"verdict": "approve", "summary": "x", "findings": [{"severity": "sev9"}]}),
    )
    run(github, drain)
    r = record(redis)
    assert (r.status, r.reason, r.verdict) == (Status.FAILED, "critic_error", "error"), r
    assert len(main_log(github)) == 1
    critic_runs = [
        c for c in github.repo(REPO).check_runs.values() if c["name"] == "loopbot/critic"
    ]
    assert critic_runs[-1]["conclusion"] == "failure"
    status = next(
        c
        for c in github.repo(REPO).comments.values()
        if c["_issue"] == 1 and c["user"]["type"] == "Bot"
    )["body"]
    assert "critic_error" in status and "did not validate" in status
    assert [e["kind"] for e in Store(redis).events(KEY)].count("critic_invalid") == 2


def test_approval_without_findings_on_a_large_diff_needs_a_human(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    big = "\n".join(f"# line {i}" for i in range(50)) + "\n"
    model.play(FIX, m.write_file("notes.py", big), m.text("Fixed."), report())
    run(github, drain, YML + "critic:\n  large_diff_lines: 20\n")
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human")
    assert "loop:needs-human" in github.repo(REPO).issues[1].labels
    assert len(main_log(github)) == 1


def test_human_feedback_on_the_pr_gets_a_turn_then_review_and_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def ci_pending_once(body: dict[str, Any]) -> m.Item:
        sha = github.ref(REPO, f"loop/issue-{n}")
        if not github.repo(REPO).statuses:
            ci_status(github, sha, "pending", "ci")
        return report()

    model.play(FIX, m.text("Fixed."), report())
    run(github, drain, YML)
    assert record(redis).status == Status.COMPLETED
    # A second issue, held at the gate by pending CI, gets a human's /loop request.
    n = open_issue(github, "second", "Add a docstring to add().")
    assert n == 3  # issue 1, its PR 2, this issue 3
    model.play(
        m.replace("calc.py", "    return a + b", '    """Add."""\n    return a + b'),
        m.text("Docstring."),
    )
    model.responder = ci_pending_once
    label(github, "writer", n)
    drain()
    key = f"{REPO}#{n}"
    rec = Store(redis).get(key)
    assert rec is not None and rec.phase == "waiting_for_checks", rec
    model.responder = None
    model.play(
        m.write_file("CHANGELOG.md", "- add() adds\n"), m.text("Added a changelog."), report()
    )
    with github.as_user("reader") as u:  # a non-writer's request changes nothing
        u.post(f"/repos/{REPO}/issues/{rec.pr_number}/comments", json={"body": "/loop delete all"})
    with github.as_user("writer") as u:
        u.post(
            f"/repos/{REPO}/issues/{rec.pr_number}/comments",
            json={"body": "/loop please add a changelog entry"},
        )
    drain()
    rec = Store(redis).get(key)
    assert rec is not None and rec.status == Status.COMPLETED, rec
    turn_prompt = json.dumps([b for b in model.requests if not is_critic(b)][-2]["messages"])
    assert "please add a changelog entry" in turn_prompt and "delete all" not in turn_prompt
    assert github.file_at(REPO, "main", "CHANGELOG.md") == "- add() adds\n"


def test_a_push_while_the_critic_reads_the_diff_is_not_reviewed_as_the_old_head(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Someone pushes between the critic's read of the head and its read of the diff: the
    diff it got is the new head's. The verdict must belong to the head whose diff it
    read, never be recorded for the old one (red team, F6)."""
    import re
    import threading
    import time

    from bot.standins.github.state import Fault

    pushed: list[str] = []
    slow_diff = Fault("GET", re.compile(r"/pulls/\d+$"), status=0, delay=1.0, accept="diff")

    def push_while_the_diff_is_read() -> None:
        deadline = time.monotonic() + 60
        while slow_diff.hits == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        path = github.repo(REPO).path
        pushed.append(gitrepo.seed(path, "loop/issue-1", {"EXTRA.md": "sneaky\n"}, "extra"))

    github.faults.append(slow_diff)
    threading.Thread(target=push_while_the_diff_is_read, daemon=True).start()
    model.play(FIX, m.text("Fixed."))
    model.responder = lambda body: report()
    run(github, drain)
    r = record(redis)
    assert pushed and r.reviewed_sha == pushed[0], (r.reviewed_sha, pushed)
    first = github.repo(REPO).reviews[r.pr_number][0]
    assert first["commit_id"] == pushed[0]  # the first verdict is on the head it read
    assert len(main_log(github)) == 1  # verify never ran there: not merged
