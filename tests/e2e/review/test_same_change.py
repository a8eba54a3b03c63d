"""A loop that catches up with the default branch (another loop merged first) and whose
own change stays the same: verify on the merged head, no turn, the approval carries, no
second review (bot/core/rules/pull/same_change.py). The change's context moved by the base,
or verify failing on the merged head, and it is reviewed again / coded again. Real RQ
worker, git and sandbox; the local GitHub and model."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.review.test_review_merge import is_critic, main_log, report
from tests.helpers import REPO, label, open_issue, sample_repo


def which(body: dict[str, Any]) -> str:
    return body["messages"][0]["content"][0]["text"].split("issue #")[1].split()[0].strip(".:")


def events(redis: Redis, n: int, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in Store(redis).events(f"{REPO}#{n}") if e["kind"] == kind]


NOTES = "verify: test -d notes\n"  # each loop adds a note of its own: git merges them alone


def notes_agent(body: dict[str, Any]) -> m.Item:
    """Each loop writes ``notes/<its issue>.md`` and says done; the critic approves."""
    if is_critic(body):
        return report()
    if any(b.get("type") == "tool_result" for b in body["messages"][-1]["content"]):
        return m.text("Done.")
    return m.write_file(f"notes/{which(body)}.md", "noted\n")


# Loop one changes line 1 of lines.txt, loop two line 4: git merges them alone, but the
# lines around loop two's change are not the ones the critic read (reviewed again).
LINES = {"lines.txt": "a\nb\nc\nd\ne\nf\ng\n"}
LINES_YML = "verify: test -f lines.txt\n"


def context_agent(
    on_review: Callable[[], object] | None = None,
) -> Callable[[dict[str, Any]], m.Item]:
    """Each loop changes its own line of lines.txt; the critic approves, calling
    ``on_review`` first."""

    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            if on_review is not None:
                on_review()
            return report()
        if any(b.get("type") == "tool_result" for b in body["messages"][-1]["content"]):
            return m.text("Done.")
        if which(body) == "1":
            return m.replace("lines.txt", "a\n", "A\n")
        return m.replace("lines.txt", "d\n", "D\n")

    return agent


def start_two(
    github: GitHubServer,
    model: AnthropicServer,
    responder: Any = notes_agent,
    yml: str = NOTES,
    extra: dict[str, str] | None = None,
) -> tuple[int, int]:
    """Two issues of one repository labelled at once (not run yet)."""
    sample_repo(github, loop_yml=yml, extra=extra)
    first, second = open_issue(github, "one", "Do one."), open_issue(github, "two", "Do two.")
    model.responder = responder
    label(github, "writer", first)
    label(github, "writer", second)
    return first, second


def caught_up(redis: Redis, *issues: int) -> int:
    """The one loop of ``issues`` that merged the default branch in (another merged first)."""
    (late,) = [n for n in issues if events(redis, n, "base_merged")]
    return late


def runs_on(github: GitHubServer, head: str) -> list[tuple[str, str, str]]:
    """The check runs on ``head``: (name, status, conclusion), sorted."""
    return sorted(
        (c["name"], c["status"], c["conclusion"])
        for c in github.repo(REPO).check_runs.values()
        if c["head_sha"] == head
    )


def two_loops(
    github: GitHubServer,
    model: AnthropicServer,
    redis: Redis,
    drain: Any,
    responder: Any,
    yml: str,
    extra: dict[str, str] | None = None,
) -> tuple[int, int]:
    first, second = start_two(github, model, responder, yml, extra)
    drain(rounds=30)
    store = Store(redis)
    for n in (first, second):
        r = store.get(f"{REPO}#{n}")
        assert r is not None and r.status == Status.COMPLETED, r
    assert len(main_log(github)) == 3  # the seed, then one squash per loop
    return first, second


def test_a_clean_catch_up_is_verified_without_a_turn_and_its_approval_carries(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    first, second = two_loops(github, model, redis, drain, notes_agent, NOTES)
    # Which loop merged first is the worker's order: the other caught up.
    caught = [n for n in (first, second) if events(redis, n, "base_merged")]
    assert len(caught) == 1, caught
    (late,) = caught
    assert events(redis, late, "base_merged") == [{"base": "main", "conflicts": []}]
    # No turn after the merge: two agent calls per loop (a write, then "Done."), and the
    # merged head's verify ran in the harness.
    agent_calls = [b for b in model.requests if not is_critic(b)]
    assert len(agent_calls) == 4, [which(b) for b in agent_calls]
    assert len(events(redis, late, "turn_started")) == 1
    merged_verify = [e for e in events(redis, late, "verify") if e.get("merged_base")]
    assert len(merged_verify) == 1 and merged_verify[0]["passed"], merged_verify
    # One review per loop: the merged head's approval carried from the reviewed head.
    assert sum(1 for b in model.requests if is_critic(b)) == 2
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None and r.pr_number is not None
    (carried,) = events(redis, late, "review_carried")
    reviews = github.repo(REPO).reviews[r.pr_number]
    assert len(reviews) == 1 and reviews[0]["commit_id"] == carried["reviewed"]
    assert carried["sha"] == r.reviewed_sha == merged_verify[0]["sha"] != carried["reviewed"]
    runs = [
        c
        for c in github.repo(REPO).check_runs.values()
        if c["name"] == "loopbot/critic" and c["head_sha"] == carried["sha"]
    ]
    assert len(runs) == 1 and runs[0]["conclusion"] == "success", runs
    assert runs[0]["output"]["title"].startswith("approve: the change approved on"), runs
    # One check run on the merged head, not two saying the same (issue 43): the loop's
    # own ("verify passed") is left to the critic, whose run says verify passed there.
    assert "verify passed again on this head" in runs[0]["output"]["summary"]
    on_head = [
        c["name"] for c in github.repo(REPO).check_runs.values() if c["head_sha"] == carried["sha"]
    ]
    assert on_head == ["loopbot/critic"], on_head
    assert r.loop_check_waiting == {}
    assert github.file_at(REPO, "main", "notes/1.md") == "noted\n"
    assert github.file_at(REPO, "main", "notes/2.md") == "noted\n"
    # The catch-up cost GitHub no write beyond its head's check runs (issue 43): the
    # pull request's body is the same change's (not written again), and its steps are
    # quiet on the status comment, whose last edit shows them.
    assert ("PATCH", f"/repos/{REPO}/pulls/{r.pr_number}") not in {
        (meth, p) for meth, p, _ in github.requests
    }
    early = Store(redis).get(f"{REPO}#{first if late == second else second}")
    assert early is not None

    def edits(comment: int | None) -> int:
        path = f"/repos/{REPO}/issues/comments/{comment}"
        return sum(1 for meth, p, _ in github.requests if meth == "PATCH" and p == path)

    # As many as the loop that merged first (its jobs ran one after another here, so
    # neither waited for the other's merge): the catch-up cost none.
    assert edits(r.status_comment_id) == edits(early.status_comment_id)
    shown = github.repo(REPO).comments[r.status_comment_id]["body"]
    assert "merged the base branch in" in shown and "its approval carries" in shown
    assert "merge receipt" in shown
    # Each status comment: never two edits that leave the same text, and it ends merged.
    for n in (first, second):
        rec = Store(redis).get(f"{REPO}#{n}")
        assert rec is not None and rec.status_comment_id is not None
        comment = github.repo(REPO).comments[rec.status_comment_id]
        bodies = comment.get("_bodies", [comment["body"]])
        assert all(a != b for a, b in itertools.pairwise(bodies)), bodies
        assert "merged" in bodies[-1]


def test_a_catch_up_that_moves_the_change_s_context_is_reviewed_again(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Loop one changes line 1 of a file, loop two line 4: git merges them alone, but the
    lines around loop two's change are not the ones the critic read. Reviewed again."""
    first, second = two_loops(github, model, redis, drain, context_agent(), LINES_YML, LINES)
    (late,) = [n for n in (first, second) if events(redis, n, "base_merged")]
    assert events(redis, late, "base_merged") == [{"base": "main", "conflicts": []}]
    assert events(redis, late, "review_carried") == []
    assert sum(1 for b in model.requests if is_critic(b)) == 3  # the late loop's twice
    # Reviewed again: the merged head's own check run, left by the loop, was written by
    # the critic's job, as the loop would have, before its review's.
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None and r.loop_check_waiting == {}
    head = r.catch_up["to"]
    on_head = [
        (c["name"], c["conclusion"])
        for c in github.repo(REPO).check_runs.values()
        if c["head_sha"] == head
    ]
    assert on_head == [("loopbot", "success"), ("loopbot/critic", "success")], on_head
    assert github.file_at(REPO, "main", "lines.txt") == "A\nb\nc\nD\ne\nf\ng\n"


def test_a_clean_catch_up_writes_the_loop_s_check_run_a_rule_requires(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """The default branch requires the `loopbot` check by name: the merged head gets
    the loop's own run as well as the critic's, and the loop merges."""
    first, second = start_two(github, model)
    github.require_checks(REPO, "main", ["loopbot"])
    drain(rounds=30)
    late = caught_up(redis, first, second)
    r = Store(redis).get(f"{REPO}#{late}")
    assert r is not None and (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    (carried,) = events(redis, late, "review_carried")
    assert runs_on(github, carried["sha"]) == [
        ("loopbot", "completed", "success"),
        ("loopbot/critic", "completed", "success"),
    ]


CHECK = (
    "#!/bin/sh\n# each note alone is fine; both together need one to say so\n"
    "[ ! -e notes/1.md ] || [ ! -e notes/2.md ] || grep -q both notes/1.md\n"
)


def test_verify_failing_on_the_merged_head_gives_the_agent_a_turn_with_its_output(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    def agent(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            return report()
        last = json.dumps(body["messages"][-1]["content"])
        if '"tool_result"' in last:
            return m.text("Done.")
        if "verify failed" in last and "without conflicts" in last:
            return m.write_file("notes/1.md", "noted\nboth\n")
        return m.write_file(f"notes/{which(body)}.md", "noted\n")

    first, second = two_loops(
        github, model, redis, drain, agent, "verify: sh check.sh\n", extra={"check.sh": CHECK}
    )
    (late,) = [n for n in (first, second) if events(redis, n, "base_merged")]
    merged_verify = [e for e in events(redis, late, "verify") if e.get("merged_base")]
    assert len(merged_verify) == 1 and not merged_verify[0]["passed"], merged_verify
    kinds = [e["kind"] for e in Store(redis).events(f"{REPO}#{late}")]
    after = kinds[kinds.index("base_merged") :]
    assert after.count("turn_started") == 1, after  # the fix turn, told what verify said
    fix = [b for b in model.requests if "without conflicts" in json.dumps(b["messages"][-1])]
    assert fix and "verify failed" in json.dumps(fix[0]["messages"][-1]), fix
    assert events(redis, late, "review_carried") == []  # the change is another: reviewed
    assert github.file_at(REPO, "main", "notes/1.md") == "noted\nboth\n"
