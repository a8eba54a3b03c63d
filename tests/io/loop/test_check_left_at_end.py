"""A clean catch-up's head whose ``loopbot`` run the loop left to the critic
(``LoopRecord.loop_check_waiting``) keeps it when the loop ends before the critic wrote
it or carried the approval (a cancel, a critic that gave up): the end's status post
writes it, once (``jobs.lifecycle._loop_check_left``)."""

from __future__ import annotations

from redis import Redis

from bot.core.record import LoopRecord, Reason, Status
from bot.core.settings import Settings
from bot.io.github.client import GitHubApp, Installation
from bot.io.store import Store
from bot.standins import gitrepo
from bot.standins.github import GitHubServer
from jobs import lifecycle

REPO = "acme/widgets"


def ended_with_a_run_left(
    github: GitHubServer, settings: Settings, redis: Redis, moved: bool = False
) -> tuple[Installation, Store, LoopRecord, str]:
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    head = gitrepo.resolve(github.repo(REPO).path, "refs/heads/main")
    assert head
    gh = GitHubApp(settings, redis=redis).installation(iid)
    store = Store(redis)
    left = {"sha": "f" * 40 if moved else head, "title": "verify passed on turn 2"}
    record = store.put(
        LoopRecord(
            repo=REPO,
            issue=1,
            installation_id=iid,
            head_sha=head,
            status=Status.CANCELLED,
            reason=Reason.CANCELLED,
            loop_check_waiting=left | {"summary": "cancelled by writer"},
        )
    )
    return gh, store, record, head


def runs(github: GitHubServer, head: str) -> list[tuple[str, str, str]]:
    return sorted(
        (c["name"], c["status"], c["conclusion"])
        for c in github.repo(REPO).check_runs.values()
        if c["head_sha"] == head
    )


def test_a_loop_that_ends_writes_the_run_it_left_once(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, store, record, head = ended_with_a_run_left(github, settings, redis)
    record = lifecycle.post_status(store, gh, record)
    assert runs(github, head) == [("loopbot", "completed", "success")]
    (run,) = github.repo(REPO).check_runs.values()
    assert run["output"]["title"] == "verify passed on turn 2"
    assert record.loop_check_waiting == {}
    again = lifecycle.post_status(store, gh, store.get(record.key) or record)
    assert again.loop_check_waiting == {}
    assert len(github.repo(REPO).check_runs) == 1  # not written twice


def test_a_run_left_on_a_head_the_loop_moved_from_is_not_written(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, store, record, _ = ended_with_a_run_left(github, settings, redis, moved=True)
    record = lifecycle.post_status(store, gh, record)
    assert github.repo(REPO).check_runs == {}
    assert record.loop_check_waiting == {}


def test_a_running_loop_leaves_it_to_the_critic(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, store, record, head = ended_with_a_run_left(github, settings, redis)
    running = store.set_fields(record.key, status=Status.REVIEWING, reason="")
    running = lifecycle.post_status(store, gh, running)
    assert github.repo(REPO).check_runs == {}
    assert running.loop_check_waiting["sha"] == head
