"""Held-out verify in the loop: on a head whose verify passed, before the pull request,
did the change make verify pass by changing what verify checks? The rules are
bot/core/evidence/held_out.py; this part runs verify with the tests as on the base and
records what it said."""

from __future__ import annotations

from typing import Any

from bot.core.evidence import held_out, runs
from bot.io.logs import get_logger
from jobs.loop import evidence
from jobs.loop.runner import RunnerBase
from jobs.sandbox.bwrap import Result

log = get_logger("loopbot.loop")

TAMPER_TURNS = 1  # turns the agent gets to fix the code instead; then a person decides


class HeldOut(RunnerBase):
    """Held-out verify and the runners' counts, once per verified head."""

    def _tests_changed_to_pass(
        self, head: str, verify: Result | None, title: str, body: str
    ) -> str:
        """The note for one more turn when the tests were changed to pass and the agent
        has not had its turn to fix the code instead; "" to go on (to the pull request,
        where loopbot's own sev1 stands for a person when the evidence still does).
        ``verify``: the head's verify run, or None when the loop resumed past it (a
        worker killed between verify and this check): verify runs again then."""
        record = self._record()
        if record.kind == "metric":  # its evidence is the results table and its guard
            return ""
        ev = record.test_evidence
        if ev.get("sha") != head:
            if verify is None:
                verify = self._harness(self.config.verify)
            ev = self._gather(head, verify, title, body)
        if not held_out.stands(ev, head):
            return ""
        given = record.tamper_turns < TAMPER_TURNS and not ev.get("asked")
        self.store.event(
            self.key,
            "tests_changed_to_pass",
            sha=head,
            summary=held_out.summary(ev),
            asked=bool(ev.get("asked")),
            then="turn" if given else "person",
        )
        if not given:
            return ""
        self._set(tamper_turns=record.tamper_turns + 1)
        return held_out.turn_note(ev)

    def _gather(self, head: str, verify: Result, title: str, body: str) -> dict[str, Any]:
        record = self._record()
        base_verify = record.base_verify
        base_counts = runs.from_json(base_verify.get("tests"))
        head_counts = runs.parse(verify.output)
        not_run = ""
        if not base_verify:
            not_run = "verify was not run on the base"
        elif base_verify.get("passed"):
            not_run = "verify passed on the base: the tests as they were do not show the issue"
        elif base_verify.get("timed_out"):
            not_run = "verify timed out on the base: its failure says nothing about the tests"
        if not_run and not runs.ran_less(base_counts, head_counts, head_passed=verify.passed):
            # Nothing can stand: no held-out run, and the counts say nothing. The git
            # work below is skipped (a turn's overhead, bench/loop_overhead.py).
            fork, changed, held = self.checkout.base_sha, [], []
        else:
            fork = self.worktrees.fork_point(self.checkout, head)
            changed = self.worktrees.changed_paths(self.checkout, head)
            held = held_out.held_out_paths(changed, self.config.verify)
        result: dict[str, Any] | None = None
        if not not_run and not held:
            not_run = "the change touches no file verify runs"
        elif not not_run and len(held) > held_out.MAX_HELD:
            # Too many to put back at once: say so, and let a person look.
            result = {"passed": False, "exit_code": None, "timed_out": False, "tail": ""}
            not_run = f"{len(held)} files verify runs changed"
        elif not not_run:
            self._set(phase="verifying_held_out")
            with self.worktrees.held_out(self.checkout, fork, held):
                self.sandbox.adopt()  # git wrote the base's files as the worker
                ran = self._harness(self.config.verify)
            self.sandbox.adopt()
            result = {
                "passed": ran.passed,
                "exit_code": ran.exit_code,
                "timed_out": ran.timed_out,
                "seconds": round(ran.seconds, 3),
                "tail": ran.output[-evidence.TAIL_CHARS :],
                "tests": runs.to_json(runs.parse(ran.output)),
            }
        ev = held_out.record(
            sha=head,
            base=fork,
            verify=self.config.verify,
            held=held,
            changed=changed,
            base_counts=base_counts,
            head_counts=head_counts,
            held_result=result,
            not_run=not_run,
            asked=held_out.asks_for_test_change(title, body),
            held_tree=self.worktrees.listed(self.checkout, head, held),
            head_passed=verify.passed,
        )
        self._set(test_evidence=ev)
        self.store.event(
            self.key,
            "held_out_verify",
            sha=head,
            base=fork,
            command=self.config.verify,
            held=ev["held"][:50],
            code_changed=ev["code_changed"],
            ran=bool(result) and not not_run,
            not_run=ev["not_run"],
            passed=(result or {}).get("passed"),
            exit_code=(result or {}).get("exit_code"),
            timed_out=(result or {}).get("timed_out"),
            seconds=(result or {}).get("seconds"),
            tail=(result or {}).get("tail", ""),
            ran_less=ev["ran_less"],
            stands=held_out.stands(ev),
        )
        return ev
