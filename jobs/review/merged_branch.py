"""The merged loop branch leaves GitHub: by ``git push``, leased on the head that merged
(jobs/tree/remote_branch.py says why not by REST), once per loop.

- Deleted, or gone already (GitHub, a person): nothing more.
- Not at the merged head (a person pushed after the merge, a new loop of the issue
  pushed the same branch name): kept, with their commits.
- A rule forbids it (a ruleset's "Restrict deletions", classic protection): kept, with
  GitHub's words; loopbot tries no other way round the rule.
- git cannot reach GitHub: the REST ``DELETE``, but only after a read shows the branch
  still at the merged head (REST has no lease; the read narrows the window to the
  read and the delete, a second).

What became of it is recorded (``LoopRecord.branch_tidied``), so the gate's retry of
a failed tidy-up does not do it again nor say it twice: a kept branch is one
``branch_kept`` event, one line of the status comment's timeline.
"""

from __future__ import annotations

from pathlib import Path

from bot.core.record import LoopRecord
from bot.core.rules.push_refusal import Deletion
from bot.io.github.client import Installation
from bot.io.github.failures import NotFound
from bot.io.logs import get_logger
from bot.io.store import Store
from jobs.tree import remote_branch
from jobs.tree.git import GitError

log = get_logger("loopbot.gate")


def tidy(store: Store, gh: Installation, record: LoopRecord, branch: str, mirror: Path) -> None:
    """Delete ``branch`` of ``record``'s merged loop, or say why it stays. ``mirror``: the
    repository's mirror on this machine, if it has one."""
    if record.branch_tidied:
        return  # done by an earlier run of the gate, whose later steps failed
    info = gh.repo(record.repo)
    if not info.delete_branch_on_merge:  # else GitHub deletes it (or a rule keeps it)
        _delete(store, gh, record, branch, mirror, info.clone_url)
    store.set_fields(record.key, branch_tidied=True)


def _delete(
    store: Store, gh: Installation, record: LoopRecord, branch: str, mirror: Path, url: str
) -> None:
    head = record.merged_head
    try:
        done = remote_branch.delete(mirror, url, gh.token(), branch, head)
    except GitError as exc:
        log.warning("gate.branch_push_failed", loop=record.key, error=str(exc)[:300])
        outcome = _by_rest(gh, record, branch)
    else:
        outcome = _outcome(done, head)
    if outcome is not None:
        cause, why = outcome
        store.event(record.key, "branch_kept", branch=branch, cause=cause, why=why[:500])
        log.info("gate.branch_kept", loop=record.key, branch=branch, why=why[:300])


def _outcome(done: remote_branch.Deleted, head: str) -> tuple[str, str] | None:
    """(cause, why) the branch stays; None when it is gone. Pure."""
    if done.outcome is Deletion.DELETED or done.gone is True:
        return None
    if done.outcome is Deletion.NOT_AT_HEAD:
        return "moved", f"it is no longer at the merged head {head[:12]}"
    return "refused", f"GitHub refused its deletion: {done.words}"


def _by_rest(gh: Installation, record: LoopRecord, branch: str) -> tuple[str, str] | None:
    """The REST ``DELETE`` when git is out of reach, after a read shows the branch where
    it merged (REST's DELETE takes a branch whatever its head)."""
    try:
        now = gh.branch_head(record.repo, branch)
    except NotFound:
        return None  # gone already
    if record.merged_head and now != record.merged_head:
        return "moved", f"it is no longer at the merged head {record.merged_head[:12]}"
    refused = gh.delete_branch(record.repo, branch)
    return ("refused", f"GitHub refused its deletion: {refused}") if refused else None
