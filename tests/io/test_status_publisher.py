"""Coalesced status-comment edits (``jobs.status_comment``): inside a job, an edit of the
loop's status comment waits for its slot in the installation's pace on a thread of its
own, the loop goes on, and newer edits merge into one still waiting: a burst of five
states costs one edit, which shows the last state."""

from __future__ import annotations

import time

from redis import Redis

from bot.core.record import LoopRecord, Status
from bot.core.settings import Settings
from bot.io.github.client import GitHubApp
from bot.io.store import Store
from bot.standins.github import GitHubServer
from jobs import status_comment
from jobs.status_comment import post_status, publishing

REPO = "acme/widgets"


def setup(
    github: GitHubServer, settings: Settings, redis: Redis, gap: float, **app: object
) -> tuple:  # type: ignore[type-arg]
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    paced = settings.model_copy(update={"github_write_gap": gap})
    gh = GitHubApp(paced, redis=redis, **app).installation(iid)  # type: ignore[arg-type]
    store = Store(redis)
    record = store.put(LoopRecord(repo=REPO, issue=1, installation_id=iid))
    record = post_status(store, gh, record)  # created at once: the loop needs its id
    assert record.status_comment_id is not None
    return gh, store, record


def patches(github: GitHubServer) -> int:
    return sum(1 for m, p, _ in github.requests if m == "PATCH" and "/issues/comments/" in p)


def test_a_burst_of_states_costs_one_edit_and_the_last_state_wins(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, store, record = setup(github, settings, redis, gap=0.6)
    before = patches(github)
    started = time.monotonic()
    with publishing():
        for turn in range(1, 6):
            record = store.set_fields(record.key, turn=turn, status=Status.RUNNING)
            post_status(store, gh, record)
        handed = time.monotonic() - started
    # The loop was not held: five edits handed over faster than one write slot.
    assert handed < 0.5, handed
    sent = patches(github) - before
    assert sent == 1, sent  # the four that came while the first waited merged into it
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "turn 5" in body.lower(), body


def test_an_edit_built_after_its_wait_shows_the_state_at_that_moment(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """The one edit in line is built when its slot comes: a state written by the loop
    while it waited (without another post) is what GitHub gets."""
    gh, store, record = setup(github, settings, redis, gap=0.8)
    with publishing():
        record = store.set_fields(record.key, turn=1, status=Status.RUNNING)
        post_status(store, gh, record)
        store.set_fields(record.key, turn=2)  # before the slot (0.8 s after the create)
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "turn 2" in body.lower(), body


def test_outside_a_job_an_edit_is_sent_before_post_status_returns(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    gh, store, record = setup(github, settings, redis, gap=0.0)
    record = store.set_fields(record.key, turn=3, status=Status.RUNNING)
    before = patches(github)
    post_status(store, gh, record)
    assert patches(github) == before + 1
    assert status_comment._ACTIVE == 0


def test_a_loop_s_last_state_is_sent_at_once_or_fails_the_job(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """``now=True`` (a loop's last state, another loop's place) does not go through the
    publisher: it raises as before when GitHub cannot take it (the job fails and is
    retried), and the edits of that comment still waiting are dropped, not sent after."""
    import pytest

    from bot.io.github.failures import Unavailable

    gh, store, record = setup(github, settings, redis, gap=0.0)
    assert gh.pace is not None
    with publishing():
        record = store.set_fields(record.key, turn=4, status=Status.RUNNING)
        gh.pace.pause(600, "a test's 403", slower=False)
        post_status(store, gh, record)  # waits in the publisher (paused)
        with pytest.raises(Unavailable):
            post_status(store, gh, record, now=True)
        redis.delete(gh.pace.keys[0])
    assert status_comment._PUBLISHER is not None
    assert not status_comment._PUBLISHER._pending


def test_an_edit_that_failed_is_sent_again_when_the_job_ends(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """GitHub fails the publisher's edit past its retries; no newer edit comes: the job's
    end sends it once more, so the comment shows the last state asked for."""
    # GitHub's retries without their real waits (the write gap is 0: nothing else sleeps).
    gh, store, record = setup(github, settings, redis, gap=0.0, sleep=lambda s: None)
    github.inject("PATCH", r"/issues/comments/\d+$", 500, times=1000)
    with publishing():
        record = store.set_fields(record.key, turn=6, status=Status.RUNNING)
        post_status(store, gh, record)
        publisher = status_comment._PUBLISHER
        assert publisher is not None
        deadline = time.monotonic() + 60
        while not publisher._failed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert publisher._failed, "the edit never failed"
        github.faults.clear()  # GitHub is back before the job ends
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "turn 6" in body.lower(), body


def test_an_edit_that_would_leave_the_text_as_it_is_is_not_sent(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """Never two edits with the same text (issue 43): asked again for the text it has,
    it costs no write; a change a reader can see does, once."""
    gh, store, record = setup(github, settings, redis, gap=0.0)
    before = patches(github)
    post_status(store, gh, record)  # the text it was created with
    post_status(store, gh, record)
    assert patches(github) == before
    record = store.set_fields(record.key, turn=2, status=Status.RUNNING)
    post_status(store, gh, record)
    post_status(store, gh, record)
    assert patches(github) == before + 1


def test_edits_spread_over_the_hold_cost_one_write_showing_the_last(
    github: GitHubServer, settings: Settings, redis: Redis, monkeypatch: object
) -> None:
    """With no line at all (a quiet installation), the first edit of a burst waits HOLD
    for the rest: a turn's outcome and the pull request a second later are one edit."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(status_comment, "HOLD", 1.5)
    gh, store, record = setup(github, settings, redis, gap=0.0)
    before = patches(github)
    with publishing():
        record = store.set_fields(record.key, turn=1, status=Status.RUNNING)
        post_status(store, gh, record)
        time.sleep(0.7)
        assert patches(github) == before  # held
        record = store.set_fields(record.key, turn=2)
        post_status(store, gh, record)
        deadline = time.monotonic() + 10
        while patches(github) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        held = time.monotonic()
    assert patches(github) == before + 1
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "turn 2" in body.lower(), body
    assert held - deadline + 10 >= 0.5  # sent at the first edit's hold, not at once


def posts(github: GitHubServer) -> int:
    return sum(1 for m, p, _ in github.requests if m == "POST" and p.endswith("/comments"))


def test_a_quiet_step_is_dropped_at_the_job_s_end_and_the_next_edit_shows_it(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """A clean catch-up's steps (merged in, verified, on to the critic) are quiet: the
    job ends before their hold, so they cost no write; the next job's edit (the gate's)
    shows the state as it is then (issue 43)."""
    gh, store, record = setup(github, settings, redis, gap=0.0)
    before = patches(github)
    with publishing():
        record = store.set_fields(record.key, status=Status.REVIEWING, phase="catching up")
        post_status(store, gh, record, quiet=True)
    assert patches(github) == before  # dropped, not flushed
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "catching up" not in body
    with publishing():  # the next job's edit: the state now
        record = store.set_fields(record.key, status=Status.MERGING, phase="merging")
        post_status(store, gh, record)
    assert patches(github) == before + 1
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "merging" in body.lower(), body


def test_a_quiet_step_does_not_silence_an_edit_waiting_before_it(
    github: GitHubServer, settings: Settings, redis: Redis
) -> None:
    """An edit a maintainer acts on (a turn's outcome) waits; a quiet step replaces it
    with a newer state: the edit is still sent at the job's end, showing the newest."""
    gh, store, record = setup(github, settings, redis, gap=0.0)
    before = patches(github)
    with publishing():
        record = store.set_fields(record.key, turn=4, status=Status.RUNNING)
        post_status(store, gh, record)
        record = store.set_fields(record.key, phase="catching up")
        post_status(store, gh, record, quiet=True)
    assert patches(github) == before + 1
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "turn 4" in body.lower(), body


def test_a_quiet_step_that_outlasts_its_hold_is_shown(
    github: GitHubServer, settings: Settings, redis: Redis, monkeypatch: object
) -> None:
    """A catch-up whose verify takes long shows where it is once the quiet hold passes."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(status_comment, "QUIET_HOLD", 0.5)
    gh, store, record = setup(github, settings, redis, gap=0.0)
    before = patches(github)
    with publishing():
        record = store.set_fields(record.key, status=Status.RUNNING, turn=7)
        post_status(store, gh, record, quiet=True)
        deadline = time.monotonic() + 10
        while patches(github) == before and time.monotonic() < deadline:
            time.sleep(0.05)
    assert patches(github) == before + 1


def test_a_longer_hold_is_brought_forward_by_a_shorter_one_never_back(
    github: GitHubServer, settings: Settings, redis: Redis, monkeypatch: object
) -> None:
    """Verify passed and the pull request opens next: that edit may wait long for the
    PR's; the PR's own (shorter) hold then decides when the one write goes."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(status_comment, "HOLD", 0.3)
    gh, store, record = setup(github, settings, redis, gap=0.0)
    before = patches(github)
    with publishing():
        record = store.set_fields(record.key, turn=2, status=Status.RUNNING)
        post_status(store, gh, record, hold=60.0)
        time.sleep(0.5)
        assert patches(github) == before  # still held (60 s)
        record = store.set_fields(record.key, status=Status.REVIEWING)
        post_status(store, gh, record)  # HOLD: 0.3 s from now
        deadline = time.monotonic() + 10
        while patches(github) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert patches(github) == before + 1
        sent_at = time.monotonic()
    assert deadline - 10 + 60 > sent_at  # long before the first edit's 60 s


def test_the_comment_s_creation_is_held_with_the_first_edits(
    github: GitHubServer, settings: Settings, redis: Redis, monkeypatch: object
) -> None:
    """Inside a job, the comment is created after the hold too: a loop's start and its
    first turn's start are one write (the comment made showing the turn), not two."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(status_comment, "HOLD", 0.5)
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    gh = GitHubApp(settings, redis=redis).installation(iid)
    store = Store(redis)
    record = store.put(LoopRecord(repo=REPO, issue=1, installation_id=iid))
    before = posts(github)
    with publishing():
        record = store.set_fields(record.key, status=Status.RUNNING)
        post_status(store, gh, record, quiet=True)  # never quiet: not made yet
        record = store.set_fields(record.key, turn=1)
        post_status(store, gh, record)
        assert posts(github) == before  # held
    assert posts(github) == before + 1 and patches(github) == 0
    made = store.get(record.key)
    assert made is not None and made.status_comment_id is not None
    body = github.repo(REPO).comments[made.status_comment_id]["body"]
    assert "turn 1" in body.lower(), body


def test_a_last_state_sent_now_while_the_held_creation_is_in_flight_makes_one_comment(
    github: GitHubServer, settings: Settings, redis: Redis, monkeypatch: object
) -> None:
    """Red team (issue 43): the comment's creation is held, then sent by the publisher's
    thread. A loop that ends while that request is on its way posts its last state now:
    one comment, showing the last state, never two."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(status_comment, "HOLD", 0.1)
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"README.md": "hi\n"}, installation_id=iid)
    with github.as_user("acme") as alice:
        alice.post(f"/repos/{REPO}/issues", json={"title": "Bug", "body": "It breaks"})
    gh = GitHubApp(settings, redis=redis).installation(iid)
    store = Store(redis)
    record = store.put(LoopRecord(repo=REPO, issue=1, installation_id=iid, status=Status.RUNNING))
    # GitHub takes a while to answer the creation (no failure: only slow).
    github.inject("POST", rf"/repos/{REPO}/issues/1/comments$", 0, delay=1.0)
    with publishing():
        post_status(store, gh, record)  # held, then sent by the thread
        time.sleep(0.4)  # the creation is on its way
        ended = store.set_fields(record.key, status=Status.FAILED, reason="verify_failed")
        post_status(store, gh, ended, now=True)  # the loop's last state
    time.sleep(1.0)
    comments = [c for c in github.repo(REPO).comments.values() if c["_issue"] == 1]
    assert len(comments) == 1, [c["body"][:80] for c in comments]
    assert "**failed**" in comments[0]["body"], comments[0]["body"]


def test_a_last_state_sent_now_is_not_overwritten_by_an_older_edit_in_flight(
    github: GitHubServer, settings: Settings, redis: Redis, monkeypatch: object
) -> None:
    """The same race on an edit: the thread's edit of an older state, slow on its way,
    must not land after the loop's last state, sent now."""
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setattr(status_comment, "HOLD", 0.1)
    gh, store, record = setup(github, settings, redis, gap=0.0)
    github.inject("PATCH", r"/issues/comments/\d+$", 0, delay=1.0)  # slow, not failing
    with publishing():
        post_status(store, gh, store.set_fields(record.key, status=Status.RUNNING, turn=2))
        time.sleep(0.4)  # that edit is on its way
        ended = store.set_fields(record.key, status=Status.FAILED, reason="verify_failed")
        post_status(store, gh, ended, now=True)
    time.sleep(1.0)
    body = next(iter(github.repo(REPO).comments.values()))["body"]
    assert "**failed**" in body, body
