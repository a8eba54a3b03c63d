"""Merge queues, end to end: a real loop against the local GitHub whose ``main`` requires a
merge queue (a ruleset's ``merge_queue`` rule, or one the rules do not show), a real RQ
worker, webhooks delivered to the real web app. The gate enqueues the head the critic
reviewed and never calls the merge endpoint where the rules say a queue is required; the
queue (the stand-in, acting as CI on the merge group) merges or lets go of it."""

from __future__ import annotations

import json
from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.io.queues import enqueue_gate
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.github.merging.merge_queue import REFUSAL
from bot.standins.github.state import MergeQueueRule, ReviewRule
from tests.conftest import Web
from tests.e2e.review.test_review_merge import FIX, YML, ci_status, finding, is_critic, report
from tests.helpers import REPO, label, open_issue, sample_repo

KEY = f"{REPO}#1"
BRANCH = "loop/issue-1"


def record(redis: Redis) -> Any:
    return Store(redis).get(KEY)


def agent(github: GitHubServer) -> Any:
    """The coding agent fixes add() on its first turn and writes QUEUE.md on any later
    one; the critic approves, and CI passes the required check on the head it reviews."""

    def play(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            ci_status(github, github.ref(REPO, BRANCH), "success", "ci/test")
            return report()
        last = body["messages"][-1]["content"]
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
            return m.text("Done.")
        if len(body["messages"]) == 1:
            return FIX
        return m.write_file("QUEUE.md", "fixed for the queue\n")

    return play


def start(
    github: GitHubServer, model: AnthropicServer, drain: Any, rule: MergeQueueRule | None = None
) -> None:
    sample_repo(github, loop_yml=YML)
    github.require_checks(REPO, "main", ["ci/test"], ruleset=True)
    github.require_merge_queue(REPO, "main", rule, ci="")  # the test reports the group's checks
    model.responder = agent(github)
    label(github, "writer", open_issue(github))
    drain()


def queued(github: GitHubServer, redis: Redis) -> Any:
    r = record(redis)
    assert (r.status, r.phase) == (Status.MERGING, "in_merge_queue"), r
    return r


def status_comment(github: GitHubServer) -> str:
    repo = github.repo(REPO)
    return "\n".join(c["body"] for c in repo.comments.values() if c["_issue"] == 1)


def test_the_queue_merges_the_reviewed_head_without_a_merge_call(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    start(github, model, drain)
    r = queued(github, redis)
    repo = github.repo(REPO)
    pr = r.pr_number
    head = repo.head_sha(repo.pulls[pr])
    # Enqueued once, pinned to the head the critic reviewed; no merge was tried.
    assert r.reviewed_sha == head and r.queue_head == head
    assert repo.enqueue_calls == [(pr, head, github.bot.login)]
    assert repo.merge_refusals == []
    assert "in_merge_queue" in status_comment(github)
    # The queue built a merge group on its temporary branch; the gate holds no job.
    main_before = github.ref(REPO, "main")
    group_ref = f"gh-readonly-queue/main/pr-{pr}-{main_before}"
    group = github.ref(REPO, group_ref)
    assert group is not None
    assert not any(redis.llen(f"rq:queue:{q}") for q in ("loop", "control", "default"))
    assert r.queue_group == group  # the merge_group webhook named it
    github.report_queue_checks(REPO, "main", "success")
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert "through the merge queue" in r.detail
    # The queue's merge commit is the merge group's, and the receipt names it.
    assert github.ref(REPO, "main") == group and r.merge_sha == group
    assert repo.pulls[pr].merged and repo.pulls[pr].merge_commit_sha == group
    receipt = next(c["body"] for c in repo.comments.values() if "merge receipt" in c["body"])
    assert group in receipt
    assert repo.issues[1].state == "closed"
    assert github.ref(REPO, BRANCH) is None and github.ref(REPO, group_ref) is None
    assert "return a + b" in (github.file_at(REPO, "main", "calc.py") or "")
    assert repo.merge_refusals == [] and len(repo.enqueue_calls) == 1


def test_failing_queue_checks_get_one_fix_turn_then_the_new_head_merges(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    start(github, model, drain)
    first = queued(github, redis)
    pr = first.pr_number
    repo = github.repo(REPO)
    github.report_queue_checks(REPO, "main", "failure")  # the queue dequeues it: CI_FAILURE
    drain()
    r = queued(github, redis)  # a fix turn, a new head, reviewed, enqueued again
    assert r.check_fixes == 1, r
    heads = [h for _, h, _ in repo.enqueue_calls]
    assert len(heads) == 2 and heads[0] == first.reviewed_sha
    assert heads[1] == r.reviewed_sha == repo.head_sha(repo.pulls[pr]) != heads[0]
    fix_prompt = json.dumps([b for b in model.requests if not is_critic(b)][2]["messages"][-1])
    assert "merge queue" in fix_prompt and "ci/test" in fix_prompt
    github.report_queue_checks(REPO, "main", "success")
    drain()
    r = record(redis)
    assert (r.status, r.reason, r.check_fixes) == (Status.COMPLETED, "merged", 1), r
    assert github.file_at(REPO, "main", "QUEUE.md") == "fixed for the queue\n"
    assert repo.merge_refusals == []


def test_queue_checks_that_fail_again_go_to_a_person(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML + "merge:\n  max_fix_turns: 1\n")
    github.require_checks(REPO, "main", ["ci/test"], ruleset=True)
    github.require_merge_queue(REPO, "main", ci="failure")  # the queue's CI always fails
    model.responder = agent(github)
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    assert (r.status, r.reason, r.check_fixes) == (Status.REFUSED, "checks_failed", 1), r
    assert "merge queue removed the pull request" in r.detail and "ci/test" in r.detail
    repo = github.repo(REPO)
    assert "loop:needs-human" in repo.issues[1].labels
    assert len(repo.enqueue_calls) == 2  # the first head, and the fixed one
    assert not repo.pulls[r.pr_number].merged and repo.merge_refusals == []


def test_a_person_removing_it_from_the_queue_hands_it_to_a_person(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    start(github, model, drain)
    r = queued(github, redis)
    with github.as_user("writer") as u:
        q = 'query($n:Int!){repository(owner:"acme",name:"widgets"){pullRequest(number:$n){id}}}'
        node = u.post("/graphql", json={"query": q, "variables": {"n": r.pr_number}}).json()
        pid = node["data"]["repository"]["pullRequest"]["id"]
        out = u.post(
            "/graphql",
            json={
                "query": "mutation($id:ID!){dequeuePullRequest(input:{id:$id}){clientMutationId}}",
                "variables": {"id": pid},
            },
        ).json()
        assert "errors" not in out, out
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "needs_human"), r
    assert "@writer removed the pull request from the merge queue" in r.detail
    repo = github.repo(REPO)
    assert "loop:needs-human" in repo.issues[1].labels
    assert len(repo.enqueue_calls) == 1  # loopbot did not put it back
    assert not repo.pulls[r.pr_number].merged


def test_a_lost_webhook_the_recheck_reads_the_merge_from_github(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    start(github, model, drain)
    queued(github, redis)
    github.webhooks_enabled = False  # GitHub never sends the queue's webhooks
    github.report_queue_checks(REPO, "main", "success")
    drain()
    assert record(redis).phase == "in_merge_queue"
    enqueue_gate(redis, REPO, 1)  # the gate's own timer (QUEUE_RECHECK_SECONDS) fires
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    assert r.merge_sha == github.ref(REPO, "main")


def test_a_queue_the_rules_do_not_show_costs_one_refused_merge(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # Classic branch protection's "Require merge queue": the App cannot read it, so the
    # one refused merge call ("Changes must be made through the merge queue") says so.
    start(github, model, drain, MergeQueueRule(source="classic"))
    r = queued(github, redis)
    repo = github.repo(REPO)
    assert repo.merge_refusals == [(r.pr_number, 405, REFUSAL)]
    assert repo.enqueue_calls == [(r.pr_number, r.reviewed_sha, github.bot.login)]
    github.report_queue_checks(REPO, "main", "success")
    drain()
    assert (record(redis).status, record(redis).reason) == (Status.COMPLETED, "merged")
    assert len(repo.merge_refusals) == 1


def test_an_installation_without_the_merge_queues_permission_is_told_why(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    iid = sample_repo(github, loop_yml=YML)
    github.grants[iid]["permissions"].pop("merge_queues")  # the owner never accepted it
    github.require_checks(REPO, "main", ["ci/test"], ruleset=True)
    github.require_merge_queue(REPO, "main")
    model.responder = agent(github)
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.REFUSED, "not_mergeable"), r
    assert "Resource not accessible by integration" in r.detail
    assert "Merge queues permission" in r.detail
    repo = github.repo(REPO)
    assert len(repo.enqueue_calls) == 1 and repo.merge_refusals == []


def test_loopbots_own_threads_are_resolved_before_it_enqueues(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    # A queue and resolved conversations both required: GitHub refuses to enqueue a pull
    # request with an unresolved thread, so loopbot settles its own critic's first.
    sample_repo(github, loop_yml=YML)
    repo = github.repo(REPO)
    repo.review_rules["main"] = ReviewRule(required_review_thread_resolution=True)
    github.require_checks(REPO, "main", ["ci/test"], ruleset=True)
    github.require_merge_queue(REPO, "main")  # the stand-in's CI passes the merge group
    play = agent(github)

    def critic_advises(body: dict[str, Any]) -> m.Item:
        if is_critic(body):
            play(body)  # CI passes the head
            return report(findings=[finding("sev3", "calc.py", 2, "nit: docstring", "docs")])
        return play(body)

    model.responder = critic_advises
    label(github, "writer", open_issue(github))
    drain()
    r = record(redis)
    assert (r.status, r.reason) == (Status.COMPLETED, "merged"), r
    own = [c["id"] for c in repo.review_comments[r.pr_number]]
    assert own and set(own) <= repo.resolved_threads
    assert len(repo.enqueue_calls) == 1 and repo.merge_refusals == []
