"""Plain git plumbing for the local GitHub server: bare repositories, diffs, squash merges."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_ENV = {
    "GIT_AUTHOR_NAME": "GitHub",
    "GIT_AUTHOR_EMAIL": "noreply@github.invalid",
    "GIT_COMMITTER_NAME": "GitHub",
    "GIT_COMMITTER_EMAIL": "noreply@github.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


class GitFailed(Exception):
    pass


def git(cwd: Path, *args: str, input: bytes | None = None, check: bool = True) -> str:
    env = {**os.environ, **_ENV, "HOME": str(cwd)}
    proc = subprocess.run(
        ["git", *args], cwd=cwd, input=input, capture_output=True, env=env, timeout=120
    )
    if check and proc.returncode != 0:
        raise GitFailed(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode(errors="replace")


def init_bare(path: Path, default_branch: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "--bare", "-q", f"--initial-branch={default_branch}")
    git(path, "config", "http.receivepack", "true")
    git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
    install_receive_rules(path)


def install_receive_rules(path: Path) -> None:
    """GitHub's receive-pack rules (bot/standins/receive_hook.py) as the repository's
    ``proc-receive`` hook, for every branch: a refused update comes back as git's own
    ``ng`` ref status with the hook's ``remote:`` lines."""
    hook = path / "hooks" / "proc-receive"
    hook.parent.mkdir(exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    hook.write_text(
        f"#!{sys.executable} -I\n"
        "import sys\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from bot.standins.receive_hook import main\n"
        "sys.exit(main())\n"
    )
    hook.chmod(0o755)
    git(path, "config", "receive.procReceiveRefs", "refs/heads")


def seed(bare: Path, branch: str, files: dict[str, str], message: str = "Initial commit") -> str:
    """Commit ``files`` onto ``branch`` of a bare repository without a work tree.

    On an existing branch the files are added to (or replace files in) its tree, as a
    push of one more commit would; on a new branch they are the whole tree.
    """
    entries = []
    for name, content in sorted(files.items()):
        blob = git(bare, "hash-object", "-w", "--stdin", input=content.encode()).strip()
        mode = "100755" if name.endswith(".sh") else "100644"
        entries.append((name, mode, blob))
    parent = resolve(bare, f"refs/heads/{branch}")
    tree = _write_tree(bare, entries) if parent is None else _amend_tree(bare, parent, entries)
    args = ["commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
    commit = git(bare, *args).strip()
    git(bare, "update-ref", f"refs/heads/{branch}", commit)
    return commit


def seed_gitlink(bare: Path, branch: str, path: str, url: str, commit: str = "1" * 40) -> str:
    """One more commit on ``branch`` that makes ``path`` a submodule: a gitlink (mode
    160000, naming ``commit`` of another repository, which need not exist here) and its
    ``.gitmodules`` entry, as ``git submodule add`` would push."""
    parent = resolve(bare, f"refs/heads/{branch}")
    if parent is None:
        raise GitFailed(f"{branch} does not exist")
    current = show(bare, parent, ".gitmodules") or b""
    modules = current.decode() + f'[submodule "{path}"]\n\tpath = {path}\n\turl = {url}\n'
    blob = git(bare, "hash-object", "-w", "--stdin", input=modules.encode()).strip()
    tree = _amend_tree(bare, parent, [(".gitmodules", "100644", blob), (path, "160000", commit)])
    sha = git(bare, "commit-tree", tree, "-p", parent, "-m", f"Add submodule {path}").strip()
    git(bare, "update-ref", f"refs/heads/{branch}", sha)
    return sha


def _amend_tree(bare: Path, parent: str, entries: list[tuple[str, str, str]]) -> str:
    index = bare / f"seed-index-{os.getpid()}"
    env = {**os.environ, **_ENV, "HOME": str(bare), "GIT_INDEX_FILE": str(index)}

    def run(*args: str) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=bare, capture_output=True, env=env, timeout=120, check=True
        )
        return proc.stdout.decode().strip()

    try:
        run("read-tree", parent)
        for name, mode, blob in entries:
            run("update-index", "--add", "--cacheinfo", f"{mode},{blob},{name}")
        return run("write-tree")
    finally:
        index.unlink(missing_ok=True)


def _write_tree(bare: Path, entries: list[tuple[str, str, str]]) -> str:
    # Build nested trees bottom-up: mktree takes one directory level at a time.
    dirs: dict[str, list[str]] = {}
    for name, mode, blob in entries:
        parent, _, leaf = name.rpartition("/")
        dirs.setdefault(parent, []).append(f"{mode} blob {blob}\t{leaf}")
        while parent:
            grand, _, _ = parent.rpartition("/")
            dirs.setdefault(grand, [])
            parent = grand
    for d in sorted(dirs, key=lambda p: -p.count("/") if p else 1):
        if not d:
            continue
        sha = git(bare, "mktree", input=("\n".join(dirs[d]) + "\n").encode()).strip()
        parent, _, leaf = d.rpartition("/")
        dirs[parent].append(f"040000 tree {sha}\t{leaf}")
    return git(bare, "mktree", input=("\n".join(dirs.get("", [])) + "\n").encode()).strip()


def resolve(bare: Path, ref: str) -> str | None:
    out = git(bare, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}", check=False).strip()
    return out or None


def show(bare: Path, ref: str, path: str) -> bytes | None:
    env = {**os.environ, **_ENV}
    proc = subprocess.run(
        ["git", "cat-file", "blob", f"{ref}:{path}"], cwd=bare, capture_output=True, env=env
    )
    return proc.stdout if proc.returncode == 0 else None


def diff(bare: Path, base: str, head: str) -> str:
    return git(bare, "diff", "--no-color", "--no-ext-diff", f"{base}...{head}")


def changed_files(bare: Path, base: str, head: str) -> list[dict[str, object]]:
    files: list[dict[str, object]] = []
    # --no-renames: a rename is a deletion and an addition, each with a plain file name.
    for line in git(bare, "diff", "--numstat", "--no-renames", f"{base}...{head}").splitlines():
        added, deleted, name = line.split("\t", 2)
        adds = int(added) if added.isdigit() else 0
        dels = int(deleted) if deleted.isdigit() else 0
        files.append(
            {
                "filename": name,
                "additions": adds,
                "deletions": dels,
                "changes": adds + dels,
                "status": "modified",
            }
        )
    return files


@dataclass(frozen=True)
class Squash:
    sha: str | None
    conflict: bool


def merge_tree(bare: Path, base: str, head: str) -> str | None:
    """The tree of merging ``head`` into ``base``, None on a conflict."""
    env = {**os.environ, **_ENV}
    proc = subprocess.run(
        ["git", "merge-tree", "--write-tree", base, head], cwd=bare, capture_output=True, env=env
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.decode().splitlines()[0].strip()


def squash_merge(bare: Path, base_branch: str, head_sha: str, message: str) -> Squash:
    """A real squash merge: the merged tree as one commit on ``base_branch``."""
    base_sha = resolve(bare, f"refs/heads/{base_branch}")
    assert base_sha is not None
    tree = merge_tree(bare, base_sha, head_sha)
    if tree is None:
        return Squash(None, conflict=True)
    commit = git(bare, "commit-tree", tree, "-p", base_sha, "-m", message).strip()
    # Compare-and-swap: fails if the base moved since we read it.
    git(bare, "update-ref", f"refs/heads/{base_branch}", commit, base_sha)
    return Squash(commit, conflict=False)
