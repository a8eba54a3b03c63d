"""A loop's identity: one per repository and issue, and every name derived from it.

Every Redis key, RQ job id and branch name for a loop is built here, so two spellings of
the same loop cannot drift apart. ``LoopId`` converts to its key with ``str()``, which
is what the store is keyed by.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
BRANCH_RE = re.compile(r"^loop/issue-(\d+)$")


@dataclass(frozen=True, order=True)
class LoopId:
    repo: str  # owner/name
    issue: int

    def __post_init__(self) -> None:
        if not _REPO.match(self.repo):
            raise ValueError(f"not an owner/name repository: {self.repo[:100]!r}")
        if isinstance(self.issue, bool) or not isinstance(self.issue, int) or self.issue < 1:
            raise ValueError(f"not an issue number: {self.issue!r}")

    @property
    def key(self) -> str:
        """The store's key, and how people write it: ``owner/name#12``."""
        return f"{self.repo}#{self.issue}"

    def __str__(self) -> str:
        return self.key

    @property
    def job_id(self) -> str:
        """The RQ job id of this loop's coding job.

        RQ allows only ``[A-Za-z0-9_-]``; a hash keeps ``a-b/c`` and ``a/b-c`` apart while
        the readable prefix keeps ``rq info`` legible.
        """
        slug = re.sub(r"[^A-Za-z0-9_-]", "_", self.repo.replace("/", "--"))[:60]
        digest = hashlib.sha1(self.key.encode()).hexdigest()[:8]
        return f"loop-{slug}-{self.issue}-{digest}"

    @property
    def branch(self) -> str:
        """The branch the loop pushes: one per issue."""
        return branch_for(self.issue)

    @classmethod
    def parse(cls, text: str) -> LoopId:
        """``owner/name#12`` back to a ``LoopId``; ``ValueError`` says what is wrong."""
        repo, sep, number = text.strip().partition("#")
        if not sep or not number.isdigit():
            raise ValueError(f"expected OWNER/REPO#N, got {text[:100]!r}")
        return cls(repo, int(number))

    @classmethod
    def from_branch(cls, repo: str, branch: str) -> LoopId | None:
        """The loop that owns ``branch`` in ``repo``, or None for any other branch."""
        m = BRANCH_RE.match(branch)
        return cls(repo, int(m.group(1))) if m else None


def branch_for(issue: int) -> str:
    return f"loop/issue-{issue}"


def issue_from_branch(branch: str) -> int | None:
    """The issue a loop branch belongs to, or None for any other branch."""
    m = BRANCH_RE.match(branch)
    return int(m.group(1)) if m else None
