"""The loop's pull request: opened once verify passes, its body refreshed after each turn
(turns, cost, verify, evidence, milestones), and what that body says."""

from __future__ import annotations

from bot.core.evidence import held_out
from bot.core.record import LoopRecord, Reason, Status
from bot.core.spend import lines as spend_lines
from bot.core.text import messages
from bot.io.github import tally
from bot.io.github.pulls import PullInfo
from bot.io.logs import get_logger
from jobs.agents.agent import Outcome
from jobs.loop import evidence
from jobs.loop.runner import CHECK_NAME, RunnerBase

log = get_logger("loopbot.loop")


class PullRequests(RunnerBase):
    """Opening and refreshing the loop's pull request."""

    def _open_pull(self, base: str, outcome: Outcome, *, caught_up: bool = False) -> str:
        """Open the pull request (or update the loop's open one) for the verified head,
        its check run, and on to the critic or the gate.

        ``caught_up``: the base branch merged in cleanly and verify passed on the merged
        head, no turn run. The body's facts (the change, its evidence, its turns) are
        the same, so the body is not written again (only the spend so far moved, and the
        status comment and the receipt show it), and the status comment shows the
        catch-up when the gate's edit comes (issue 43: a fleet's catch-ups were a
        quarter of its writes)."""
        tally.enter("catch_up" if caught_up else "pull_request")
        self._pushed()
        record = self._record()
        if not self.worktrees.tree_changed(self.checkout):
            # Never an empty pull request, whatever path led here.
            return self._finish(
                Status.FAILED,
                Reason.NO_CHANGES,
                "the branch is identical to the base branch: there is nothing to propose, "
                "so no pull request was opened",
            )
        self._set(phase="opening_pr")
        pull = self._caught_up_pull(record) if caught_up else None
        if pull is None:
            issue = self.gh.issue(self.repo, self.issue_number)
            summary = outcome.text
            if record.pr_number is not None:
                summary = pull_summary(self.gh.pull(self.repo, record.pr_number), outcome.text)
            body = pull_body(record, summary, self.worktrees.diff_stat(self.checkout))
            self.lease.check()
            pull = self.gh.open_pull(
                self.repo,
                record.branch,
                base,
                record.approved_title or issue.title,
                body,
                closes=self.issue_number,
            )
        self._set(pr_number=pull.number, pr_url=pull.html_url, head_sha=pull.head_sha)
        # Opened once; a later verified turn (a review fix) updates the same pull request.
        opened = "pr_opened" if record.pr_number != pull.number else "pr_updated"
        self.store.event(self.key, opened, pr=pull.number, sha=pull.head_sha)
        title = f"verify passed on turn {record.turn}"
        if not (caught_up and self._check_left_to_critic(base, title)):
            self._check_run("completed", conclusion="success", title=title)
        if self.config.critic.enabled or self.config.merge.enabled:
            stage = Status.REVIEWING if self.config.critic.enabled else Status.MERGING
            if not self._advance(stage, quiet=caught_up):
                return f"pull request #{pull.number} opened; the loop was cancelled meanwhile"
            job = "critic" if stage is Status.REVIEWING else "merge gate"
            return f"pull request #{pull.number} opened; {job} queued"
        return self._finish(Status.COMPLETED, Reason.PR_OPENED, f"pull request #{pull.number}")

    def _check_left_to_critic(self, base: str, title: str) -> bool:
        """A clean catch-up's head: its check run is left to the critic (written by it
        only if it reviews the head again; when the approval carries, the critic's run
        says verify passed here). Not when a rule requires the loop's run by name, or
        the rules cannot be read, or no critic runs, or this job's run on the head is
        made or on its way. True when left."""
        if not self.config.critic.enabled:
            return False
        required, read = self.gh.required_checks_read(self.repo, base)
        if not read or CHECK_NAME in required:
            return False
        record = self._record()
        if self._checks is not None and not self._checks.discard(record.head_sha):
            return False
        self._set(
            loop_check_waiting={
                "sha": record.head_sha,
                "title": title,
                "summary": messages.status_line(record),
            }
        )
        return True

    def _caught_up_pull(self, record: LoopRecord) -> PullInfo | None:
        """The loop's pull request, still open on the pushed head; None when the full
        path must run (no pull request, closed, or its head is not ours yet)."""
        if record.pr_number is None:
            return None
        pull = self.gh.pull(self.repo, record.pr_number)
        head = self.worktrees.head(self.checkout.path, self.checkout.mirror)
        return pull if pull.state == "open" and pull.head_sha == head else None

    def _refresh_pull(self, outcome: Outcome) -> None:
        """The pull request stays true: after a later turn (a review fix, a checks or a
        conflict fix) its body shows the turns, cost and last verify as they are now.
        The summary on top stays what the agent wrote when it opened the pull request."""
        record = self._record()
        if record.pr_number is None:
            return
        pull = self.gh.pull(self.repo, record.pr_number)
        if pull.state != "open":
            return
        body = pull_body(
            record, pull_summary(pull, outcome.text), self.worktrees.diff_stat(self.checkout)
        )
        self.lease.check()
        self.gh.update_pull(
            self.repo, pull.number, body=body, closes=self.issue_number, current=pull
        )


TABLE_HEAD = "| turns | cost | verify |"


def pull_body(record: LoopRecord, summary: str, stat: str) -> str:
    """The pull request's body: the agent's summary, then the numbers as they are now."""
    tests = ", ".join(f"`{p}`" for p in record.tests_changed[:20]) or "none"
    if len(record.tests_changed) > 20:
        tests += f" and {len(record.tests_changed) - 20} more"
    last = record.last_verify
    verify = "passed" if last.get("passed") else evidence.describe(last)
    # The issue's turns so far: ``record.turn`` starts over after each review round.
    turns = max(record.total_turns, record.turn)
    return (
        f"{messages.safe_text(summary.strip()) or 'Changes made by loopbot.'}\n\n"
        f"{TABLE_HEAD}\n|---|---|---|\n"
        f"| {turns} | ${record.cost_usd:.2f} | `{record.verify_command}` {verify} |\n\n"
        f"{spend_lines.total(record)} so far.\n\n"
        f"Evidence: {evidence.evidence_line(record.base_verify, record.last_verify)}; "
        f"tests changed: {tests}.\n\n"
        + _held_out_lines(record)
        + _milestone_lines(record)
        + (
            messages.workflows_left_out(record.workflow_patches) + "\n\n"
            if record.workflow_patches
            else ""
        )
        + "<details><summary>diff stat</summary>\n\n"
        f"{messages.code_block(stat.strip(chr(10)).rstrip())}\n</details>\n\n"
        "<sub>Opened by loopbot. `/loop <request>` on this PR asks for another turn.</sub>"
    )


def _held_out_lines(record: LoopRecord) -> str:
    """What held-out verify said on the head (bot/core/evidence/held_out.py); "" when it
    has nothing to say (no file verify runs changed)."""
    ev = record.test_evidence
    lines = held_out.facts(ev)
    if not lines or ev.get("sha") != record.last_verify.get("sha"):
        return ""
    warn = (
        f"⚠️ **The tests were changed to pass**: {held_out.summary(ev)}. loopbot does not "
        "merge this on its own.\n\n"
        if held_out.stands(ev)
        else ""
    )
    return warn + "".join(f"- {messages.safe_text(line)}\n" for line in lines) + "\n"


def _milestone_lines(record: LoopRecord) -> str:
    """The pull request body's milestones and post-action lines ("" for neither)."""
    out = ""
    if record.sections:
        done = sum(1 for s in record.sections if s.get("done"))
        audited = sum(
            1
            for s in record.sections
            if s.get("done") and not s.get("preticked") and not s.get("unaudited")
        )
        out += (
            f"Milestones: {done} of {len(record.sections)} done, {audited} of them audited "
            "on their own (sections ticked in the issue, or worked with the critic off, are "
            "not).\n\n"
        )
    pa = record.post_action
    if pa.get("status") in ("kept", "dropped", "none"):
        said = messages.safe_text(str(pa.get("summary") or "").strip()) or "(no summary)"
        what = {
            "kept": f"committed as {str(pa.get('sha', ''))[:12]}, not reviewed again",
            "dropped": f"dropped: {messages.safe_text(str(pa.get('why', '')))}",
            "none": "no change",
        }[str(pa["status"])]
        out += f"Post-action ({what}): {said}\n\n"
    return out


def pull_summary(pull: PullInfo, fallback: str) -> str:
    """The summary on top of the body loopbot wrote for ``pull`` (``pull_body``), to keep
    it when the numbers below are refreshed; ``fallback`` when the body is not that."""
    text = (pull.body or "").partition("\n\n")[2]  # after loopbot's own "Closes #N"
    summary, found, _ = text.rpartition("\n\n" + TABLE_HEAD)
    return summary.strip() if found and summary.strip() else fallback
