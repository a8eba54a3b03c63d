"""Every command the agent, setup or verify runs goes through here, under bubblewrap.

What a command sees is an allowlist, not the host with holes punched in it:

- the toolchains read-only (``/usr`` and the ``/bin``, ``/lib*`` links into it, plus
  any ``LOOPBOT_SANDBOX_READ_ONLY_PATHS`` the operator adds), a few harmless files of
  ``/etc`` and a ``passwd``/``group``/``hosts`` written here, nothing else of the host;
- the loop's own worktree writable, its own mirror read-only, nothing else of
  loopbot's data directory; a private, size-bounded ``/tmp`` with an empty ``$HOME``;
- its own user, PID, IPC, UTS, cgroup and network namespaces; uid 1000 inside, every
  capability dropped, no further user namespaces, the root file system read-only;
- an empty environment but for a few harmless variables;
- limits on processes, address space, file size and core dumps (``prlimit``);
- a network of its own with only loopback. With ``sandbox.network`` on, its one way out
  is a filtering proxy outside (``jobs.sandbox.egress``) that refuses loopback, private,
  link-local and metadata addresses and, given a host list, every other host.

A root worker never hands root to a command: the command runs as the unprivileged host
uid ``LOOPBOT_SANDBOX_UID``, so even outside its user namespace it holds nothing of
root's. Since that uid cannot traverse a data directory under ``/root``, the worktree
and mirror are first bind-mounted onto a traversable staging directory in a private
mount namespace (``unshare``), then handed to bubblewrap from there. The worktree is
owned by that uid (``adopt``) so the command can write it.

Output is read through a pipe, keeping a bounded head and tail in memory; nothing is
spooled to disk. The command and everything it started are killed on timeout
(``jobs.sandbox.process``). The seccomp filter is ``jobs.sandbox.seccomp``; the
worktree's walk and disk charge, ``jobs.sandbox.disk``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bot.core.settings import Settings
from jobs.sandbox import bytecode, cgroups, egress
from jobs.sandbox.disk import TreeError, disk_usage, remove_tree, walk
from jobs.sandbox.egress_policy import EgressPolicy
from jobs.sandbox.home import HomeLink, HomeUnreachable
from jobs.sandbox.process import HeadTail, become_subreaper, kill_group, pump, reap_orphans
from jobs.sandbox.seccomp import memfd, seccomp_program

DEFAULT_MAX_OUTPUT = 64 * 1024
MAX_COMMAND = 100_000  # bytes of one command line (the kernel's argv limit is 128 KiB)
NICE = 10  # sandbox commands yield the CPU to the harness (and to other loops' harness)
INSIDE_UID = 1000
INSIDE_HOME = "/tmp/home"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SAFE_ENV = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "CI": "true",
    "HOME": INSIDE_HOME,
    "USER": "sandbox",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    # Python reads bytecode from here only, never from a __pycache__ in the worktree: an
    # unchecked .pyc committed there would run instead of the test beside it (red team).
    # Only the system's own bytecode is there (bytecode.py), at <prefix>/usr.
    "PYTHONPYCACHEPREFIX": "/tmp/pycache",
    "GIT_TERMINAL_PROMPT": "0",
    "PAGER": "cat",
    # The worktree's git metadata lives in the mirror, owned by another uid: let the
    # agent's own (read-only) git commands work there. Command-line-level config.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}
# The parts of /etc that programs need and that hold no secrets. Everything else of the
# host's /etc (shadow, ssl/private, pip.conf with index tokens, gitconfig, ...) is absent.
_ETC = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "mime.types",
    "protocols",
    "services",
    "os-release",
    "debian_version",
    "lsb-release",
    "inputrc",
    "terminfo",
    "nsswitch.conf",
    "host.conf",
    "xdg",
)
_ETC_GLOBS = ("python3*", "java*", "perl")
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_STAGE_SCRIPT = """set -e
while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done
shift
while [ "$1" != "--" ]; do
  mount --bind "$2" "$3"
  if [ "$1" = ro ]; then mount -o remount,bind,ro "$3"; fi
  shift 3
done
shift
exec "$@"
"""
_HELPERS = ("bwrap", "prlimit", "unshare", "setpriv", "mount")
# With a HOME link, the command's first lines: say the sandbox is set up, then wait for the
# harness to have seeded HOME (a line on stdin) before anything else runs.
_READY = b"loopbot-sandbox-ready\n"
_HOME_PRELUDE = f"echo {_READY.decode().strip()}; read -r _ || exit 125; exec </dev/null"
READY_WITHIN = 120.0  # seconds a sandbox with a HOME link has to say it is set up
_STAGE_PARENT = "/tmp"


class SandboxUnavailable(RuntimeError):
    pass


def _child_pid(info: int, deadline: float) -> int | None:
    """The sandbox's pid (in the worker's pid namespace) from bwrap's ``--info-fd``."""
    data = b""
    while len(data) < 1 << 16:
        try:
            found = json.loads(data)
        except ValueError:
            pass
        else:
            pid = found.get("child-pid") if isinstance(found, dict) else None
            return pid if isinstance(pid, int) and pid > 0 else None
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([info], [], [], left)[0]:
            return None
        chunk = os.read(info, 4096)
        if not chunk:
            return None
        data += chunk
    return None


@dataclass(frozen=True)
class Mount:
    """A host path bound into the sandbox at ``dst`` (read-only unless ``writable``)."""

    src: Path
    dst: str
    writable: bool = False


@dataclass(frozen=True)
class Extra:
    """What one command gets beyond the sandbox's own: environment variables, mounts,
    and shell lines run first inside (a relay to a socket mounted in)."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    prelude: str = ""
    # The worktree also at this fixed path, and the command started there (a backend
    # whose sessions remember their directory: every worker then shows it the same one).
    worktree_at: str | None = None
    # Address space per process, when more than the sandbox's (Codex's JavaScript host
    # reserves a V8 heap cage it never fills); the cgroup's memory.max, where there is
    # one, still bounds what is used.
    address_space: int = 0
    # The command's HOME reached from the harness (``jobs.sandbox.home``): seeded before
    # the command starts, read after it ends, all through a descriptor.
    home: HomeLink | None = None


@dataclass(frozen=True)
class Result:
    exit_code: int
    output: str
    seconds: float
    timed_out: bool = False
    truncated: bool = False
    over_limit: str | None = None  # killed for a resource limit: which, and why

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.over_limit is None


@dataclass(frozen=True)
class Limits:
    processes: int
    memory_bytes: int  # address space per process; 0 = unlimited
    file_bytes: int
    tmp_bytes: int
    worktree_bytes: int
    output_bytes: int

    @classmethod
    def from_settings(cls, s: Settings) -> Limits:
        mb = 1024 * 1024
        return cls(
            processes=s.sandbox_max_processes,
            memory_bytes=s.sandbox_max_memory_mb * mb,
            file_bytes=s.sandbox_max_file_mb * mb,
            tmp_bytes=s.sandbox_tmp_mb * mb,
            worktree_bytes=s.sandbox_max_worktree_mb * mb,
            output_bytes=s.sandbox_max_output_kb * 1024,
        )


Network = bool | tuple[str, ...]  # off, any public host, or these hosts only


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def runs_as_root() -> bool:
    return os.geteuid() == 0


def availability_problem(settings: Settings) -> str | None:
    """Why commands cannot run safely on this machine, or None when they can."""
    if settings.allow_unsandboxed and bwrap_path() is None:
        return None
    needed = _HELPERS if runs_as_root() else ("bwrap", "prlimit")
    found = {name: bwrap_path() if name == "bwrap" else shutil.which(name) for name in needed}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed, so agent commands cannot be sandboxed. "
            "Install them (apt-get install bubblewrap util-linux mount) or, knowingly, set "
            "LOOPBOT_ALLOW_UNSANDBOXED=true."
        )
    return None


class Sandbox:
    def __init__(
        self,
        worktree: Path,
        *,
        settings: Settings,
        network: Network = False,
        timeout: float = 600,
        max_output: int | None = None,
        readonly: tuple[Path, ...] = (),
    ) -> None:
        self.worktree = worktree.resolve()
        self.settings = settings
        self.network = network
        self.timeout = timeout
        self.limits = Limits.from_settings(settings)
        self.max_output = max_output or self.limits.output_bytes
        self.readonly = tuple(p.resolve() for p in readonly)  # the loop's own mirror
        problem = availability_problem(settings)
        if problem:
            raise SandboxUnavailable(problem)
        self.bwrap = bwrap_path()
        self._egress: egress.EgressProxy | None = None
        self._extra = Extra()  # the running command's (``run``)
        self._mounts = 0
        # Our own small files (passwd, hosts, mount points), traversable by the sandbox uid.
        # In /tmp itself, not $TMPDIR: the sandbox uid must traverse to it (mode 0711).
        self._stage = Path(tempfile.mkdtemp(prefix="loopbot-sandbox-", dir=_STAGE_PARENT))
        self._stage.chmod(0o711)
        self._cleanup = weakref.finalize(self, remove_tree, self._stage)
        self._write_etc()
        self.adopt()
        if self.file_owner is not None:
            cgroups.sweep()

    # -- who owns what ---------------------------------------------------------------------

    @property
    def file_owner(self) -> tuple[int, int] | None:
        """(uid, gid) that files the harness creates in the worktree must be given so the
        sandbox's unprivileged user can change them; None when no chown is needed."""
        if self.bwrap is None or not runs_as_root():
            return None
        return (self.settings.sandbox_uid, self.settings.sandbox_gid)

    def adopt(self) -> None:
        """Give the worktree to the sandbox's uid (after the harness checked files out)."""
        owner = self.file_owner
        if owner is None:
            return
        uid, gid = owner
        with contextlib.suppress(OSError):
            os.chown(self.worktree, uid, gid, follow_symlinks=False)
        with contextlib.suppress(TreeError):  # what cannot be walked, worktree_problem reports
            for fd, name, st in walk(self.worktree):
                if (st.st_uid, st.st_gid) != (uid, gid):
                    with contextlib.suppress(OSError):
                        os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)

    def worktree_problem(self) -> str | None:
        """A clear message when the worktree has grown past its disk limit, else None."""
        limit = self.limits.worktree_bytes
        try:
            used = disk_usage(self.worktree, limit)
        except TreeError as exc:
            return f"the repository's working tree cannot be checked: {exc}; remove it"
        if used <= limit:
            return None
        return (
            f"the repository's working tree uses more than {limit // (1024 * 1024)} MiB of "
            "disk (LOOPBOT_SANDBOX_MAX_WORKTREE_MB; every file counts at least 4 KiB and a "
            "sparse file its full size); delete what you generated"
        )

    # -- the command line ------------------------------------------------------------------

    def _write_etc(self) -> None:
        etc = self._stage / "etc"
        etc.mkdir(mode=0o755)
        files = {
            "passwd": f"root:x:0:0::/:/usr/sbin/nologin\n"
            f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}::{INSIDE_HOME}:/bin/sh\n"
            "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n",
            "group": f"root:x:0:\nsandbox:x:{INSIDE_UID}:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n",
        }
        for name, text in files.items():
            (etc / name).write_text(text)
            (etc / name).chmod(0o644)
        for name in ("wt", "mirror", "egress"):
            (self._stage / name).mkdir(mode=0o711)

    def _env(self) -> dict[str, str]:
        # The worker's PATH is not a secret, and verify commands expect its tools; what
        # it names outside the allowlist simply does not exist inside.
        env = {**_SAFE_ENV, "PATH": os.environ.get("PATH", _PATH)}
        if self.network:
            env |= egress.PROXY_ENV
        return env | self._extra.env

    def private_dir(self, name: str) -> Path:
        """A fresh directory of the harness's, outside the worktree, that the sandbox's
        user owns (a backend's HOME, a socket's directory): mount it with ``Extra``."""
        path = self._stage / "private" / name
        path.parent.mkdir(mode=0o711, exist_ok=True)
        if path.exists():
            remove_tree(path)
        path.mkdir(mode=0o700)
        if self.file_owner is not None:
            os.chown(path, *self.file_owner)
        return path

    def _binds(self) -> tuple[list[str], list[tuple[str, Path, Path]]]:
        """bwrap's mount arguments, and what a root worker must stage first:
        (mode, source, staging path)."""
        staged: list[tuple[str, Path, Path]] = []
        root = self.file_owner is not None

        def through_stage(mode: str, src: Path, name: str) -> Path:
            if not root:
                return src
            target = self._stage / name
            staged.append((mode, src, target))
            return target

        args = ["--ro-bind", "/usr", "/usr"]
        for name in _TOP_LEVEL:
            top = Path("/") / name
            if top.is_symlink():
                args += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                args += ["--ro-bind", str(top), str(top)]
        etc = Path("/etc")
        wanted = [etc / n for n in _ETC]
        for pattern in _ETC_GLOBS:
            wanted += sorted(etc.glob(pattern))
        for path in wanted:
            if path.is_symlink() and path.resolve().is_relative_to("/usr"):
                args += ["--symlink", os.readlink(path), str(path)]
            else:
                args += ["--ro-bind-try", str(path), str(path)]
        for name in ("passwd", "group", "hosts"):
            args += ["--ro-bind", str(self._stage / "etc" / name), f"/etc/{name}"]
        for extra in filter(None, self.settings.sandbox_read_only_paths.split(":")):
            args += ["--ro-bind-try", extra, extra]
        args += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            str(64 * 1024 * 1024),
            "--tmpfs",
            "/dev/shm",
            # bwrap's /dev is a tmpfs the sandbox user owns, sized at half the RAM.
            "--remount-ro",
            "/dev",
            "--size",
            str(self.limits.tmp_bytes),
            "--tmpfs",
            "/tmp",
            "--dir",
            INSIDE_HOME,
        ]
        system_bytecode = bytecode.tree()
        if system_bytecode is not None:  # -try: gone since (a cleaner of /tmp), Python compiles
            prefix = _SAFE_ENV["PYTHONPYCACHEPREFIX"]
            args += ["--ro-bind-try", str(system_bytecode), f"{prefix}/usr"]
        for ro in self.readonly:
            if ro.is_dir():
                args += ["--ro-bind", str(through_stage("ro", ro, "mirror")), str(ro)]
        staged_wt = str(through_stage("rw", self.worktree, "wt"))
        args += ["--bind", staged_wt, str(self.worktree)]
        if self._extra.worktree_at:
            args += ["--bind", staged_wt, self._extra.worktree_at]
        if self._egress is not None:
            sock_dir = through_stage("rw", self._egress.socket_path.parent, "egress")
            args += [
                "--bind",
                str(sock_dir / self._egress.socket_path.name),
                egress.SANDBOX_SOCKET,
            ]
        for mount in self._extra.mounts:
            src = mount.src
            if root and not src.resolve().is_relative_to(self._stage):
                # The sandbox's uid may not traverse to it: staged, as the worktree is.
                self._mounts += 1
                name = f"m{self._mounts}"
                target = self._stage / name
                if src.is_dir():
                    target.mkdir(mode=0o711)
                else:
                    target.touch(mode=0o644)
                src = through_stage("rw" if mount.writable else "ro", src, name)
            args += ["--bind" if mount.writable else "--ro-bind", str(src), mount.dst]
        return args, staged

    def _argv(
        self,
        command: str,
        seccomp_fd: int | None = None,
        group: cgroups.Group | None = None,
        info_fd: int | None = None,
    ) -> list[str]:
        if self.bwrap is None:  # the operator opted out explicitly
            return ["/bin/sh", "-c", command]
        mounts, staged = self._binds()
        script = command
        preludes = [_HOME_PRELUDE] if info_fd is not None else []
        if self._egress is not None:
            preludes.append(egress.sandbox_prelude())
        if self._extra.prelude:
            preludes.append(self._extra.prelude)
        if preludes:
            script = "\n".join(preludes) + '\nexec /bin/sh -c "$1"'
        bwrap = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--uid",
            str(INSIDE_UID),
            "--gid",
            str(INSIDE_UID),
            "--disable-userns",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            *mounts,
            "--remount-ro",
            "/",
        ]
        if seccomp_fd is not None:
            bwrap += ["--seccomp", str(seccomp_fd)]
        if info_fd is not None:  # the sandbox's pid, for its HOME (``_meet``)
            bwrap += ["--info-fd", str(info_fd)]
        for k, v in self._env().items():
            bwrap += ["--setenv", k, v]
        bwrap += ["--chdir", self._extra.worktree_at or str(self.worktree), "/bin/sh", "-c", script]
        if preludes:
            bwrap += ["sh", command]
        lim = self.limits
        # With a cgroup, pids.max bounds this command alone; the per-uid rlimit, shared by
        # every sandbox of the uid, is then only a backstop that one loop cannot exhaust.
        nproc = lim.processes * 16 if group is not None else lim.processes
        limits = [
            "nice",
            "-n",
            str(NICE),
            "prlimit",
            f"--nproc={nproc}",
            f"--fsize={lim.file_bytes}",
            "--core=0",
            "--nofile=4096",
        ]
        if lim.memory_bytes:
            limits.append(f"--as={max(lim.memory_bytes, self._extra.address_space)}")
        argv = [*limits, "--", *bwrap]
        owner = self.file_owner
        if owner is None:
            return argv
        uid, gid = owner
        drop = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        stage = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
        stage += [_STAGE_SCRIPT, "sh"]
        stage += [*(str(f) for f in (group.procs_files if group else ())), "--"]
        for mode, src, target in staged:
            stage += [mode, str(src), str(target)]
        return [*stage, "--", *drop, *argv]

    # -- running ---------------------------------------------------------------------------

    def _ensure_egress(self) -> None:
        if not self.network or self._egress is not None or self.bwrap is None:
            return
        hosts = self.network if isinstance(self.network, tuple) else None
        nets = tuple(n.strip() for n in self.settings.egress_allowed_networks.split(",") if n)
        proxy = egress.EgressProxy(
            EgressPolicy(hosts=hosts, extra_allowed_networks=nets),
            self._stage / "proxy",
            sandbox_uid=self.file_owner[0] if self.file_owner else None,
        )
        try:
            proxy.start()
        except egress.EgressUnavailable as exc:
            raise SandboxUnavailable(f"sandbox.network is on, but {exc}") from None
        self._egress = proxy

    def run(
        self,
        command: str,
        timeout: float | None = None,
        *,
        extra: Extra | None = None,
        watch: Callable[[], str | None] | None = None,
        on_output: Callable[[bytes], object] | None = None,
    ) -> Result:
        """Run ``command`` in the sandbox. ``extra``: what this command gets beyond the
        sandbox's own; ``watch``: asked about once a second, a sentence kills the command
        (a cancel, a stall); ``on_output``: each chunk of its output as it comes."""
        self._extra = extra or Extra()
        try:
            return self._run(command, timeout, watch, on_output)
        finally:
            self._extra = Extra()

    def _run(
        self,
        command: str,
        timeout: float | None,
        watch: Callable[[], str | None] | None,
        on_output: Callable[[bytes], object] | None,
    ) -> Result:
        limit = timeout or self.timeout
        if "\0" in command or len(command.encode(errors="replace")) > MAX_COMMAND:
            why = "contains a NUL byte" if "\0" in command else f"is over {MAX_COMMAND} bytes"
            return Result(126, f"[loopbot: not run: the command {why}; write a script file]", 0)
        self._ensure_egress()
        started = time.monotonic()
        env = {**_SAFE_ENV, "PATH": _PATH} if self.bwrap is None else {"PATH": _PATH}
        group = None
        if self.bwrap is not None and self.file_owner is not None:
            group = cgroups.create(self.limits.memory_bytes, self.limits.processes)
        program = seccomp_program() if self.bwrap is not None else None
        fd = memfd(program) if program is not None else None
        home = self._extra.home if self.bwrap is not None else None
        info_r, info_w = os.pipe() if home is not None else (None, None)
        out = HeadTail(self.max_output)
        become_subreaper()
        reap_orphans()  # an orphan of the command before, which died after it ended
        unreachable = None
        try:
            proc = subprocess.Popen(
                self._argv(command, fd, group, info_w),
                stdin=subprocess.PIPE if home is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=self.worktree if self.bwrap is None else "/",
                env=env,
                start_new_session=True,
                pass_fds=tuple(f for f in (fd, info_w) if f is not None),
            )
            for passed in (fd, info_w):
                if passed is not None:
                    os.close(passed)
            fd = info_w = None
            if home is not None and info_r is not None:
                try:
                    early = self._meet(proc, info_r, home, started + limit)
                except HomeUnreachable as exc:
                    kill_group(proc)
                    unreachable, early = str(exc), b""
                out.feed(early)
                if on_output is not None and early:
                    on_output(early)

            def watched() -> str | None:
                return (watch() if watch is not None else None) or self.worktree_problem()

            timed_out, over = pump(proc, out, started + limit, watched, on_output)
        finally:
            for left in (fd, info_r, info_w):
                if left is not None:
                    os.close(left)
            if group is not None:
                group.remove()
        reap_orphans()
        seconds = time.monotonic() - started
        output = out.text()
        if timed_out:
            output += f"\n[loopbot: command timed out after {limit:.0f}s and was killed]"
        if over is not None:
            output += f"\n[loopbot: command killed: {over}]"
        if unreachable is not None:
            return Result(126, f"[loopbot: not run: {unreachable}]", seconds)
        code = 124 if timed_out else (137 if over else proc.returncode)
        return Result(code, output, seconds, timed_out, out.truncated, over)

    def _meet(
        self, proc: subprocess.Popen[bytes], info: int, home: HomeLink, deadline: float
    ) -> bytes:
        """Wait for the sandbox to say it is set up (``_READY``, before anything of the
        command runs), seed its HOME from the harness through ``/proc/<pid>/root`` and let
        it go on. Returns what it printed around its ready line. A sandbox that never says
        it (bwrap failed) is not waited for: its stdin closes, and it exits."""
        assert proc.stdout is not None and proc.stdin is not None
        seen = b""
        out = proc.stdout.fileno()
        # bwrap's set-up takes milliseconds; one stuck is not waited for all the command's
        # time limit (nothing else is watched meanwhile: a cancel is not).
        deadline = min(deadline, time.monotonic() + READY_WITHIN)
        while _READY not in seen and len(seen) < 1 << 16:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                break
            chunk = os.read(out, 1 << 16)
            if not chunk:
                break
            seen += chunk
        if _READY in seen:
            pid = _child_pid(info, deadline)
            if pid is None:
                raise HomeUnreachable(0, "the sandbox's HOME: bwrap did not say its pid")
            home.reach(pid)
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(b"go\n")
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        before, _, after = seen.partition(_READY)
        return before + after

    def close(self) -> None:
        """Stop the egress proxy and remove the staging directory."""
        if self._egress is not None:
            self._egress.stop()
            self._egress = None
        self._cleanup()
        reap_orphans()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
