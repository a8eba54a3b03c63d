"""Webhook → control job → permission check, end to end on the local GitHub server."""

from __future__ import annotations

from redis import Redis

from bot.io.store import Store
from bot.standins.github import GitHubServer
from tests.conftest import Web, run_control_jobs
from tests.helpers import REPO, comment, control_queued, label, open_issue, queued, sample_repo


def test_writer_label_enqueues_one_command_and_one_loop(
    github: GitHubServer, web: Web, redis: Redis, rt: object
) -> None:
    sample_repo(github)
    n = open_issue(github)
    label(github, "writer", n)
    github.wait_for_webhooks()
    assert control_queued(redis) == 1
    run_control_jobs(redis)
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None and record.status == "queued" and record.started_by == "writer"
    assert queued(redis) == 1


def test_label_by_user_without_write_starts_nothing(
    github: GitHubServer, web: Web, redis: Redis, rt: object
) -> None:
    sample_repo(github)
    repo = github.repo(REPO)
    repo.permissions["triager"] = "triage"  # may label issues, may not write code
    github.add_user("triager")
    n = open_issue(github)
    label(github, "triager", n)
    # A writer labels, then loses write access before the job runs: checked at run time.
    m = open_issue(github)
    label(github, "writer", m)
    github.wait_for_webhooks()
    repo.permissions["writer"] = "read"
    assert control_queued(redis) == 2
    run_control_jobs(redis)
    assert Store(redis).get(f"{REPO}#{m}") is None
    assert Store(redis).get(f"{REPO}#{n}") is None
    assert queued(redis) == 0
    assert not [c for c in github.repo(REPO).comments.values() if c["user"]["type"] == "Bot"]


def test_label_added_by_the_app_starts_nothing(
    github: GitHubServer, web: Web, redis: Redis, rt: object
) -> None:
    iid = sample_repo(github)
    n = open_issue(github)
    # The App labels the issue itself (with its installation token).
    inst = rt.github.installation(iid)  # type: ignore[attr-defined]
    inst.add_labels(REPO, n, ["loop:ready"])
    github.wait_for_webhooks()
    assert github.deliveries[-1]["action"] == "labeled"
    assert control_queued(redis) == 0


def test_other_labels_start_nothing(
    github: GitHubServer, web: Web, redis: Redis, rt: object
) -> None:
    sample_repo(github)
    n = open_issue(github)
    label(github, "writer", n, "bug")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    assert Store(redis).get(f"{REPO}#{n}") is None


def test_bad_config_gets_one_comment_and_no_loop(
    github: GitHubServer, web: Web, redis: Redis, rt: object
) -> None:
    sample_repo(github, loop_yml="verify: make test\nmax_turn: 4\ncritic:\n  rounds: 2\n")
    n = open_issue(github)
    label(github, "writer", n)
    label(github, "writer", n, "other")
    with github.as_user("writer") as u:
        u.delete(f"/repos/{REPO}/issues/{n}/labels/loop:ready")
    label(github, "writer", n)
    github.wait_for_webhooks()
    run_control_jobs(redis)
    bot_comments = [c for c in github.repo(REPO).comments.values() if c["user"]["type"] == "Bot"]
    assert len(bot_comments) == 1
    assert "`max_turn`: unknown key" in bot_comments[0]["body"]
    assert "`critic.rounds`: unknown key" in bot_comments[0]["body"]
    assert Store(redis).get(f"{REPO}#{n}") is None and queued(redis) == 0


def test_non_writer_commands_have_no_effect(
    github: GitHubServer, web: Web, redis: Redis, rt: object
) -> None:
    sample_repo(github)
    n = open_issue(github)
    comment(github, "reader", n, "/loop-status")
    comment(github, "stranger", n, "/loop-cancel")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    repo = github.repo(REPO)
    assert repo.reactions == []
    assert not [c for c in repo.comments.values() if c["user"]["type"] == "Bot"]
