"""Metric loops end to end (label ``loop:optimize``): real RQ worker, real git, the real
sandbox running the metric and the guard, the local GitHub and model."""

from __future__ import annotations

from typing import Any

from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import LoopRecord, Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, comment, content_text, label, open_issue, sample_repo

# The metric: how many "x" src/work.txt holds (higher is better). The guard (verify):
# src/work.txt never says BAD. Both live outside the scope (src/**).
METRIC = "print('x count:', open('src/work.txt').read().count('x'))\n"
CHECK = "import sys\nsys.exit(1 if 'BAD' in open('src/work.txt').read() else 0)\n"
YML = """\
verify: python3 check.py
metric:
  command: python3 metric.py
  direction: higher
  scope: ['src/**']
  max_iterations: {iterations}
  max_consecutive_discards: {discards}
"""
BRANCH = "loop/issue-1"


def start(
    github: GitHubServer,
    drain: Any,
    *,
    iterations: int = 3,
    discards: int = 10,
    metric: str = METRIC,
    body: str = "Raise the x count of src/work.txt.",
) -> int:
    sample_repo(
        github,
        loop_yml=YML.format(iterations=iterations, discards=discards),
        extra={"metric.py": metric, "check.py": CHECK, "src/work.txt": "xx\n"},
    )
    n = open_issue(github, "More x in work.txt", body)
    label(github, "writer", n, "loop:optimize")
    drain()
    return n


def record_of(redis: Redis, n: int) -> LoopRecord:
    record = Store(redis).get(LoopId(REPO, n).key)
    assert record is not None
    return record


def bot_comments(github: GitHubServer) -> list[str]:
    return [c["body"] for c in github.repo(REPO).comments.values() if c["user"]["type"] == "Bot"]


def iteration(content: str, say: str) -> tuple[m.Reply, m.Reply]:
    """One iteration's turn: write src/work.txt, then describe the change."""
    return m.write_file("src/work.txt", content), m.text(say)


def test_keep_discard_and_guard_failure_then_a_merged_pull_request_with_the_table(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        *iteration("xxxx\n", "Double the x"),  # 2 -> 4: kept
        *iteration("x\n", "Trim to one x"),  # worse: discarded
        *iteration("xxxxxxxx BAD\n", "Eight x and a marker"),  # better, but the guard fails
        m.structured({"verdict": "approve", "summary": "Sound.", "findings": []}),
    )
    n = start(github, drain)
    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), record.detail
    rows = [(r["iteration"], r["status"], r["metric"], r["reason"]) for r in record.metric_results]
    assert rows == [
        (0, "baseline", 2.0, ""),
        (1, "keep", 4.0, ""),
        (2, "discard", 1.0, "worse"),
        (3, "discard", 8.0, "guard failed (exit 1)"),
    ]
    # Main has the kept change only, and the table; the branch's history keeps every try.
    assert github.file_at(REPO, "main", "src/work.txt") == "xxxx\n"
    tsv = github.file_at(REPO, "main", "loop-results.tsv")
    assert tsv is not None and tsv.splitlines()[0] == (
        "iteration\tcommit\tmetric\tdelta\tstatus\tdescription"
    )
    assert "\tkeep\tDouble the x" in tsv and "discarded: guard failed" in tsv
    # (The branch is deleted after the merge: its reviewed head stays in the repository.)
    head = record.reviewed_sha
    log = gitrepo.git(github.repo(REPO).path, "log", "--format=%s", head).splitlines()
    assert log[:6] == [
        "loop: results of 3 iteration(s) (loop-results.tsv)",
        'Revert "loop(iter-3): Eight x and a marker"',
        "loop(iter-3): Eight x and a marker",
        'Revert "loop(iter-2): Trim to one x"',
        "loop(iter-2): Trim to one x",
        "loop(iter-1): Double the x",
    ]
    # The pull request's body and the critic's prompt carry the table.
    assert record.pr_number is not None
    body = github.repo(REPO).issues[record.pr_number].body
    assert "baseline 2 · best 4 (+2, +100.00%)" in body and "↩️ discard" in body
    critic = [content_text(r["messages"][0]) for r in model.requests if "output_config" in r]
    assert critic and "from a metric loop on `python3 metric.py`" in critic[0]
    assert "iteration\tcommit\tmetric" in critic[0] and "\tkeep\tDouble the x" in critic[0]
    # The second iteration's prompt said the first was kept; the third that the second
    # was discarded and reverted.
    prompts = [str(r["messages"][-1]["content"]) for r in model.requests if "tools" in r]
    assert any("Iteration 1 was KEPT" in p for p in prompts)
    assert any("Iteration 2 was DISCARDED and reverted: worse" in p for p in prompts)
    comments = bot_comments(github)
    assert any(
        "metric loop report" in c and "3 iteration(s): 1 kept, 2 discarded" in c for c in comments
    )
    status = next(c for c in comments if "<!-- loopbot:status -->" in c)
    assert "| 3 | " in status and "guard failed" in status
    kinds = [e["kind"] for e in Store(redis).events(LoopId(REPO, n).key)]
    assert kinds.count("metric_iteration") == 3 and "metric_finished" in kinds
    # Its preconditions stand for triage: a metric loop is never triaged.
    assert model.triage_requests == [] and "triage" not in kinds


def test_stuck_stop_after_consecutive_discards_reports_and_opens_no_pull_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(
        m.write_file("check.py", "raise SystemExit(0)\n"),  # the guard's file: out of scope
        m.text("Relax the check"),
        *iteration("x\n", "Fewer x"),
    )
    n = start(github, drain, discards=2)
    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.FAILED, "metric_stuck"), record.detail
    assert record.pr_number is None and not github.repo(REPO).pulls
    first, second = record.metric_results[1:]
    # Outside the scope: discarded without being measured, and reverted.
    assert first["status"] == "discard" and first["metric"] is None
    assert first["reason"] == "changed files outside the scope: check.py"
    assert second["reason"] == "worse"
    assert github.file_at(REPO, BRANCH, "check.py") == github.file_at(REPO, "main", "check.py")
    assert github.file_at(REPO, BRANCH, "loop-results.tsv") is None
    # With max_consecutive_discards 2, the hint comes after one discard.
    prompts = [str(r["messages"][-1]["content"]) for r in model.requests]
    assert sum("Change area or technique" in p for p in prompts) == 1
    report = next(c for c in bot_comments(github) if "metric loop report" in c)
    assert "2 discards in a row" in report and "Nothing was kept" in report
    assert len(model.requests) == 4  # two iterations of two calls, nothing after the stop


def test_preconditions_name_what_failed_and_call_no_model(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    n = start(github, drain, metric="print('no digits here')\n")
    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.FAILED, "metric_preconditions")
    assert model.requests == []
    comment = next(c for c in bot_comments(github) if "did not start" in c)
    assert "**metric** failed" in comment and "printed no number" in comment
    assert "✅ scope" in comment and "✅ guard" in comment and "no digits here" in comment


def test_the_optimize_label_without_a_metric_section_says_what_to_add(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml="verify: python3 -m unittest -q\n")
    n = open_issue(github)
    label(github, "writer", n, "loop:optimize")
    drain()
    assert Store(redis).get(LoopId(REPO, n).key) is None
    (comment,) = bot_comments(github)
    assert "needs a `metric:` section" in comment and "direction: higher" in comment


def test_removing_the_optimize_label_stops_the_loop(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def unlabel_then_answer(body: dict[str, Any]) -> m.Reply:
        with github.as_user("writer") as u:
            u.delete(f"/repos/{REPO}/issues/1/labels/loop:optimize")
        return m.text("Thinking about it")

    model.responder = unlabel_then_answer
    n = start(github, drain)
    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.CANCELLED, "issue_inactive")
    assert len(model.requests) == 1  # no second iteration once the label is gone


def test_restart_after_a_stuck_stop_resumes_at_the_next_iteration(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(*iteration("x\n", "Fewer x"), *iteration("\n", "No x"))
    no_review = YML + "critic:\n  enabled: false\nmerge:\n  enabled: false\n"
    sample_repo(
        github,
        loop_yml=no_review.format(iterations=3, discards=2),
        extra={"metric.py": METRIC, "check.py": CHECK, "src/work.txt": "xx\n"},
    )
    n = open_issue(github, "More x", "Raise the x count.")
    label(github, "writer", n, "loop:optimize")
    drain()
    assert record_of(redis, n).reason == "metric_stuck"
    model.play(
        *iteration("xxx\n", "One more x"),  # iteration 3: kept
        *iteration("x\n", "Fewer again"),
        *iteration("\n", "None again"),  # two discards in a row: stuck, with one kept
    )
    comment(github, "writer", n, "/loop-restart")
    drain()
    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.COMPLETED, "pr_opened"), record.detail
    assert [r["iteration"] for r in record.metric_results] == [0, 1, 2, 3, 4, 5]
    assert [r["status"] for r in record.metric_results[3:]] == ["keep", "discard", "discard"]
    assert github.file_at(REPO, BRANCH, "src/work.txt") == "xxx\n"
    tsv = github.file_at(REPO, BRANCH, "loop-results.tsv")
    assert tsv is not None and len(tsv.splitlines()) == 7
    # The restart went on in the same conversation, at iteration 3.
    resumed = str(model.requests[4]["messages"][-1]["content"])
    assert "Iteration 3." in resumed and "restarted this loop" in resumed


def test_a_fix_turn_after_the_pull_request_cannot_rewrite_the_results_table(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # The table is the harness's record of what was measured: a fix turn (here for a
    # critic's sev1) that forges it gets it restored before the head is reviewed again.
    sev1 = {
        "severity": "sev1",
        "category": "correctness",
        "path": "src/work.txt",
        "line": 1,
        "title": "needs a trailing marker",
        "body": "add one",
    }
    model.play(
        *iteration("xxxx\n", "Double the x"),  # kept
        m.structured({"verdict": "request_changes", "summary": "One fix.", "findings": [sev1]}),
        m.write_file("loop-results.tsv", "iteration\tmetric\n1\t1000000 (forged)\n"),
        m.write_file("src/work.txt", "xxxx end\n"),
        m.text("Added the marker."),
        m.structured(
            {
                "verdict": "approve",
                "summary": "Fixed.",
                "findings": [],
                "earlier_findings": [{"id": "F1", "status": "resolved", "why": "marker added"}],
            }
        ),
    )
    # A task list in a metric loop's issue is not milestones: its fix turns stay fix turns.
    n = start(github, drain, iterations=1, body="More x.\n\n- [ ] more x\n- [ ] even more x\n")
    record = record_of(redis, n)
    assert (record.status, record.reason) == (Status.COMPLETED, "merged"), record.detail
    assert record.sections == []
    assert github.file_at(REPO, "main", "src/work.txt") == "xxxx end\n"
    tsv = github.file_at(REPO, "main", "loop-results.tsv")
    assert tsv is not None and "forged" not in tsv and "\tkeep\tDouble the x" in tsv
    kinds = [e["kind"] for e in Store(redis).events(LoopId(REPO, n).key)]
    assert "results_table_restored" in kinds
