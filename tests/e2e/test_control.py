"""Control and recovery with real forking workers (`loopbot worker` processes)."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from redis import Redis
from rq import Worker
from rq.job import JobStatus

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.core.settings import load_settings
from bot.core.text.defuse import JOINER as J
from bot.io.github import failures
from bot.io.queues import fetch_job
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.redis_server import RedisServer
from jobs import runtime as runtime_mod
from jobs.reconciler import resume_lapsed, sweep
from jobs.runtime import Runtime
from tests.conftest import Web, run_control_jobs, wait_for
from tests.helpers import REPO, comment, label, open_issue, sample_repo, started_loop

KEY = f"{REPO}#1"
YML = (
    "verify: python3 -m unittest -q\nmax_turns: 5\ncritic:\n  enabled: false\n"
    "merge:\n  enabled: false\n"
)
FIX = m.replace("calc.py", "return a - b", "return a + b")
FAST = {"LOOPBOT_LEASE_TTL": "3", "LOOPBOT_RECONCILE_INTERVAL": "1"}


def rec(redis: Redis) -> Any:
    return Store(redis).get(KEY)


def bot_replies(github: GitHubServer) -> list[str]:
    return [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if c["user"]["type"] == "Bot" and "loopbot:reply" in c["body"]
    ]


def turn_one_pushes_then_turn_two_sleeps(model: AnthropicServer) -> None:
    model.play(m.write_file("NOTES.md", "turn one\n"), m.text("Started."), m.bash("sleep 120"))


def turn_one_pushed(github: GitHubServer) -> str:
    """Turn one's commit, once on the remote branch. A turn does not wait for its push after
    verify (the next turn waits for it before its own commit), so turn 2's model call alone
    does not mean the push has landed: on a loaded machine it had not yet."""
    return str(wait_for(lambda: github.ref(REPO, "loop/issue-1"), 30, "turn one's push"))


def test_cancel_during_a_long_turn_then_restart(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    workers("a", **FAST)
    turn_one_pushes_then_turn_two_sleeps(model)
    n = open_issue(github)
    label(github, "writer", n)
    wait_for(lambda: len(model.requests) >= 3, 60, "turn 2's sleeping tool call")
    pushed = turn_one_pushed(github)
    time.sleep(0.5)  # the sandboxed `sleep 120` is running now
    started = time.monotonic()
    cid = comment(github, "writer", n, "/loop-cancel")
    job_id = LoopId(REPO, n).job_id
    wait_for(lambda: rec(redis).status == Status.CANCELLED, 10, "status cancelled")
    wait_for(
        lambda: fetch_job(job_id, redis).get_status(refresh=True) != JobStatus.STARTED,
        10,
        "the job to stop",
    )
    assert time.monotonic() - started < 5
    assert rec(redis).reason == "cancelled"
    assert github.ref(REPO, "loop/issue-1") == pushed  # branch kept
    assert any(
        r["content"] == "eyes" and r["comment_id"] == cid for r in github.repo(REPO).reactions
    )
    wait_for(
        lambda: any(f"Cancelled by @{J}writer" in b for b in bot_replies(github)), 10, "a reply"
    )

    model.play(FIX, m.text("Fixed add."))
    comment(github, "writer", n, "/loop-restart")
    wait_for(lambda: rec(redis).status == Status.COMPLETED, 60, "the restarted loop to finish")
    r = rec(redis)
    assert r.restarts == 1 and r.turn == 1  # turn count reset on restart
    assert len(github.repo(REPO).pulls) == 1
    head = github.ref(REPO, "loop/issue-1")
    # The commit from before the cancel is still on the branch.
    gitrepo.git(github.repo(REPO).path, "merge-base", "--is-ancestor", pushed, head)  # type: ignore[arg-type]
    # The cancelled turn's conversation was kept: the restart continued it.
    last = [b for b in model.requests][-2]
    assert last["messages"][0]["content"][0]["text"].startswith("Resolve issue #1")


def test_killed_worker_is_resumed_elsewhere(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    a = workers("a", **FAST)
    turn_one_pushes_then_turn_two_sleeps(model)
    n = open_issue(github)
    label(github, "writer", n)
    wait_for(lambda: len(model.requests) >= 3, 60, "turn 2")
    pushed = turn_one_pushed(github)
    time.sleep(0.5)
    a.kill()  # SIGKILL: worker, work horse and sandbox, mid-turn
    killed = time.monotonic()
    model.play(FIX, m.text("Fixed add."))
    workers("b", **FAST)  # another machine: its own, empty data dir
    wait_for(lambda: rec(redis).status == Status.COMPLETED, 60, "the loop to complete on b")
    assert time.monotonic() - killed < 60
    r = rec(redis)
    assert r.auto_resumes == 1
    assert len(github.repo(REPO).pulls) == 1
    head = github.ref(REPO, "loop/issue-1")
    gitrepo.git(github.repo(REPO).path, "merge-base", "--is-ancestor", pushed, head)  # type: ignore[arg-type]
    events = [e["kind"] for e in Store(redis).events(KEY)]
    assert "loop_resumed" in events


def test_hours_stop_counting_when_the_worker_is_gone(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    """A worker killed mid-turn writes nothing more; its loop is resumed only once another
    worker runs, 8 s later. The hours budget counts the dead worker up to its last
    heartbeat (a lease renewal) and the lease's TTL, not the whole gap until the resume."""
    sample_repo(github, loop_yml=YML)
    a = workers("a", **FAST)
    started = time.time()
    turn_one_pushes_then_turn_two_sleeps(model)
    n = open_issue(github)
    label(github, "writer", n)
    wait_for(lambda: len(model.requests) >= 3, 60, "turn 2")
    time.sleep(0.5)
    a.kill()
    gap = 8.0
    time.sleep(gap)
    model.play(FIX, m.text("Fixed add."))
    workers("b", **FAST)
    wait_for(lambda: rec(redis).status == Status.COMPLETED, 60, "the loop to complete on b")
    r = rec(redis)
    assert r.auto_resumes == 1
    elapsed = time.time() - started
    ttl = float(FAST["LOOPBOT_LEASE_TTL"])
    # Without heartbeats the whole gap would count: elapsed minus the waits before start.
    assert r.active_seconds <= elapsed - gap + ttl + 1.0, (r.active_seconds, elapsed)


def test_sigterm_hands_the_loop_over_without_counting_a_lost_worker(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, workers: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    a = workers("a", **FAST)
    # Turn 1 pushes a commit; turn 2's model call takes 3 s, long enough to stop the worker.
    model.play(m.write_file("NOTES.md", "turn one\n"), m.text("Started."), m.bash("ls", delay=3.0))
    n = open_issue(github)
    label(github, "writer", n)
    wait_for(lambda: len(model.requests) >= 3, 60, "turn 2's model call")
    pushed = turn_one_pushed(github)
    stopping = time.monotonic()
    assert a.terminate(timeout=30) == 0, a.output()  # a deploy stops the worker
    assert time.monotonic() - stopping < 15
    r = rec(redis)
    # Handed over (and perhaps already re-queued by a reconciler): waiting for a worker.
    assert r.status == Status.QUEUED and r.phase in ("handoff", "queued"), r
    assert "middle of turn 2" in r.resume_note
    assert "handoff" in [e["kind"] for e in Store(redis).events(KEY)]
    # The tool call the model asked for was answered, not run: the conversation is valid.
    last = Store(redis).conversation(KEY)[-1]
    assert last["role"] == "user" and "turn ended (shutdown)" in json.dumps(last)
    model.play(FIX, m.text("Fixed add."))
    workers("b", **FAST)  # the new deploy
    wait_for(lambda: rec(redis).status == Status.COMPLETED, 60, "the loop to complete on b")
    r = rec(redis)
    assert r.auto_resumes == 0  # a handover is not a lost worker
    assert len(github.repo(REPO).pulls) == 1
    head = github.ref(REPO, "loop/issue-1")
    gitrepo.git(github.repo(REPO).path, "merge-base", "--is-ancestor", pushed, head)  # type: ignore[arg-type]
    resumed = [e["data"] for e in Store(redis).events(KEY) if e["kind"] == "loop_resumed"]
    assert resumed == [{"reason": "handoff"}]


def test_redis_restart_mid_loop(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    redis_server: RedisServer,
    workers: Any,
) -> None:
    sample_repo(github, loop_yml=YML)
    workers("a")
    model.play(m.bash("ls", delay=3.0), FIX, m.text("Fixed add."))
    n = open_issue(github)
    label(github, "writer", n)
    wait_for(lambda: len(model.requests) >= 1, 60, "the first model call")
    redis_server.restart(down_for=1.0)  # while the model "thinks"
    wait_for(lambda: rec(redis).status == Status.COMPLETED, 60, "the loop to complete")
    assert len(github.repo(REPO).pulls) == 1
    assert rec(redis).turn == 1


def test_five_stalls_stop_the_loop(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    env: dict[str, str],
    drain: Any,
) -> None:
    settings = load_settings(
        {**env, "LOOPBOT_STALL_TIMEOUT": "0.3", "LOOPBOT_MODEL_RETRIES": "0"}, role="worker"
    )
    runtime_mod.install(Runtime(settings, redis))
    model.responder = lambda body: m.text("too late", delay=1.0)
    sample_repo(github, loop_yml=YML)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = rec(redis)
    assert (r.status, r.reason) == (Status.STALLED, "stall_timeout"), r
    assert len(model.requests) == 5
    steps = [e["data"]["tool"] for e in Store(redis).events(KEY) if e["kind"] == "step"]
    assert steps == [f"stall {i}: APITimeoutError" for i in range(1, 6)]


@pytest.mark.parametrize("env_extra", [{"LOOPBOT_MODEL_RETRIES": "2"}])
def test_refused_calls_are_retried_as_the_api_asks_and_cost_nothing(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """A 429 and a 529 (the agent retries them itself, the SDK's retries being off so a
    timed-out attempt is never resent unchecked): waited for as ``retry-after`` says,
    then the loop goes on; a refusal is not billed, so only the answered calls count."""
    model.play(
        m.Fail(429, "slow down", "rate_limit_error", headers={"retry-after": "0"}),
        m.Fail(529, "Overloaded", "overloaded_error", headers={"retry-after": "0"}),
        FIX,
        m.text("Fixed add."),
    )
    sample_repo(github, loop_yml=YML)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    r = rec(redis)
    assert r.status == Status.COMPLETED, r
    assert len(model.requests) == 4
    assert sum(u.messages for k, u in r.usage.items() if not k.endswith("/triage")) == 2


def test_non_writer_cancel_has_no_effect_and_says_nothing(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    n = open_issue(github)
    label(github, "writer", n)
    github.wait_for_webhooks()
    run_control_jobs(redis)  # the loop is queued, not yet run
    comment(github, "reader", n, "/loop-cancel")
    comment(github, "stranger", n, "/loop-status")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    assert rec(redis).status == Status.QUEUED
    assert github.repo(REPO).reactions == []
    assert bot_replies(github) == []


def test_status_and_restart_of_a_completed_loop(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    model.play(FIX, m.text("Fixed."))
    sample_repo(github, loop_yml=YML)
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    assert rec(redis).status == Status.COMPLETED
    comment(github, "writer", n, "/loop-restart")
    comment(github, "writer", n, "/loop-status")
    drain()
    replies = bot_replies(github)
    assert any("completed; it is history and cannot be restarted" in b for b in replies), replies
    assert any("completed" in b and "Pull request:" in b and "turn 1 of 5" in b for b in replies)
    assert rec(redis).status == Status.COMPLETED and rec(redis).restarts == 0


def test_sweep_picks_up_a_label_whose_webhook_never_arrived(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, rt: Runtime, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML)
    github.repo(REPO).permissions["triager"] = "triage"
    github.add_user("triager")
    github.webhooks_enabled = False  # the deliveries are lost
    n = open_issue(github)
    label(github, "writer", n)
    other = open_issue(github, "another", "by a triager")
    label(github, "triager", other)
    assert Store(redis).get(KEY) is None
    assert sweep(rt) == [KEY]  # the triager's label starts nothing: no write access
    github.webhooks_enabled = True
    model.play(FIX, m.text("Fixed."))
    drain()
    assert rec(redis).status == Status.COMPLETED and rec(redis).started_by == "writer"
    assert sweep(rt) == []  # a second pass finds nothing new


def test_one_installation_github_refuses_does_not_stop_the_sweep_of_the_others(
    github: GitHubServer, redis: Redis, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by bench/chaos.py (seed 406282): an installation GitHub had paused made the
    whole sweep pass fail (reconciler.step_failed), so a lost label in every other
    installation waited for a pass where none was paused."""
    # The same retries of the refused token request, without their pauses (1+2+4+8+16 s).
    monkeypatch.setattr(failures, "_backoff", lambda attempt: 0.0)
    broken = github.add_installation("paused-org")  # listed first: the lower id
    github.add_repo("paused-org/app", {".github/loop.yml": YML}, installation_id=broken)
    sample_repo(github, loop_yml=YML)
    github.webhooks_enabled = False  # the deliveries are lost
    label(github, "writer", open_issue(github))
    # Every token request of the first installation fails: it can list nothing.
    github.inject("POST", rf"^/app/installations/{broken}/access_tokens$", 502, times=1000)
    assert sweep(rt) == [KEY]


def test_lapsed_lease_is_resumed_then_stalled_after_the_limit(
    github: GitHubServer, redis: Redis, rt: Runtime
) -> None:
    from bot.core.record import LoopRecord

    store = Store(redis)
    store.put(
        LoopRecord(repo=REPO, issue=1, installation_id=1, status=Status.RUNNING, updated_at=0)
    )
    store.put(store.get(KEY).model_copy(update={"updated_at": 0}), touch=False)  # type: ignore[union-attr]
    assert resume_lapsed(rt) == [KEY]
    r = store.get(KEY)
    assert r is not None and r.status == Status.QUEUED and r.auto_resumes == 1
    store.put(
        r.model_copy(update={"status": Status.RUNNING, "updated_at": 0, "auto_resumes": 3}),
        touch=False,
    )
    # The resumed job was taken by a worker that died too (its job is gone, no lease).
    fetch_job(LoopId(REPO, 1).job_id, redis).delete()
    resume_lapsed(rt)
    r = store.get(KEY)
    assert r is not None and (r.status, r.reason) == (Status.STALLED, "stall_timeout")
    # A loop whose lease is held is left alone.
    store.put(
        r.model_copy(update={"status": Status.RUNNING, "updated_at": 0, "auto_resumes": 0}),
        touch=False,
    )
    store.take_lease(KEY, "someone", 30)
    assert resume_lapsed(rt) == []


@pytest.mark.parametrize("claim", ["queued", "scheduled"])
def test_a_loop_whose_job_waits_nowhere_is_resumed(
    claim: str, github: GitHubServer, redis: Redis, rt: Runtime
) -> None:
    """A running loop with no lease whose RQ job says it waits (queued, or scheduled for
    a retry) but is in no queue and no schedule (an entry lost in a failover, a replaced
    job's late status) waits for a job that never comes: the reconciler resumes it
    (issue 37, item 9). Before, it was left alone for ever as "between RQ retries"."""
    from bot.core.record import LoopRecord
    from bot.io.queues import LOOP_QUEUE
    from jobs.lifecycle import enqueue_loop

    store = Store(redis)
    store.put(
        LoopRecord(repo=REPO, issue=1, installation_id=1, status=Status.RUNNING, updated_at=0),
        touch=False,
    )
    loop = LoopId(REPO, 1)
    enqueue_loop(redis, loop)
    job = fetch_job(loop.job_id, redis)
    assert redis.lrem(f"rq:queue:{LOOP_QUEUE}", 0, loop.job_id) == 1  # lost from its queue
    if claim == "scheduled":
        job.set_status(JobStatus.SCHEDULED)  # as a retry says, with no schedule entry
    assert job.get_status(refresh=True) == claim
    assert resume_lapsed(rt) == [KEY]
    r = store.get(KEY)
    assert r is not None and r.status == Status.QUEUED and r.auto_resumes == 1
    assert redis.lpos(f"rq:queue:{LOOP_QUEUE}", loop.job_id) is not None  # its job again
    # A job that does wait where it says is left to run.
    store.put(r.model_copy(update={"status": Status.RUNNING, "updated_at": 0}), touch=False)
    assert resume_lapsed(rt) == []


def test_a_worker_that_lost_its_lease_leaves_the_loop_alone(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, env: dict[str, str]
) -> None:
    from jobs.loop.job import LEASE_LOST, run_loop

    n = started_loop(github, redis, env, YML, LOOPBOT_LEASE_TTL="3")

    def presumed_dead(body: dict[str, Any]) -> m.Item:
        # The reconciler gave the loop to another worker while this one was slow.
        Store(redis).force_release_lease(KEY)
        Store(redis).take_lease(KEY, "other-worker", 30)
        time.sleep(1.5)  # long enough for this worker's renewal to notice
        return m.text("done")

    model.responder = presumed_dead
    assert run_loop(REPO, n) == LEASE_LOST
    r = rec(redis)
    assert r.status == Status.RUNNING and r.reason == ""  # untouched for the new owner
    assert Store(redis).lease_holder(KEY) == "other-worker"
    assert Store(redis).conversation(KEY) == []  # the old worker saved nothing


def test_restart_while_the_critic_has_the_pull_request(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, rt: Runtime
) -> None:
    """``/loop-restart`` on a reviewing loop: refused while its critic job waits or runs
    (a restart would race it), and saying so; once that job is lost, the restart queues
    it again and the loop goes on from review, not from a new coding round."""
    from rq import SimpleWorker

    from bot.io.queues import LOOP_QUEUE, loop_queue, make_worker

    model.play(FIX, m.text("Fixed add."))
    sample_repo(github, loop_yml="verify: python3 -m unittest -q\nmax_turns: 5\n")
    n = open_issue(github)
    label(github, "writer", n)
    github.wait_for_webhooks()
    run_control_jobs(redis)
    make_worker([LOOP_QUEUE], redis, SimpleWorker).work(burst=True, max_jobs=1)  # the loop
    assert rec(redis).status == Status.REVIEWING
    assert len(loop_queue(redis)) == 1  # its critic job, not yet run

    comment(github, "writer", n, "/loop-restart")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    r = rec(redis)
    assert r.status == Status.REVIEWING and r.turn == 1, r
    replies = [c["body"] for c in github.repo(REPO).comments.values() if "reply:" in c["body"]]
    assert "Not restarted: the critic is reviewing pull request" in replies[-1]
    assert len(loop_queue(redis)) == 1  # nothing else queued: no second coding job

    loop_queue(redis).empty()  # the critic's job is lost (its worker died before it ran)
    time.sleep(1.1)  # a second comment in the same second is a byte-identical delivery
    comment(github, "writer", n, "/loop-restart")
    github.wait_for_webhooks()
    run_control_jobs(redis)
    replies = [c["body"] for c in github.repo(REPO).comments.values() if "reply:" in c["body"]]
    assert "had been lost" in replies[-1] and "stays reviewing" in replies[-1]
    assert len(loop_queue(redis)) == 1
    model.play(m.structured({"verdict": "approve", "summary": "ok", "findings": []}))
    make_worker([LOOP_QUEUE], redis, SimpleWorker).work(burst=True)
    r = rec(redis)
    assert r.status in (Status.MERGING, Status.COMPLETED), r
    assert r.turn == 1  # no new coding round


def test_a_stopping_worker_ends_its_reconciler_s_step_before_it_exits(
    redis: Redis, workers: Any
) -> None:
    """The reconciler is a daemon thread of the worker: a worker that exited mid-step cut
    it off where it stood. The hand-over test's stall (issue 37, item 9): the draining
    worker's own reconciler took over the loop it had just handed over, wrote the record
    (resumed, no longer handed over), deleted the old RQ job and was cut off before it
    enqueued the new one; the loop sat queued with no job until the queued grace, two
    minutes. Here the take-over waits for the loop's lock when the worker is stopped:
    the worker finishes the step, and the loop has its job, before it exits."""
    from bot.core.record import LoopRecord
    from bot.io.pace import Pace
    from bot.io.queues import LOOP_QUEUE

    store = Store(redis)
    store.put(
        LoopRecord(
            repo=REPO,
            issue=1,
            installation_id=1,
            status=Status.QUEUED,
            phase="handoff",
            handed_over=True,
            updated_at=0,
        ),
        touch=False,
    )
    Pace(redis).adopt(KEY, REPO)  # it holds its slot, as a handed-over loop does
    assert store.take_lease(KEY, "the-worker-handing-it-over", 60)  # not yet to take over
    loop = LoopId(REPO, 1)
    a = workers("a", **FAST)
    # SIGTERM once RQ's handlers are in place: the worker waits for jobs.
    wait_for(
        lambda: any(
            w.get_state() == "idle" and LOOP_QUEUE in w.queue_names()
            for w in Worker.all(connection=redis)
        ),
        30,
        "the worker waiting for jobs",
    )
    with store.lock(KEY, timeout=120):  # the take-over waits here (30 s at most)
        store.force_release_lease(KEY)  # handed over: the next pass takes it over
        # The pass that saw the release says so before it waits for the lock. (Waiting
        # for a pass to begin after the release raced: the pass in progress could be the
        # one that saw it, and no other begins while it waits here.)
        wait_for(lambda: "reconciler.lapsed" in a.output(), 20, "a pass to find it lapsed")
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        # Before, the worker exited at once, its reconciler with it; now it says it waits.
        wait_for(
            lambda: a.proc.poll() is not None or "reconciler.finishing_pass" in a.output(),
            20,
            "the worker to exit or wait for its reconciler",
        )
    assert a.proc.wait(30) == 0, a.output()[-3000:]
    r = store.get(KEY)
    assert r is not None and r.status == Status.QUEUED and not r.handed_over, r
    assert redis.lpos(f"rq:queue:{LOOP_QUEUE}", loop.job_id) is not None  # its job waits
    resumed = [e["data"] for e in store.events(KEY) if e["kind"] == "loop_resumed"]
    assert resumed == [{"reason": "handoff"}]
