"""The job functions, by reference: which function runs each kind of loopbot job.

Importing this module registers them (``bot.io.queues.register``): a worker then runs
these four and nothing else, and the process may enqueue them. Every process that runs
or enqueues jobs imports it first: ``loopbot worker`` and ``loopbot restart``
(bot/ops/cli.py), the tests (tests/conftest.py) and the benches that start workers. The
web process does not: it enqueues only commands, by name (``COMMAND_ENTRY``).

It sits on top of ``jobs``: nothing in ``jobs`` imports it.
"""

from __future__ import annotations

from collections.abc import Callable

from bot.io.queues import JobKind, register
from jobs import critic, dispatch, loop, merge_gate

JOBS: dict[JobKind, Callable[..., str]] = {
    JobKind.COMMAND: dispatch.handle_command,
    JobKind.LOOP: loop.run_loop,
    JobKind.CRITIC: critic.run_critic,
    JobKind.GATE: merge_gate.run_gate,
}

for _kind, _fn in JOBS.items():
    register(_kind, _fn)
