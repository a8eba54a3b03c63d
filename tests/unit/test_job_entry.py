"""Jobs run by function reference (jobs/entry.py) and travel under their kind's wire name,
release 0.1.0's, wherever the function lives now; the command entry point is the one the
web process enqueues without importing ``jobs``."""

from __future__ import annotations

import pytest
from redis import Redis
from rq.utils import import_attribute

from bot.io import queues
from bot.io.queues import COMMAND_ENTRY, JobKind, RefusedJob, job_name, register
from jobs import dispatch, entry
from jobs.loop import job as loop
from jobs.review import critic, gate


def test_the_command_entry_point_is_dispatchs_handle_command() -> None:
    assert COMMAND_ENTRY == "jobs.dispatch.handle_command"
    assert job_name(dispatch.handle_command) == COMMAND_ENTRY


def test_entry_registers_every_kind_by_reference() -> None:
    assert set(entry.JOBS) == set(JobKind)
    names = {
        JobKind.COMMAND: "jobs.dispatch.handle_command",
        JobKind.LOOP: "jobs.loop.run_loop",
        JobKind.CRITIC: "jobs.critic.run_critic",
        JobKind.GATE: "jobs.merge_gate.run_gate",
    }
    for kind, name in names.items():
        assert queues.func_name(kind) == name
        assert queues.kind_of(name) is kind
    assert queues.job_functions() == frozenset(names.values())
    # Where the functions live now: not a name any job carries.
    assert queues.kind_of(job_name(loop.run_loop)) is None
    assert entry.JOBS[JobKind.LOOP] is loop.run_loop
    assert entry.JOBS[JobKind.CRITIC] is critic.run_critic
    assert entry.JOBS[JobKind.GATE] is gate.run_gate


def test_nothing_registered_runs_nothing_but_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queues, "_registered", {})
    assert queues.job_functions() == frozenset({COMMAND_ENTRY})
    assert queues.kind_of("jobs.loop.run_loop") is None
    with pytest.raises(RefusedJob, match=r"import jobs\.entry"):
        queues.func_name(JobKind.LOOP)


def test_register_refuses_what_rq_could_not_run_or_a_second_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queues, "_registered", {})
    with pytest.raises(ValueError, match="no module-level name"):
        register(JobKind.LOOP, lambda: "x")
    with pytest.raises(ValueError, match="the command job must be"):
        register(JobKind.COMMAND, loop.run_loop)
    register(JobKind.LOOP, loop.run_loop)
    register(JobKind.LOOP, loop.run_loop)  # the same again is fine
    with pytest.raises(ValueError, match="already"):
        register(JobKind.LOOP, critic.run_critic)


@pytest.mark.parametrize(
    ("wire", "kind"),
    [
        ("jobs.loop.run_loop", JobKind.LOOP),
        ("jobs.critic.run_critic", JobKind.CRITIC),
        ("jobs.merge_gate.run_gate", JobKind.GATE),
    ],
)
def test_a_job_under_its_wire_name_runs_the_registered_function(wire: str, kind: JobKind) -> None:
    """0.1.0's module paths are gone (jobs/ has rooms), yet its jobs still run: the worker
    takes the registered function, it never imports the name it read from Redis."""
    with pytest.raises((ImportError, AttributeError, ValueError)):
        import_attribute(wire)
    job = queues.LoopbotJob.create(
        wire, args=("acme/widgets", 1), meta=dict(queues.JOB_META), connection=Redis()
    )
    assert job.refusal() is None
    assert job.func is entry.JOBS[kind]


@pytest.mark.parametrize("name", [["jobs.loop.run_loop"], {"f": 1}, None, 5])
def test_a_function_name_that_is_not_a_string_is_refused_with_a_reason(name: object) -> None:
    """JSON lets a planted job name its function with a list or an object: refused with a
    reason, like any other name, not a TypeError (a red team's finding)."""
    job = queues.LoopbotJob.create(
        "jobs.loop.run_loop", args=("a/b", 1), meta=dict(queues.JOB_META), connection=Redis()
    )
    job._func_name = name  # what RQ decodes from the job's data
    assert job.refusal() == f"{str(name)[:200]!r} is not one of loopbot's job functions"
