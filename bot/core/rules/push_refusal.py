"""What GitHub said when it refused a push, read from ``git push --porcelain``: which
rule refused it, and what the agent and the maintainer are told. Pure: no I/O.

GitHub refuses through git's own protocol: a ref status ``!`` with ``[remote rejected]
(reason)`` on standard output, and its explanation as ``remote:`` lines on standard
error. The texts (GitHub's documentation and its users' reports):

- workflows: ``refusing to allow a GitHub App to create or update workflow `PATH`
  without `workflows` permission`` (the reason alone, no remote lines);
- push protection: ``GH013: Repository rule violations found for REF`` ... ``Push
  cannot contain secrets`` ... ``—— TYPE ——`` ``locations:`` ``- commit: SHA``
  ``path: FILE:LINE``, reason ``push declined due to repository rule violations``;
- large files: ``File PATH is 120.00 MB; this exceeds GitHub's file size limit of
  100.00 MB`` and ``GH001: Large files detected``, reason ``pre-receive hook declined``;
- a ruleset restricting creation: ``GH013`` ... ``Cannot create ref due to creations
  being restricted``;
- a deletion a rule forbids: ``GH013`` ... ``Cannot delete this branch`` (a ruleset's
  "Restrict deletions"), or ``GH006: Protected branch update failed`` ... ``Cannot delete
  this protected branch``, reason ``protected branch hook declined`` (classic protection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from bot.core.text.defuse import code_block, code_span, safe_text

WORKFLOWS_DIR = ".github/workflows/"
MAX_WORDS = 3000  # of GitHub's text kept for the issue


class Kind(StrEnum):
    WORKFLOWS = "workflows"
    SECRET = "secret"
    LARGE_FILE = "large_file"
    CREATION_RESTRICTED = "creation_restricted"
    OTHER = "other"


# The agent can take the refused content out; the harness rewrites the unpushed commits.
FIXABLE = frozenset({Kind.SECRET, Kind.LARGE_FILE})
MAX_SAME = 2  # refusals of one fixable kind before the loop stops


@dataclass(frozen=True)
class Secret:
    type: str
    commit: str
    path: str
    line: int


@dataclass(frozen=True)
class LargeFile:
    path: str
    size: str  # as GitHub printed it ("120.00 MB")


@dataclass(frozen=True)
class Refusal:
    kind: Kind
    ref: str
    reason: str  # the ref status's reason, as GitHub gave it
    remote: str  # GitHub's ``remote:`` lines, the prefix taken off
    workflow: str = ""
    secrets: tuple[Secret, ...] = ()
    files: tuple[LargeFile, ...] = ()

    @property
    def fixable(self) -> bool:
        return self.kind in FIXABLE

    def words(self) -> str:
        """GitHub's own words (reason and remote lines), bounded: shown in a code block."""
        text = f"{self.reason}\n{self.remote}".strip()
        return text if len(text) <= MAX_WORDS else text[: MAX_WORDS - 1] + "…"


@dataclass(frozen=True)
class RefStatus:
    flag: str  # " " fast-forward, "+" forced, "-" deleted, "*" new, "!" refused, "=" up to date
    ref: str
    summary: str
    reason: str


_STATUS = re.compile(
    r"^(?P<flag>[ +\-*!=])\t(?P<spec>[^\t]*)\t(?P<summary>.*?)(?: \((?P<reason>.*)\))?$"
)
_SECRET_HEAD = re.compile(r"^\s*—— (?P<type>.+?) —+\s*$")
_SECRET_COMMIT = re.compile(r"^\s*- commit: (?P<sha>[0-9a-f]{7,64})\s*$")
_SECRET_PATH = re.compile(r"^\s*path: (?P<path>.+?):(?P<line>\d+)\s*$")
_LARGE = re.compile(
    r"File (?P<path>.+) is (?P<size>[0-9.]+ [KMG]B); this exceeds GitHub's file size limit"
)
# Quoted with backticks on github.com; reports retyped by hand drop or change them.
_WORKFLOW = re.compile(
    r"create or update workflow [`']?(?P<path>[^`'\s]*)[`']? without [`']?workflows[`']? "
    r"permission"
)


def ref_statuses(porcelain: str) -> list[RefStatus]:
    """The ref status lines of ``git push --porcelain``'s standard output."""
    found = []
    for line in porcelain.splitlines():
        m = _STATUS.match(line)
        if m is None:
            continue
        _, _, dst = m.group("spec").rpartition(":")
        found.append(RefStatus(m.group("flag"), dst, m.group("summary"), m.group("reason") or ""))
    return found


def remote_lines(stderr: str) -> str:
    """What the server said (its ``remote:`` lines), the prefix taken off."""
    lines = [
        line[len("remote:") :].removeprefix(" ").rstrip()
        for line in stderr.splitlines()
        if line.startswith("remote:")
    ]
    return "\n".join(lines).strip("\n")


def classify(status: RefStatus, remote: str) -> Refusal:
    """Which rule refused the ref update ``status`` (a ``!`` line), from its reason and
    GitHub's remote lines."""
    reason = status.reason
    base = {"ref": status.ref, "reason": reason, "remote": remote}
    if m := _WORKFLOW.search(reason):
        return Refusal(Kind.WORKFLOWS, workflow=m.group("path"), **base)  # type: ignore[arg-type]
    if "GH001" in remote or _LARGE.search(remote):
        files = tuple(LargeFile(m.group("path"), m.group("size")) for m in _LARGE.finditer(remote))
        return Refusal(Kind.LARGE_FILE, files=files, **base)  # type: ignore[arg-type]
    if "Push cannot contain secrets" in remote or "GITHUB PUSH PROTECTION" in remote:
        return Refusal(Kind.SECRET, secrets=_secrets(remote), **base)  # type: ignore[arg-type]
    if "creations being restricted" in remote:
        return Refusal(Kind.CREATION_RESTRICTED, **base)  # type: ignore[arg-type]
    return Refusal(Kind.OTHER, **base)  # type: ignore[arg-type]


def _secrets(remote: str) -> tuple[Secret, ...]:
    found: list[Secret] = []
    kind, commit = "", ""
    for line in remote.splitlines():
        if m := _SECRET_HEAD.match(line):
            kind, commit = m.group("type"), ""
        elif m := _SECRET_COMMIT.match(line):
            commit = m.group("sha")
        elif (m := _SECRET_PATH.match(line)) and kind:
            found.append(Secret(kind, commit, m.group("path"), int(m.group("line"))))
    return tuple(found)


def agent_note(refusal: Refusal) -> str:
    """The next turn's prompt: what GitHub refused and what the agent must do."""
    if refusal.kind == Kind.SECRET:
        where = "; ".join(f"{s.type} in `{s.path}` line {s.line}" for s in refusal.secrets)
        return (
            "GitHub refused to take your last changes: its push protection found a secret "
            f"({where or 'see below'}). Nothing of them was pushed. Remove the secret from "
            "the files (read it from the environment or a config file the repository "
            "ignores, or use an obviously fake placeholder in tests); the harness then "
            "commits your changes as one commit without it. Never try to get around the "
            "check.\n\nGitHub said:\n" + code_block(refusal.words())
        )
    if refusal.kind == Kind.LARGE_FILE:
        files = "; ".join(f"`{f.path}` ({f.size})" for f in refusal.files)
        return (
            f"GitHub refused to take your last changes: a file is over its 100 MB limit "
            f"({files or 'see below'}). Nothing of them was pushed. Remove the file or make "
            "it much smaller (generate it in the tests instead of committing it); the "
            "harness then commits your changes as one commit without it.\n\nGitHub said:\n"
            + code_block(refusal.words())
        )
    return ""


_WHAT_TO_DO = {
    Kind.CREATION_RESTRICTED: (
        "A ruleset restricts who may create branches matching `{ref}`. Narrow the "
        "ruleset's pattern so it does not cover loopbot's `loop/*` branches, then "
        "`/loop-restart`."
    ),
    Kind.WORKFLOWS: (
        "The App may not push changes under `.github/workflows/` (it does not have the "
        "`workflows` permission). loopbot keeps such changes out of its commits; this push "
        "still held one. Apply the change yourself, then `/loop-restart`."
    ),
    Kind.SECRET: (
        "The agent could not take the secret out of its changes. Look at the branch's "
        "last pushed state, then `/loop-restart` with guidance, or take the work over."
    ),
    Kind.LARGE_FILE: (
        "The agent could not take the large file out of its changes. `/loop-restart` with "
        "guidance (generate the file in the tests, or use Git LFS), or take the work over."
    ),
    Kind.OTHER: (
        "A rule of the repository refused the push. Read GitHub's words above, change the "
        "rule or give the App a bypass where that is right, then `/loop-restart`."
    ),
}


def maintainer_detail(refusal: Refusal, *, repeated: bool = False) -> str:
    """The loop's detail when a refusal stops it: which rule, GitHub's words (defused,
    literal), and what the maintainer can do. loopbot never uses a bypass itself."""
    what = {
        Kind.WORKFLOWS: "the App may not change workflows",
        Kind.SECRET: "push protection found a secret",
        Kind.LARGE_FILE: "a file is over 100 MB",
        Kind.CREATION_RESTRICTED: "a ruleset restricts creating the loop's branch",
        Kind.OTHER: "a repository rule",
    }[refusal.kind]
    again = f" ({MAX_SAME} times)" if repeated else ""
    todo = _WHAT_TO_DO[refusal.kind].replace("{ref}", refusal.ref)
    return (
        f"GitHub refused the push of {code_span(refusal.ref)}{again}: {what}. GitHub said:\n\n"
        + code_block(safe_text(refusal.words()))
        + f"\n\n{todo}"
    )


# Rules on the loop's branch that refuse every push loopbot can make: its commits are
# made by git in the worktree, unsigned, and the branch is new. Found before any work
# (``GET rules/branches/{branch}`` lists them whether or not the App could bypass them,
# and loopbot never relies on a bypass), the loop stops instead of spending a turn.
_BRANCH_STOPS = {
    "creation": (
        "a ruleset restricts creating branches matching `{branch}`",
        "Narrow the ruleset's pattern so it does not cover loopbot's `loop/*` branches, "
        "then `/loop-restart`.",
    ),
    "required_signatures": (
        "a ruleset requires signed commits on `{branch}`",
        "loopbot's commits are not signed (it commits with git in its worktree, not "
        "through GitHub's API). Exclude `loop/*` from the ruleset's signed-commit rule "
        "(the squash merge GitHub makes on the default branch is signed by GitHub), then "
        "`/loop-restart`.",
    ),
}


def branch_rules_stop(rules: list[dict[str, object]], branch: str, *, new: bool) -> str | None:
    """The loop's detail when a rule on its (``new``: not yet pushed) branch would refuse
    its first push; None when none would. ``creation`` matters only to a new branch."""
    for rule in rules:
        kind = str(rule.get("type") or "")
        if kind not in _BRANCH_STOPS or (kind == "creation" and not new):
            continue
        what, todo = _BRANCH_STOPS[kind]
        source = str(rule.get("ruleset_source") or "")
        where = f" (ruleset {rule.get('ruleset_id')} of {code_span(source)})" if source else ""
        return (
            f"Stopped before any work: {what.replace('{branch}', branch)}{where}, so GitHub "
            f"would refuse loopbot's push of {code_span(branch)}.\n\n{todo}"
        )
    return None


class Deletion(StrEnum):
    """What became of ``git push --force-with-lease=REF:HEAD URL :REF``."""

    DELETED = "deleted"
    NOT_AT_HEAD = "not_at_head"  # the lease failed: the branch moved, or is gone
    REFUSED = "refused"  # a rule (or the server) refused it: GitHub's words say which


def deletion(porcelain: str, stderr: str, ref: str) -> tuple[Deletion, str] | None:
    """The outcome of a deletion push of ``ref`` and GitHub's words for it; None when
    the push said nothing of ``ref`` (it failed before: the network, the credentials)."""
    statuses = [s for s in ref_statuses(porcelain) if s.ref == ref]
    if not statuses:
        return None
    status = statuses[0]
    if status.flag == "-":
        return Deletion.DELETED, ""
    if status.flag == "!" and status.reason == "stale info":
        return Deletion.NOT_AT_HEAD, ""
    words = f"{status.summary} ({status.reason})\n{remote_lines(stderr)}".strip()
    return Deletion.REFUSED, words[:MAX_WORDS]
