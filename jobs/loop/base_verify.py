"""Verify on the base before the first turn (the evidence the critic and the gate read:
what failed before the change), and merging the base branch in when the loop must."""

from __future__ import annotations

from bot.io.logs import get_logger
from jobs.loop import evidence
from jobs.loop.runner import RunnerBase
from jobs.tree.worktree import Checkout

log = get_logger("loopbot.loop")


class BaseVerify(RunnerBase):
    """Base verify (evidence) and merging the default branch in."""

    def _base_verify(self, checkout: Checkout) -> None:
        """Run verify on the base commit before the agent's first change (or take the
        cached result for this base), so every later stage knows what it said then.

        A slow or timed-out verify is evidence ("failed (timed out)"), never a failure
        of the loop. Only a checkout still at the base, with nothing of the agent's in
        it, can give that evidence.
        """
        head = self.worktrees.head(checkout.path, checkout.mirror)
        if head != checkout.base_sha or (
            checkout.resumed and not self.worktrees.is_clean(checkout)
        ):
            self.store.event(self.key, "base_verify_skipped", sha=checkout.base_sha, head=head)
            return
        self._set(phase="verifying_base")
        cache = evidence.BaseVerifyCache(self.rt.redis)
        key = evidence.cache_key(
            self.repo,
            head,
            self.config.verify,
            self.config.setup,
            [self.config.sandbox.network, self.config.sandbox.timeout_seconds],
        )
        found = cache.get(key)
        if found is not None:
            result = {**found, "sha": head, "cached": True}
        else:
            clean = self.worktrees.is_clean(checkout)
            result = evidence.outcome(self._harness(self.config.verify), head)
            if clean and not self.worktrees.is_clean(checkout):
                # What verify wrote (reports, snapshots) is not the agent's change.
                self.worktrees.restore_committed(checkout)
                self.sandbox.adopt()
            if evidence.cacheable(result):
                self.lease.check()
                cache.put(key, result)
        self._set(base_sha=head, base_verify=result)
        self.store.event(
            self.key, "base_verify", **{k: v for k, v in result.items() if k != "tail"}
        )

    def _sync_base(self, base: str, token: str) -> None:
        """Merge the default branch in, as the gate asked after a conflict."""
        merged_into = self.worktrees.head(self.checkout.path, self.checkout.mirror)
        conflicted = self.worktrees.merge_base_in(self.checkout, base)
        self.sandbox.adopt()  # the merge wrote files as the worker
        if conflicted:
            note = (
                f"The pull request conflicts with `{base}`. The harness merged `{base}` into "
                "your branch; these files have conflict markers: "
                + ", ".join(f"`{p}`" for p in conflicted)
                + f". Resolve them, keeping what both sides meant, so `{self.config.verify}` "
                "passes; the merge is committed with your changes."
            )
        else:
            # Git merged it alone: push now, since the turn may change nothing more. A
            # merge that brings a workflow change is pushed as one commit on the base.
            lease = self._linearized()
            self.lease.check()
            self.worktrees.push(self.checkout, token, lease=lease)
            note = (
                f"The pull request was behind `{base}`; the harness merged `{base}` into "
                f"your branch without conflicts. Check that `{self.config.verify}` still "
                "passes, and fix what the merge broke."
            )
        self._set(
            sync_base=False,
            resume_note=note,
            base_clean=not conflicted,
            catch_up={"from": merged_into} if not conflicted else {},
        )
        self.store.event(self.key, "base_merged", base=base, conflicts=conflicted)
