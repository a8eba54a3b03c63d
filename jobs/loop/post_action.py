"""The post-action: one more turn after the final clean review, when loop.yml has a
``post_action``, bounded to ``POST_ACTION_MAX_LINES`` changed lines and verified."""

from __future__ import annotations

from typing import Any

from bot.core.evidence import held_out
from bot.core.record import Reason, Status
from bot.core.rules.loop import budget
from bot.core.rules.pull.merge import protected_changes
from bot.core.text import prompts
from bot.core.text.defuse import one_line
from bot.io.logs import get_logger
from jobs.agents.agent import MAX_TOKENS, Limits, TurnAgent
from jobs.loop.runner import LEASE_LOST, RunnerBase, _count_turn

log = get_logger("loopbot.loop")


POST_ACTION_MAX_LINES = 300  # a post-action is never reviewed: a small change or none


class PostAction(RunnerBase):
    """The post-action turn (loop.yml ``post_action``) and what follows it."""

    def _post_action_feedback(self, *, deferred: bool) -> None:
        """A maintainer's request on the pull request waits: coding turns follow (they
        read it), then a review of the new head, instead of the gate."""
        self.store.event(self.key, "post_action_feedback", deferred=deferred)
        self._set(
            turn=0,  # a person asked for another go, as a restart does
            resume_note="A maintainer asked for changes on the pull request after its review.",
            **({"post_action": {}} if deferred else {}),
        )

    def _post_action(self, agent: TurnAgent, base: str) -> str:
        """``post_action.prompt``: one best-effort turn after a clean final audit, on the
        approved head. Committed as ``loop(post-action): …`` and pushed only when verify
        passes on it and it touches no protected path and stays small; otherwise dropped
        (the unpushed commit reset away) and the gate gets the approved head as it was.
        Its summary is kept either way. Never audited again: the gate accepts exactly this
        one commit on top of the reviewed sha (``bot.core.rules.pull.merge.post_action_head``)."""
        record = self._record()
        pa = dict(record.post_action)
        reviewed = str(pa.get("base") or "")
        head = self.worktrees.head(self.checkout.path, self.checkout.mirror)
        instruction = self.config.post_action.prompt if self.config.post_action else ""

        def settle(status: str, **more: Any) -> None:
            now = {**pa, "status": status, **more}
            self._set(post_action=now)
            self.store.event(
                self.key,
                "post_action",
                status=status,
                base=reviewed,
                sha=now.get("sha", ""),
                why=now.get("why", ""),
            )

        if not instruction:
            settle("none", why="loop.yml has no post_action any more")
            return self._after_post_action()
        if head != reviewed or not self.worktrees.is_clean(self.checkout):
            settle("failed", why="the branch is not at the approved head")
            return self._after_post_action()
        if self._cancelled():
            return self._finish(Status.CANCELLED, Reason.CANCELLED)
        spent = budget.Spent.of(record)
        smallest = budget.smallest_call(agent.model, MAX_TOKENS)
        if out := budget.before_turn(self.budget, spent, smallest):
            settle("failed", why=out.detail)  # best effort: the reviewed change stands
            return self._after_post_action()
        self._set(phase="post_action")
        self.store.update(self.key, _count_turn)
        self.store.event(self.key, "post_action_started", base=reviewed)
        self._status_comment()
        conversation = self.store.conversation(self.key)
        limits = Limits(
            step_cap=self.config.step_cap,
            tool_budget=self.config.tool_budget,
            budget=self.budget,
            spent=spent,
            stall_timeout=self.rt.settings.stall_timeout,
        )
        ignored_before = self.worktrees.ignored_files(self.checkout)
        outcome = agent.run_turn(conversation, prompts.post_action(instruction), limits)
        if self.lease.lost.is_set():
            return LEASE_LOST
        self.store.save_conversation(self.key, conversation)
        self._record_usage(outcome)
        if outcome.end in ("cancelled", "shutdown"):
            self.worktrees.drop_to(self.checkout, reviewed)
            self.sandbox.adopt()
            if outcome.end == "shutdown":  # still pending: the next worker runs it again
                return self._handoff("")
            return self._finish(Status.CANCELLED, Reason.CANCELLED)
        summary = self.gh.redact(outcome.text.strip())[:1000]
        why = "" if outcome.end in ("finished", "text_only") else f"the turn ended: {outcome.end}"
        sha: str | None = None
        if not why:
            self.worktrees.purge_ignored(self.checkout, ignored_before)
            first = one_line(self.gh.redact((summary.splitlines() or ["post-action"])[0])[:60])
            sha = self.worktrees.commit_all(self.checkout, f"loop(post-action): {first}")
        if sha is not None and not why:
            why = self._post_action_problem(reviewed, sha)
        verify: Any = None
        if sha is not None and not why:
            verify = self._harness(self.config.verify)
            if (problem := self.sandbox.worktree_problem()) is not None:
                why = f"verify: {problem}"
            elif not verify.passed:
                why = f"`{self.config.verify}` failed with it (exit {verify.exit_code})"
        if why:
            self.worktrees.drop_to(self.checkout, reviewed)
            self.sandbox.adopt()
            settle("dropped", why=why, summary=summary, sha="")
        elif sha is None:
            settle("none", summary=summary, why="it changed nothing")
        else:
            self.lease.check()
            self.worktrees.push(self.checkout, self.gh.token())
            self._set(
                head_sha=sha,
                last_verify={
                    "turn": record.turn,
                    "total": record.total_turns,
                    "passed": True,
                    "exit_code": verify.exit_code,
                    "seconds": round(verify.seconds, 3),
                    "timed_out": verify.timed_out,
                    "sha": sha,
                },
            )
            settle("kept", sha=sha, summary=summary)
            self._check_run(
                "completed", conclusion="success", title="post-action verified", new_head=True
            )
        self._refresh_pull(outcome)
        if self.store.feedback_waiting(self.key):  # asked while the post-action ran
            self._post_action_feedback(deferred=False)
            return self._turns(agent, base)
        return self._after_post_action()

    def _post_action_problem(self, reviewed: str, sha: str) -> str:
        """Why the post-action commit may not stand, or "": it is never reviewed, so it
        may not touch a protected path or grow past a small change."""
        touched = self.worktrees.numstat_between(self.checkout, reviewed, sha)
        hit = protected_changes([p for p, _ in touched], self.config.merge.protected_paths)
        if hit:
            return "it changed protected paths: " + ", ".join(hit[:5])
        # Nor may it change what verify runs: the tests were judged on the reviewed head
        # (bot/core/evidence/held_out.py), and a test rewritten now would be judged by no one.
        if tests := held_out.held_out_paths([p for p, _ in touched], self.config.verify):
            return "it changed files verify runs: " + ", ".join(tests[:5])
        # A binary file has no line count to bound it, and nobody could read it anyway.
        if binary := [p for p, n in touched if n is None]:
            return "it changed binary files: " + ", ".join(binary[:5])
        lines = sum(n or 0 for _, n in touched)
        if lines > POST_ACTION_MAX_LINES:
            return f"it changed {lines} lines (a post-action may change {POST_ACTION_MAX_LINES})"
        return ""

    def _after_post_action(self) -> str:
        if not self.config.merge.enabled:
            return self._finish(
                Status.COMPLETED,
                Reason.PR_OPENED,
                "reviewed; merging is disabled for this repository",
            )
        if not self._advance(Status.MERGING):
            return "post-action done; the loop was cancelled meanwhile"
        return "post-action done; merge gate queued"
