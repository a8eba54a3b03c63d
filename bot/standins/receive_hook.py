"""The local GitHub's receive-pack rules: what github.com refuses to take from a push.

Run by ``git receive-pack`` as the bare repository's ``proc-receive`` hook (git 2.29+), so
refusals reach the client through git's own protocol exactly as GitHub sends them: an
``ng <ref> <reason>`` ref status (``! [remote rejected] a -> b (reason)``, porcelain
``!``) and the hook's stderr as ``remote:`` lines. A ref it accepts falls through to
receive-pack, which updates it as usual. Standard library only: it starts on every push.

The rules, as GitHub documents them and its users report the texts:

- a GitHub App without the ``workflows`` permission may not push a commit that creates,
  updates or deletes anything under ``.github/workflows/``. Every new commit is judged
  against each of its parents: a merge commit that brings a workflow change from the
  default branch is refused too (the stricter reading);
- large files: any blob over 100 MiB in a new commit (``GH001``, ``pre-receive hook
  declined``), always on, as on github.com;
- push protection (when the repository turns it on): a supported secret on a line a new
  commit adds (``GH013``, ``Push cannot contain secrets``, type, commit, path:line);
- a ruleset restricting creation of matching refs (``GH013``, ``Cannot create ref due to
  creations being restricted``), or their deletion (``GH013``, ``Cannot delete this
  branch``);
- deleting a branch classic protection covers (``GH006: Protected branch update failed``,
  ``Cannot delete this protected branch``, reason ``protected branch hook declined``), or
  the default branch (``refusing to delete the current branch: REF``).

What the stand-in decided for this push is in ``standin-push.json`` (written by
git_http.py before each receive-pack); each refusal is appended to
``standin-refused.jsonl`` so tests can count refused pushes per cause.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

ZERO = "0" * 40
LIMIT = 100 * 1024 * 1024  # "100.00 MB" as GitHub prints it
WORKFLOWS = ".github/workflows/"
RULES_FILE = "standin-push.json"
REFUSED_FILE = "standin-refused.jsonl"
SECRETS = (  # (GitHub's name for the type, pattern)
    ("GitHub Personal Access Token", re.compile(r"\bghp_[A-Za-z0-9]{36}\b")),
    ("Amazon AWS Access Key ID", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
)
RULE_DECLINED = "push declined due to repository rule violations"


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], capture_output=True, check=True)
    return out.stdout.decode(errors="replace")


def _read_pkt(stream) -> bytes | None:  # type: ignore[no-untyped-def]
    head = stream.read(4)
    if len(head) < 4:
        raise EOFError("proc-receive: connection closed")
    size = int(head, 16)
    if size == 0:
        return None
    return bytes(stream.read(size - 4))


def _write_pkt(stream, text: str) -> None:  # type: ignore[no-untyped-def]
    data = text.encode() + b"\n"
    stream.write(b"%04x" % (len(data) + 4) + data)


def _flush(stream) -> None:  # type: ignore[no-untyped-def]
    stream.write(b"0000")
    stream.flush()


def new_commits(new: str) -> list[str]:
    """Commits the push brings that no ref of the repository has yet, oldest first."""
    out = _git("rev-list", "--reverse", "--topo-order", new, "--not", "--all")
    return out.split()


def _parents(commit: str) -> list[str]:
    return _git("rev-list", "--parents", "-n", "1", commit).split()[1:]


def _each_parent(commit: str) -> list[str | None]:
    """Each parent to judge ``commit`` against; None for a root commit."""
    return [*_parents(commit)] or [None]


def _changes(commit: str, parent: str | None) -> list[tuple[str, str, str]]:
    """(new blob, status, path) of each path ``commit`` changes against ``parent``."""
    args = ["diff-tree", "-r", "-z", "--no-renames", "--no-commit-id"]
    args += [parent, commit] if parent else ["--root", commit]
    fields = _git(*args).split("\0")
    found = []
    i = 0
    while i + 1 < len(fields):
        meta = fields[i].split()
        if len(meta) >= 5:
            found.append((meta[3], meta[4], fields[i + 1]))
        i += 2
    return found


def workflow_change(commits: list[str]) -> str | None:
    for commit in commits:
        for parent in _each_parent(commit):
            for _, _, path in _changes(commit, parent):
                if path.startswith(WORKFLOWS):
                    return path
    return None


def large_files(commits: list[str]) -> list[tuple[str, int]]:
    found: dict[str, int] = {}
    for commit in commits:
        for parent in _each_parent(commit):
            for blob, status, path in _changes(commit, parent):
                if status == "D" or blob == ZERO:
                    continue
                size = int(_git("cat-file", "-s", blob).strip() or 0)
                if size > LIMIT:
                    found[path] = size
    return sorted(found.items())


def secrets(commits: list[str]) -> list[tuple[str, str, str, int]]:
    """(type, commit, path, line) of each secret a new commit adds, first five."""
    found: list[tuple[str, str, str, int]] = []
    for commit in commits:
        parents = _parents(commit)
        args = ["diff-tree", "-p", "-U0", "--no-renames", "--no-commit-id", "--no-ext-diff"]
        args += [parents[0], commit] if parents else ["--root", commit]
        path, line = "", 0
        for text in _git(*args).splitlines():
            if text.startswith("+++ "):
                path = text[6:] if text.startswith("+++ b/") else ""
            elif text.startswith("@@"):
                m = re.search(r"\+(\d+)", text)
                line = int(m.group(1)) if m else 0
            elif text.startswith("+") and path:
                for kind, pattern in SECRETS:
                    if pattern.search(text):
                        found.append((kind, commit, path, line))
                line += 1
    return found[:5]


def judge(rules: dict, ref: str, old: str, new: str) -> tuple[str, str, list[str]] | None:  # type: ignore[type-arg]
    """(cause, ref status reason, remote lines) for a refused update, else None."""
    repo_url = f"{rules.get('html_url', 'https://github.com')}/{rules.get('repo', '')}"
    if old == ZERO and any(fnmatch.fnmatchcase(ref, p) for p in rules.get("restrict_creation", [])):
        return (
            "creation_restricted",
            RULE_DECLINED,
            [
                f"error: GH013: Repository rule violations found for {ref}.",
                f"Review all repository rules at {repo_url}/rules?ref={quote(ref, safe='')}",
                "",
                "- Cannot create ref due to creations being restricted.",
                "",
            ],
        )
    if new == ZERO:
        if ref == f"refs/heads/{rules.get('default_branch', 'main')}":
            return ("default_branch", f"refusing to delete the current branch: {ref}", [])
        if ref.removeprefix("refs/heads/") in rules.get("classic_protected", []):
            return (
                "protected_branch",
                "protected branch hook declined",
                [
                    f"error: GH006: Protected branch update failed for {ref}.",
                    "error: Cannot delete this protected branch",
                ],
            )
        if any(fnmatch.fnmatchcase(ref, p) for p in rules.get("restrict_deletion", [])):
            return (
                "deletion_restricted",
                RULE_DECLINED,
                [
                    f"error: GH013: Repository rule violations found for {ref}.",
                    f"Review all repository rules at {repo_url}/rules?ref={quote(ref, safe='')}",
                    "",
                    "- Cannot delete this branch",
                    "",
                ],
            )
        return None
    commits = new_commits(new)
    if rules.get("app_push") and not rules.get("workflows"):
        path = workflow_change(commits)
        if path is not None:
            return (
                "workflows",
                f"refusing to allow a GitHub App to create or update workflow `{path}` "
                "without `workflows` permission",
                [],
            )
    large = large_files(commits)
    if large:
        lines = [
            f"error: Trace: {uuid.uuid4().hex}",
            "error: See https://gh.io/lfs for more information.",
        ]
        lines += [
            f"error: File {p} is {s / 1048576:.2f} MB; this exceeds GitHub's file size "
            "limit of 100.00 MB"
            for p, s in large
        ]
        lines.append(
            "error: GH001: Large files detected. You may want to try Git Large File Storage"
            " - https://git-lfs.github.com."
        )
        return ("large_file", "pre-receive hook declined", lines)
    found = secrets(commits) if rules.get("push_protection") else []
    if found:
        bar = "—" * 41
        lines = [
            f"error: GH013: Repository rule violations found for {ref}.",
            "",
            "- GITHUB PUSH PROTECTION",
            f"  {bar}",
            "    Resolve the following violations before pushing again",
            "",
            "    - Push cannot contain secrets",
            "",
            "    ",
            "     (?) Learn how to resolve a blocked push",
            "     https://docs.github.com/code-security/secret-scanning/working-with-secret-"
            "scanning-and-push-protection/working-with-push-protection-from-the-command-line"
            "#resolving-a-blocked-push",
            "    ",
            "    ",
        ]
        for kind, commit, path, line in found:
            lines += [
                f"      —— {kind} " + "—" * max(4, 52 - len(kind)),
                "       locations:",
                f"         - commit: {commit}",
                f"           path: {path}:{line}",
                "    ",
                "       (?) To push, remove secret from commit(s) or follow this URL to allow "
                "the secret.",
                f"       {repo_url}/security/secret-scanning/unblock-secret/"
                + uuid.uuid4().hex[:27],
                "    ",
            ]
        return ("secret", RULE_DECLINED, lines)
    return None


def main() -> int:
    git_dir = Path(_git("rev-parse", "--absolute-git-dir").strip())
    rules_path = git_dir / RULES_FILE
    rules = json.loads(rules_path.read_text()) if rules_path.is_file() else {}
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while _read_pkt(inp) is not None:  # version negotiation
        pass
    _write_pkt(out, "version=1")
    _flush(out)
    commands = []
    while (pkt := _read_pkt(inp)) is not None:
        old, new, ref = pkt.decode().strip().split(" ", 2)
        commands.append((old, new, ref))
    for old, new, ref in commands:
        verdict = judge(rules, ref, old, new)
        if verdict is None:
            _write_pkt(out, f"ok {ref}")
            _write_pkt(out, "option fall-through")
            continue
        cause, reason, lines = verdict
        for line in lines:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        with (git_dir / REFUSED_FILE).open("a") as log:
            log.write(json.dumps({"cause": cause, "ref": ref, "new": new, "reason": reason}) + "\n")
        _write_pkt(out, f"ng {ref} {reason}")
    _flush(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
