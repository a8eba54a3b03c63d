"""One control group per sandboxed command: total memory and processes, not per process.

``prlimit`` bounds each process (address space) and the processes of one host uid; a
command with 500 processes of 8 GiB each, or one loop starving another that runs as the
same uid, gets past that. A cgroup bounds the command as a whole: ``memory`` (including
tmpfs pages and kernel memory such as inodes) and ``pids``.

Each command's group is created *below the worker's own group* for each controller, so
loopbot never moves work out of the limits its operator gave the worker. It needs write
access to those groups: a root worker under cgroup v1 (memory and pids hierarchies), or
cgroup v2 where the worker's group delegates ``memory`` and ``pids`` to its children
(``cgroup.subtree_control``, e.g. systemd's ``Delegate=yes``) and holds no process
itself. Where neither holds, ``available()`` says why and the rlimits stand alone;
``loopbot doctor`` reports which.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "loopbot-sandbox-"


@dataclass(frozen=True)
class Group:
    dirs: tuple[Path, ...]  # one per hierarchy (v1) or the one v2 group

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def remove(self, wait: float = 5.0) -> None:
        """Remove the group once its processes are gone (they were just killed)."""
        deadline = time.monotonic() + wait
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


def _own(controller: str | None) -> Path | None:
    """This process's group in the hierarchy of ``controller`` (None: the v2 one)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if (controller is None and names == "") or (
                controller is not None and controller in names.split(",")
            ):
                base = ROOT / controller if controller else ROOT
                if controller and not base.is_dir():
                    base = ROOT / names  # co-mounted, e.g. "cpu,cpuacct"
                return base / path.lstrip("/")
    return None


def _layout() -> tuple[str, tuple[Path, ...]] | str:
    """('v1', (memory parent, pids parent)) or ('v2', (parent,)), or why not."""
    if os.geteuid() != 0 and not os.environ.get("LOOPBOT_CGROUP_DELEGATED"):
        return "the worker is not root and has no delegated cgroup"
    mem, pids = _own("memory"), _own("pids")
    if mem is not None and pids is not None and mem.is_dir() and pids.is_dir():
        if os.access(mem, os.W_OK) and os.access(pids, os.W_OK):
            return ("v1", (mem, pids))
        return "cgroup v1: the worker's memory and pids groups are not writable"
    unified = _own(None)
    if unified is None or not (unified / "cgroup.subtree_control").is_file():
        return "no cgroup v1 memory/pids hierarchy and no cgroup v2"
    enabled = (unified / "cgroup.subtree_control").read_text().split()
    if not {"memory", "pids"} <= set(enabled):
        return (
            f"cgroup v2: {unified} does not delegate memory and pids to its children "
            "(write '+memory +pids' to its cgroup.subtree_control, e.g. systemd Delegate=yes)"
        )
    return ("v2", (unified,))


def available() -> str | None:
    """None when commands can get their own groups, else why not."""
    layout = _layout()
    return layout if isinstance(layout, str) else None


def sweep(older_than: float = 300.0) -> int:
    """Remove this worker's empty command groups left by a process that died before it
    could (a group in use is not empty, and rmdir refuses it). Returns how many."""
    layout = _layout()
    if isinstance(layout, str):
        return 0
    removed, now = 0, time.time()
    for parent in layout[1]:
        for d in parent.glob(PREFIX + "*"):
            with contextlib.suppress(OSError):
                if now - d.stat().st_mtime > older_than:
                    d.rmdir()
                    removed += 1
    return removed


def create(memory_bytes: int, processes: int) -> Group | None:
    """A new group with these limits, or None where cgroups cannot be used."""
    layout = _layout()
    if isinstance(layout, str):
        return None
    kind, parents = layout
    name = PREFIX + uuid.uuid4().hex[:12]
    made: list[Path] = []
    try:
        for parent in parents:
            d = parent / name
            d.mkdir()
            made.append(d)
        if kind == "v1":
            mem, pids = made
            if memory_bytes:
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (pids / "pids.max").write_text(str(processes))
        else:
            (g,) = made
            if memory_bytes:
                (g / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (g / "memory.swap.max").write_text("0")
            (g / "pids.max").write_text(str(processes))
    except OSError:
        Group(tuple(made)).remove(wait=0)
        return None
    return Group(tuple(made))
