"""`setup` as a phase of its own, apart from the agent (as Codex's and Copilot's cloud
agents run it): its own network, and the repository's dependency caches.

* **Network.** `setup` runs in a sandbox of its own with ``setup_network`` (the package
  registries, say) while the agent, verify and the critic keep ``sandbox.network``
  (default none). Unset, setup has ``sandbox.network``, as before.
* **Caches.** One directory per repository on the worker's disk
  (``<data dir>/caches/<installation>-<repository id>``), mounted into setup alone at
  ``INSIDE``, with the package managers pointed at it (``CACHE_ENV``). Keyed by GitHub's
  repository id: another repository, or a new one given a deleted one's name, never
  reads it; loops of one repository share it. Bounded: setup is killed when the cache
  passes ``LOOPBOT_SETUP_CACHE_MB`` (a resource limit), and a cache found over it is
  emptied before setup runs. ``LOOPBOT_SETUP_CACHE_MB=0`` turns caches off. All caches
  of a worker together stay within ``LOOPBOT_SETUP_CACHES_TOTAL_MB``: the least
  recently used go first.
* **Only on the maintainers' tree.** The setup phase runs once, on a new loop's worktree
  fresh from the default branch: nothing the agent wrote has run with setup's network or
  touched the cache. When setup must run again on the agent's tree (the agent deleted
  what setup made), it runs in the agent's sandbox: the agent's network, no cache.
* **Reuse.** A later turn, a restart or a handover on the same worker finds setup's
  output in the worktree. A loop resumed on another worker (its worktree made from the
  pushed branch) does not run setup there.
"""

from __future__ import annotations

import os
from pathlib import Path

from bot.core.settings import Settings
from jobs.sandbox.bwrap import Extra, Mount, Network, Result, Sandbox
from jobs.sandbox.disk import TreeError, disk_usage, remove_tree

INSIDE = "/tmp/loopbot-cache"
# Where each package manager keeps what it downloaded (and, for cargo and go, built).
CACHE_ENV = {
    "PIP_CACHE_DIR": f"{INSIDE}/pip",
    "UV_CACHE_DIR": f"{INSIDE}/uv",
    "POETRY_CACHE_DIR": f"{INSIDE}/poetry",
    "npm_config_cache": f"{INSIDE}/npm",
    "YARN_CACHE_FOLDER": f"{INSIDE}/yarn",
    "PNPM_STORE_DIR": f"{INSIDE}/pnpm",
    "CARGO_HOME": f"{INSIDE}/cargo",
    "GOMODCACHE": f"{INSIDE}/go/mod",
    "GOCACHE": f"{INSIDE}/go/build",
    "GRADLE_USER_HOME": f"{INSIDE}/gradle",
    "MAVEN_OPTS": f"-Dmaven.repo.local={INSIDE}/maven",
}


def cache_dir(data_dir: Path, installation_id: int, repo_id: int, full_name: str) -> Path:
    """The repository's cache directory (by its GitHub id; by name when no id is known,
    which GitHub always gives)."""
    key = str(repo_id) if repo_id else "name-" + full_name.replace("/", "--")
    return data_dir / "caches" / f"{installation_id}-{key}"


def over(path: Path, limit: int) -> bool:
    try:
        return disk_usage(path, limit) > limit
    except TreeError:
        return True  # a tree that cannot be walked is not one to keep


def empty(path: Path, owner: tuple[int, int] | None) -> None:
    remove_tree(path)
    prepare(path, owner)


def prepare(path: Path, owner: tuple[int, int] | None) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if owner is not None:
        os.chown(path, *owner, follow_symlinks=False)


def evict(root: Path, total: int, keep: Path) -> list[Path]:
    """The least recently used caches under ``root`` removed until all of them together
    hold at most ``total`` bytes (``keep``, the one just used, last of all). Returns what
    went."""
    sizes: list[tuple[float, Path, int]] = []
    for path in root.iterdir() if root.is_dir() else []:
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            used = disk_usage(path, total + 1)
        except TreeError:
            used = total + 1  # cannot be walked: not worth keeping
        sizes.append((path.stat().st_mtime if path != keep else float("inf"), path, used))
    held = sum(used for _, _, used in sizes)
    gone = []
    for _, path, used in sorted(sizes, key=lambda x: x[0]):
        if held <= total:
            break
        remove_tree(path)
        held -= used
        gone.append(path)
    return gone


class SetupPhase:
    """The sandbox `setup` runs in, with its network and the repository's cache."""

    def __init__(
        self,
        worktree: Path,
        *,
        settings: Settings,
        network: Network,
        timeout: float,
        readonly: tuple[Path, ...],
        cache: Path | None,
    ) -> None:
        self.sandbox = Sandbox(
            worktree, settings=settings, network=network, timeout=timeout, readonly=readonly
        )
        self.cache = cache if settings.setup_cache_mb > 0 else None
        self.limit = settings.setup_cache_mb << 20
        self.total = settings.setup_caches_total_mb << 20
        self.emptied = False  # the cache was over its limit before this setup

    def run(self, command: str) -> Result:
        if self.cache is None:
            return self.sandbox.run(command)
        owner = self.sandbox.file_owner
        prepare(self.cache, owner)
        if over(self.cache, self.limit):
            empty(self.cache, owner)
            self.emptied = True
        cache, limit = self.cache, self.limit

        def watch() -> str | None:
            if over(cache, limit):
                return f"setup's dependency cache passed {limit >> 20} MiB"
            return None

        result = self.sandbox.run(
            command,
            extra=Extra(env=dict(CACHE_ENV), mounts=(Mount(cache, INSIDE, writable=True),)),
            watch=watch,
        )
        if result.over_limit and over(cache, limit):
            empty(cache, owner)  # never left over its bound for the next loop
        os.utime(cache)  # its last use, for evict
        evict(cache.parent, self.total, keep=cache)
        return result

    def close(self) -> None:
        self.sandbox.close()
