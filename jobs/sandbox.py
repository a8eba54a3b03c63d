"""Every command the agent or verify runs goes through here, under bubblewrap.

Inside: the whole file system read-only, the worktree writable, a private ``/tmp`` and
``$HOME``, loopbot's data directory and the App key hidden, ``/run`` hidden (no Unix
sockets to Redis or Docker), an empty environment but for a few harmless variables,
no network unless the repository allows it, a new PID namespace, killed with its parent
and on timeout. Output is kept to a bounded head and tail.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bot.settings import Settings

DEFAULT_MAX_OUTPUT = 64 * 1024
_SAFE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "CI": "true",
    "HOME": "/tmp/home",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "PAGER": "cat",
}
# Operator files that hold credentials, masked even though the rest of / is readable.
_SECRET_PATHS = (
    ".ssh",
    ".gitconfig",
    ".git-credentials",
    ".netrc",
    ".config",
    ".aws",
    ".docker",
    ".kube",
    ".pypirc",
    ".npmrc",
    ".anthropic",
)


class SandboxUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Result:
    exit_code: int
    output: str
    seconds: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def availability_problem(settings: Settings) -> str | None:
    """Why commands cannot run safely on this machine, or None when they can."""
    if bwrap_path() is not None or settings.allow_unsandboxed:
        return None
    return (
        "bubblewrap (bwrap) is not installed, so agent commands cannot be sandboxed. "
        "Install it (apt-get install bubblewrap) or, knowingly, set "
        "LOOPBOT_ALLOW_UNSANDBOXED=true."
    )


class Sandbox:
    def __init__(
        self,
        worktree: Path,
        *,
        settings: Settings,
        network: bool = False,
        timeout: float = 600,
        max_output: int = DEFAULT_MAX_OUTPUT,
        readonly: tuple[Path, ...] = (),
    ) -> None:
        self.worktree = worktree.resolve()
        self.settings = settings
        self.network = network
        self.timeout = timeout
        self.max_output = max_output
        self.readonly = readonly  # shown read-only even inside the hidden data dir (the mirror)
        problem = availability_problem(settings)
        if problem:
            raise SandboxUnavailable(problem)
        self.bwrap = bwrap_path()

    def _env(self) -> dict[str, str]:
        # The worker's PATH is not a secret, and verify commands expect its tools.
        return {**_SAFE_ENV, "PATH": os.environ.get("PATH", _SAFE_ENV["PATH"])}

    def _argv(self, command: str) -> list[str]:
        if self.bwrap is None:  # the operator opted out explicitly
            return ["/bin/sh", "-c", command]
        data_dir = self.settings.data_dir.resolve()
        args = [
            self.bwrap,
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            "/run",
            "--dir",
            "/tmp/home",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
        ]
        if self.network:
            args.append("--share-net")
        if data_dir.exists():
            args += ["--tmpfs", str(data_dir)]
        for ro in self.readonly:
            if ro.exists():
                args += ["--ro-bind", str(ro), str(ro)]
        args += ["--bind", str(self.worktree), str(self.worktree)]
        key = self.settings.github_private_key_path
        if key is not None and key.exists():
            args += ["--ro-bind", "/dev/null", str(key.resolve())]
        home = Path.home()
        for name in _SECRET_PATHS:
            p = home / name
            if p.is_dir():
                args += ["--tmpfs", str(p)]
            elif p.exists():
                args += ["--ro-bind", "/dev/null", str(p)]
        for k, v in self._env().items():
            args += ["--setenv", k, v]
        args += ["--chdir", str(self.worktree), "/bin/sh", "-c", command]
        return args

    def run(self, command: str, timeout: float | None = None) -> Result:
        limit = timeout or self.timeout
        started = time.monotonic()
        env = self._env() if self.bwrap is None else {"PATH": _SAFE_ENV["PATH"]}
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(
                self._argv(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.worktree,
                env=env,
                start_new_session=True,
            )
            timed_out = False
            try:
                proc.wait(limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            seconds = time.monotonic() - started
            output, truncated = _bounded(out, self.max_output)
        if timed_out:
            output += f"\n[loopbot: command timed out after {limit:.0f}s and was killed]"
        return Result(
            proc.returncode if not timed_out else 124, output, seconds, timed_out, truncated
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _bounded(f: IO[bytes], limit: int) -> tuple[str, bool]:
    """The head and tail of the output, never more than ``limit`` bytes in memory."""
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    if size <= limit:
        return f.read().decode("utf-8", "replace"), False
    head_n = limit // 4
    head = f.read(head_n)
    f.seek(size - (limit - head_n))
    tail = f.read()
    skipped = size - len(head) - len(tail)
    text = (
        head.decode("utf-8", "replace")
        + f"\n[... {skipped} bytes of output omitted ...]\n"
        + tail.decode("utf-8", "replace")
    )
    return text, True
