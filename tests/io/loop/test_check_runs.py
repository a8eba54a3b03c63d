"""A loop's check runs written beside its turns (``jobs.check_runs``), against the local
GitHub through the real client and the installation's pace in Redis: a turn hands its
update over and goes on; a newer head replaces an update still waiting; what the loop
ends on is written at once and after what was handed over, with one check run per head;
nothing is written once the lease is gone; a failed update is written again at the end."""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis import Redis

from bot.core.settings import Settings
from bot.io.github import failures
from bot.io.github.client import GitHubApp, Installation
from bot.io.store import LeaseLost
from bot.standins import gitrepo
from bot.standins.github import GitHubServer
from jobs.check_runs import CheckRuns, Update

REPO = "acme/widgets"
NAME = "loopbot"


class Fence:
    """The lease check a job passes: raises once ``lost`` is set."""

    def __init__(self) -> None:
        self.lost = False

    def __call__(self) -> None:
        if self.lost:
            raise LeaseLost("another worker holds the lease")


def setup(
    github: GitHubServer, settings: Settings, redis: Redis, gap: float = 0.0, **app: Any
) -> tuple[Installation, list[str]]:
    """The installation's client and three commits on a branch (three heads pushed)."""
    iid = github.add_installation("acme")
    repo = github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    heads = [
        gitrepo.seed(repo.path, "loop/issue-1", {f"f{i}.txt": f"{i}\n"}, f"turn {i}")
        for i in range(3)
    ]
    paced = settings.model_copy(update={"github_write_gap": gap})
    return GitHubApp(paced, redis=redis, **app).installation(iid), heads


def runs(github: GitHubServer, sha: str) -> list[dict[str, Any]]:
    return [
        r
        for r in github.repo(REPO).check_runs.values()
        if r["head_sha"] == sha and r["name"] == NAME
    ]


def update(sha: str, status: str = "in_progress", **kw: Any) -> Update:
    return Update(head_sha=sha, status=status, title=kw.pop("title", status), summary="s", **kw)


def test_a_turn_hands_its_update_over_and_a_newer_head_replaces_one_waiting(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, heads = setup(github, settings, redis)
    assert gh.pace is not None
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    gh.pace.pause(1.5, "a test's 403", slower=False)  # GitHub's line is long
    started = time.monotonic()
    checks.submit(update(heads[0], new_head=True))
    checks.submit(update(heads[1], new_head=True, title="turn 2"))
    assert time.monotonic() - started < 0.5  # the turn was not held
    assert checks.flush(timeout=30)
    assert runs(github, heads[0]) == []  # pushed over before its turn came: none needed
    (run,) = runs(github, heads[1])
    assert (run["status"], run["output"]["title"]) == ("in_progress", "turn 2")


def test_what_the_loop_ends_on_goes_at_once_after_what_was_handed_over(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """The ``completed`` update is not left to the thread: it is written before ``send``
    returns, and the head's check run is made once, never twice: an update being written
    is waited for (its id is then known), one still waiting for its slot is folded in
    (it was to make the run: no search for one first)."""
    gh, heads = setup(github, settings, redis)
    assert gh.pace is not None
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    # 1. The thread's create is in flight (GitHub is slow) when the end comes.
    github.inject("POST", r"/check-runs$", 0, delay=0.8)
    checks.submit(update(heads[0], new_head=True))
    time.sleep(0.3)
    checks.send(update(heads[0], "completed", conclusion="success", title="done"))
    assert checks.flush(timeout=30)
    (run,) = runs(github, heads[0])
    assert (run["status"], run["conclusion"], run["output"]["title"]) == (
        "completed",
        "success",
        "done",
    )
    # 2. The thread's update still waits for its slot (GitHub paused the installation).
    gh.pace.pause(1.0, "a test's 403", slower=False)
    checks.submit(update(heads[1], new_head=True))
    time.sleep(0.1)
    searched = len(github.requests)
    checks.send(update(heads[1], "completed", conclusion="failure", title="failed"))
    assert checks.flush(timeout=30)
    (run,) = runs(github, heads[1])
    assert (run["status"], run["conclusion"]) == ("completed", "failure")
    listed = [p for meth, p, _ in github.requests[searched:] if meth == "GET"]
    assert not [p for p in listed if p.endswith("/check-runs")], listed


def test_nothing_is_written_once_the_lease_is_gone(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, heads = setup(github, settings, redis)
    assert gh.pace is not None
    fence = Fence()
    checks = CheckRuns(gh, REPO, NAME, fence, "acme/widgets#1")
    gh.pace.pause(1.0, "a test's 403", slower=False)
    checks.submit(update(heads[0], new_head=True))
    fence.lost = True  # taken over while the update waited in line
    assert checks.flush(timeout=30)
    assert runs(github, heads[0]) == []
    with pytest.raises(LeaseLost):
        checks.send(update(heads[0], "completed", conclusion="success"))
    assert runs(github, heads[0]) == []


def test_an_update_that_failed_is_written_again_when_the_job_ends(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    # GitHub's retries without their real waits (the write gap is 0: nothing else sleeps).
    gh, heads = setup(github, settings, redis, sleep=lambda s: None)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    github.inject("POST", r"/check-runs$", 500, times=1000)
    checks.submit(update(heads[0], new_head=True, title="turn 1"))
    deadline = time.monotonic() + 60
    while checks._failed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checks._failed is not None, "the update never failed"
    assert runs(github, heads[0]) == []
    github.faults.clear()  # GitHub is back before the job ends
    assert checks.flush(timeout=30)
    (run,) = runs(github, heads[0])
    assert run["output"]["title"] == "turn 1"


# Found by a red team: both failed before the fixes in jobs/check_runs.py.


def test_in_progress_never_lands_after_completed_when_the_in_flight_write_fails(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """send() clears _failed *before* waiting for the thread's in-flight write; when that
    write then fails, the thread sets _failed again, and flush() at the job's end writes
    the stale in_progress on top of the completed run on the same head."""
    gh, heads = setup(github, settings, redis, sleep=lambda s: None)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    # The thread's create is slow (GitHub's line), then refused (422: not retried;
    # a 5xx past the client's retries takes the same path).
    github.inject("POST", r"/check-runs$", 422, delay=0.8, times=1)
    checks.submit(update(heads[0], new_head=True, title="turn 1"))
    time.sleep(0.3)  # the create is in flight
    checks.send(update(heads[0], "completed", conclusion="success", title="done"))
    (run,) = runs(github, heads[0])
    assert run["status"] == "completed"
    assert checks.flush(timeout=30)  # the job's end
    (run,) = runs(github, heads[0])
    assert (run["status"], run["output"]["title"]) == ("completed", "done"), run


def test_a_retried_create_whose_first_attempt_landed_makes_no_second_run(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """The thread's create fails on every attempt but the last, which GitHub applied
    before its answer was lost (a 502): the client gives up, the update is kept as
    failed *with new_head=True*, and flush() at the job's end creates again without
    searching first: two "loopbot" check runs on one head."""
    gh, heads = setup(github, settings, redis, sleep=lambda s: None)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    attempts = failures.MAX_ATTEMPTS
    github.inject("POST", r"/check-runs$", 500, times=attempts - 1)
    github.inject("POST", r"/check-runs$", 502, after=True, times=1)  # applied, answer lost
    checks.submit(update(heads[0], new_head=True, title="turn 1"))
    deadline = time.monotonic() + 60
    while checks._failed is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checks._failed is not None, "the update never failed"
    assert len(runs(github, heads[0])) == 1  # the last attempt landed
    assert checks.flush(timeout=30)  # the job's end: the failed update again
    assert len(runs(github, heads[0])) == 1, runs(github, heads[0])


def posts(github: GitHubServer) -> int:
    return sum(1 for m, p, _ in github.requests if m == "POST" and p.endswith("/check-runs"))


def patches(github: GitHubServer) -> int:
    return sum(1 for m, p, _ in github.requests if m == "PATCH" and "/check-runs/" in p)


def test_a_held_update_completed_within_its_hold_is_one_write(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """A verified head's ``in_progress`` is held: the pull request's ``completed`` comes
    within the hold and replaces it, and the run is created once, completed (issue 43)."""
    gh, heads = setup(github, settings, redis)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    before = (posts(github), patches(github))
    checks.submit(update(heads[0], new_head=True, hold=2.0))
    time.sleep(0.5)
    assert runs(github, heads[0]) == []  # held
    checks.send(update(heads[0], "completed", conclusion="success"))
    assert checks.flush(timeout=30)
    (run,) = runs(github, heads[0])
    assert (run["status"], run["conclusion"]) == ("completed", "success")
    assert (posts(github), patches(github)) == (before[0] + 1, before[1])


def test_a_held_update_with_no_completion_is_written_when_its_hold_ends(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, heads = setup(github, settings, redis)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    checks.submit(update(heads[0], new_head=True, hold=0.8))
    deadline = time.monotonic() + 10
    while not runs(github, heads[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    (run,) = runs(github, heads[0])
    assert run["status"] == "in_progress"


def test_a_held_update_that_came_while_another_waited_in_line_is_not_sent_in_its_slot(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """A failed turn's head waits in GitHub's line; the next head, verified, replaces it
    with a held update: when the slot comes, it goes unused, and the pull request's
    completion is that head's one write (in a fleet's long line it had been two)."""
    gh, heads = setup(github, settings, redis)
    assert gh.pace is not None
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    gh.pace.pause(1.0, "a test's 403", slower=False)  # GitHub's line is long
    before = (posts(github), patches(github))
    checks.submit(update(heads[0], new_head=True))  # joins the line
    time.sleep(0.2)
    checks.submit(update(heads[1], new_head=True, hold=5.0))  # verified: held
    time.sleep(1.5)  # the slot came and went
    assert runs(github, heads[1]) == []
    checks.send(update(heads[1], "completed", conclusion="success"))
    assert checks.flush(timeout=30)
    (run,) = runs(github, heads[1])
    assert run["status"] == "completed"
    assert runs(github, heads[0]) == []  # pushed over before its turn came
    assert (posts(github), patches(github)) == (before[0] + 1, before[1])


def test_an_update_discarded_before_it_is_written_makes_no_check_run(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """A clean catch-up leaves its head's check run to the critic: the ``in_progress``
    held for that head is dropped, and nothing is written at the job's end. A head whose
    run is made already is not dropped: it must be completed."""
    gh, heads = setup(github, settings, redis)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    checks.submit(update(heads[0], new_head=True, hold=60.0))  # held for its completion
    assert checks.discard(heads[0]) is True
    assert checks.flush(10) is True
    assert runs(github, heads[0]) == []
    checks.send(update(heads[1], new_head=True))
    assert len(runs(github, heads[1])) == 1
    assert checks.discard(heads[1]) is False  # made: the caller completes it
    assert checks.discard(heads[2]) is True  # nothing of this job's on it


def test_an_update_discarded_while_it_waits_in_github_s_line_is_never_written(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """Red team (issue 43): the thread has joined the line for its write when the clean
    catch-up discards the head's update: it goes with nothing, and no run is made."""
    gh, heads = setup(github, settings, redis)
    assert gh.pace is not None
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    gh.pace.pause(1.5, "a test's 403", slower=False)  # GitHub's line is long
    checks.submit(update(heads[0], new_head=True))  # not held: it joins the line
    time.sleep(0.3)
    assert checks.discard(heads[0]) is True
    assert checks.flush(timeout=30)
    assert runs(github, heads[0]) == []


def test_an_update_whose_answer_was_lost_is_not_discarded_and_is_completed_once(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """Red team (issue 43): GitHub made the ``in_progress`` run but its answer was lost:
    the discard says there may be one, and the loop's completion finds and completes it
    (one run on the head, never one left ``in_progress``)."""
    gh, heads = setup(github, settings, redis)
    checks = CheckRuns(gh, REPO, NAME, Fence(), "acme/widgets#1")
    github.inject("POST", r"/check-runs$", 502, after=True, times=1)
    checks.submit(update(heads[0], new_head=True))
    deadline = time.monotonic() + 10
    while not runs(github, heads[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checks.discard(heads[0]) is False
    checks.send(update(heads[0], "completed", conclusion="success"))
    assert checks.flush(timeout=30)
    (run,) = runs(github, heads[0])
    assert (run["status"], run["conclusion"]) == ("completed", "success")
