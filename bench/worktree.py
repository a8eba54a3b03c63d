"""Worktree provisioning on a large synthetic repository.

    .venv/bin/python bench/worktree.py [--files 20000] [--commits 5000] [--rounds 5] [--smoke]

Builds a repository with ``--files`` files and ``--commits`` commits (git fast-import),
serves it from the local GitHub server over HTTP (smart HTTP, token auth), and times:

- loopbot, new: ``Worktrees.sync_mirror`` (a fetch into the warm bare mirror) and
  ``Worktrees.checkout`` with no spare (``git worktree add -B loop/issue-N``);
- loopbot, recycled: the same when a finished loop's worktree was kept as a spare
  (``git worktree move`` + ``checkout -f -B`` + ``clean -ffdx``: only changed files are
  written) — the usual case on a worker that has run a loop for this repository;
- raw: ``git worktree add`` on the same mirror, nothing else;
- fresh clone: ``git clone`` of the repository over the same HTTP server.

Prints the median of ``--rounds`` runs of each and the two ratios. ``--smoke``: 1,000
files, 20 commits, one round (see bench/_smoke.py).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _smoke
from bot.standins.github import GitHubServer
from jobs.tree.worktree import Worktrees, git

REPO = "bench/large"


def synthesize(bare: Path, files: int, commits: int) -> None:
    """One commit with ``files`` files, then small commits until there are ``commits``."""
    lines: list[bytes] = []
    mark = 0

    def blob(data: bytes) -> int:
        nonlocal mark
        mark += 1
        lines.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(data), data))
        return mark

    def commit(n: int, changes: list[tuple[str, int]]) -> None:
        msg = b"commit %d" % n
        lines.append(b"commit refs/heads/main\n")
        lines.append(b"committer Bench <bench@example.com> %d +0000\n" % (1_700_000_000 + n))
        lines.append(b"data %d\n%s\n" % (len(msg), msg))
        for path, m in changes:
            lines.append(b"M 100644 :%d %s\n" % (m, path.encode()))
        lines.append(b"\n")

    rng = random.Random(42)
    words = [
        bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz_", k=rng.randint(3, 12)))
        for _ in range(5000)
    ]

    def source(n: int) -> bytes:
        # ~3 KB of code-like text that compresses about as well as real source does.
        return (
            b"\n".join(
                b"def %s(%s):\n    return %s(%d)"
                % (rng.choice(words), rng.choice(words), rng.choice(words), rng.randint(0, 10**6))
                for _ in range(60)
            )
            + b"\n# %d\n" % n
        )

    first = [(f"pkg{i // 500:03d}/mod{i % 500:03d}.py", blob(source(i))) for i in range(files)]
    commit(1, first)
    for n in range(2, commits + 1):
        path = f"pkg{n % (files // 500):03d}/mod{n % 500:03d}.py"
        commit(n, [(path, blob(source(n)))])
    subprocess.run(["git", "fast-import", "--quiet"], cwd=bare, input=b"".join(lines), check=True)
    subprocess.run(["git", "repack", "-adq"], cwd=bare, check=True)


def timed(fn: object) -> float:
    # Flush what earlier rounds wrote, so that one measurement does not pay for another's
    # write-back: on this kind of disk, writing 20,000 files dominates every figure.
    os.sync()
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--commits", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--dir",
        default=None,
        help="where to work, e.g. /dev/shm to take a noisy disk out of the figures",
    )
    args = _smoke.parse(ap, files=1000, commits=20, rounds=1)
    root = Path(tempfile.mkdtemp(prefix="loopbot-wt-bench-", dir=args.dir))
    github = GitHubServer(root / "github").start()
    try:
        iid = github.add_installation("bench")
        repo = github.add_repo(REPO, installation_id=iid)
        t = time.perf_counter()
        synthesize(repo.path, args.files, args.commits)
        count = git(repo.path, "rev-list", "--count", "main").strip()
        nfiles = len(git(repo.path, "ls-tree", "-r", "--name-only", "main").splitlines())
        size = sum(f.stat().st_size for f in (repo.path / "objects").rglob("*") if f.is_file())
        print(
            f"synthetic repository: {nfiles} files, {count} commits, {size / 2**20:.0f} MiB "
            f"packed (built in {time.perf_counter() - t:.1f}s)"
        )
        token = github.app_token_for(iid)
        clone_url = f"{github.url}/git/{REPO}.git"
        wt = Worktrees(root / "data")
        wt.sync_mirror(REPO, clone_url, token)  # warm the mirror once, as a worker would
        mirror = wt.mirror_path(REPO)

        new, recycled, raw, clone = [], [], [], []
        for i in range(args.rounds):
            a, b = 100 + 2 * i, 101 + 2 * i
            shutil.rmtree(wt.spares_dir(REPO), ignore_errors=True)
            git(mirror, "worktree", "prune")

            def provision(n: int) -> None:
                wt.sync_mirror(REPO, clone_url, token)
                wt.checkout(REPO, n, f"loop/issue-{n}", "main", mirror)

            new.append(timed(lambda a=a: provision(a)))
            wt.release(REPO, a)  # what the reaper does when the loop completes
            recycled.append(timed(lambda b=b: provision(b)))
            wt.remove(REPO, b)
            target = root / f"raw-{i}"
            raw.append(
                timed(
                    lambda target=target, i=i: git(
                        mirror,
                        "worktree",
                        "add",
                        "-q",
                        "-b",
                        f"raw-{i}",
                        str(target),
                        "refs/remotes/origin/main",
                    )
                )
            )
            shutil.rmtree(target)
            git(mirror, "worktree", "prune")
            dest = root / f"clone-{i}"
            clone.append(
                timed(lambda dest=dest: git(root, "clone", "-q", clone_url, str(dest), token=token))
            )
            shutil.rmtree(dest)
        nw, rc, rw, cl = (statistics.median(x) * 1000 for x in (new, recycled, raw, clone))
        print(f"working in {root.parent}; median of {args.rounds} rounds:")
        print(
            f"  loopbot, new worktree   {nw:7.0f} ms   ({nw / rw:.2f}x raw git worktree add; "
            "target <= 1.2x)"
        )
        print(f"  loopbot, recycled spare {rc:7.0f} ms   ({rc / rw:.2f}x raw)")
        print(f"  raw git worktree add    {rw:7.0f} ms")
        print(
            f"  fresh clone over HTTP   {cl:7.0f} ms   ({cl / nw:.1f}x new, {cl / rc:.1f}x "
            "recycled; target >= 10x)"
        )
    finally:
        github.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
