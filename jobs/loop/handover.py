"""The hand-over: a worker shutting down (SIGTERM) leaves its loop committed, pushed and
saved for another worker (``jobs.drain``)."""

from __future__ import annotations

from bot.core.rules.lifecycle import Requeue
from bot.io.github import tally
from bot.io.logs import get_logger
from jobs import lifecycle
from jobs.loop.runner import RunnerBase

log = get_logger("loopbot.loop")


class Handover(RunnerBase):
    """Handing the loop over when the worker shuts down."""

    def _handoff(self, note: str) -> str:
        """The worker is shutting down: leave the loop, pushed and saved, to another one.

        ``note`` is what the next turn's prompt says (the pending verify failure, if any).
        The reconciler of any live worker resumes it at once (see ``jobs.drain``).
        """
        tally.enter("handoff")
        self._pushed()
        lifecycle.requeue(
            self.store,
            self.key,
            Requeue.HANDOFF,
            note=note,
            by=self.lease.owner,
            gh=self.gh,
            tail=self._verify_tail,
        )
        return "handed over: the worker is shutting down"
