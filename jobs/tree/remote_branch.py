"""A merged loop branch leaves GitHub by ``git push``, the way it came.

Why not ``DELETE /repos/{repo}/git/refs/heads/{branch}``:

- that is a REST write, and an installation's REST writes go one at a time, a second
  apart (the shared pace, GitHub's secondary limits): at fleet scale each one is a
  second for every loop behind it (issue 43). A push is git's protocol, outside the
  REST API's pace, like every push the loop made to this branch; GitHub's documented
  content-creation limits name the web interface, the REST API and GraphQL;
- it is leased on the head that merged (``--force-with-lease=REF:HEAD``): a commit a
  person pushed to the branch after the merge is never deleted with it. A REST DELETE
  takes the branch whatever its head.

A rule that forbids the deletion (a ruleset's "Restrict deletions", a protected branch)
refuses the push as it would the DELETE: the branch stays, and GitHub's words are kept.
When git cannot reach GitHub at all, the caller falls back to the REST DELETE.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from bot.core.rules import push_refusal
from bot.core.rules.push_refusal import Deletion
from jobs.tree.git import GitError, git


@dataclass(frozen=True)
class Deleted:
    outcome: Deletion
    # NOT_AT_HEAD only: GitHub has no such branch (deleted already); None when git could
    # not tell (the branch is then kept: it is not known to be at the merged head).
    gone: bool | None = False
    words: str = ""  # REFUSED: what GitHub said


def delete(mirror: Path, url: str, token: str, branch: str, head: str) -> Deleted:
    """Delete ``branch`` at ``url`` if it is still at ``head`` ("": whatever its head,
    for a record from before the head was kept). Runs in the repository's mirror when
    this machine has one, else in an empty repository made for it (a deletion sends no
    object). Raises ``GitError`` when git got no answer for the ref: then, and only
    then, nothing was decided on GitHub's side."""
    if (mirror / "HEAD").exists():
        return _delete(mirror, url, token, branch, head)
    with tempfile.TemporaryDirectory(prefix="loopbot-delete-") as tmp:
        git(Path(tmp), "init", "--bare", "-q")
        return _delete(Path(tmp), url, token, branch, head)


def _delete(cwd: Path, url: str, token: str, branch: str, head: str) -> Deleted:
    ref = f"refs/heads/{branch}"
    # A URL, not the remote: git writes no remote-tracking ref, so the mirror's lock
    # (which other loops' commits need) is not taken; the next fetch prunes it.
    lease = [f"--force-with-lease={ref}:{head}"] if head else []
    err: list[str] = []
    out = git(
        cwd,
        "push",
        "--porcelain",
        "--no-progress",
        *lease,
        url.strip(),
        f":{ref}",
        token=token,
        check=False,
        stderr=err,
    )
    said = push_refusal.deletion(out, err[0] if err else "", ref)
    if said is None:
        raise GitError(f"git push (delete {ref}) failed: {(err[0] if err else '').strip()[-2000:]}")
    outcome, words = said
    if outcome is Deletion.NOT_AT_HEAD:
        return Deleted(outcome, gone=_gone(cwd, url, token, ref))
    return Deleted(outcome, words=words)


def _gone(cwd: Path, url: str, token: str, ref: str) -> bool | None:
    """Whether GitHub has no ``ref``; None when git could not ask. ``ls-remote`` matches
    patterns by their tail (``x/refs/heads/b`` too): only the exact name counts."""
    err: list[str] = []
    out = git(cwd, "ls-remote", url.strip(), ref, token=token, check=False, stderr=err)
    if err and "fatal" in err[0].lower():
        return None
    return not any(line.split("\t", 1)[-1] == ref for line in out.splitlines())
