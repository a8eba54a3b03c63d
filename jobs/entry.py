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
from jobs.dispatch import handle_command
from jobs.loop.job import run_loop
from jobs.review.critic import run_critic
from jobs.review.gate import run_gate

# Each travels in Redis under its kind's wire name (``bot.io.queues.WIRE_NAMES``), not
# under the module path it has here.
JOBS: dict[JobKind, Callable[..., str]] = {
    JobKind.COMMAND: handle_command,
    JobKind.LOOP: run_loop,
    JobKind.CRITIC: run_critic,
    JobKind.GATE: run_gate,
}

for _kind, _fn in JOBS.items():
    register(_kind, _fn)
