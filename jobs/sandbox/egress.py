"""The sandbox's only way out to the network: a filtering HTTP proxy on the host.

A sandbox always has its own network namespace (bwrap ``--unshare-net``): its own
loopback and nothing else, so it cannot reach Redis, the worker's other services or a
cloud metadata service. When a repository allows network access (``sandbox.network`` in
``.github/loop.yml``), the loop starts one :class:`EgressProxy`:

* **squid** on the host, with a private configuration in ``run_dir``, listening on
  127.0.0.1 at a free port. Its ``dst`` ACL checks the address a request *resolves to*:
  loopback, private, link-local (metadata), carrier-grade NAT, multicast and reserved
  ranges are refused before squid connects, so a public-looking name that resolves to
  127.0.0.1 or 10.x is refused too, and so is a raw IP. Its ``dstdomain`` ACL is the
  host allowlist. Only ``CONNECT`` to port 443 and plain ``http://`` to ports 80 and 443
  pass; nothing is cached; ``Via`` and ``X-Forwarded-For`` are not sent.
* **socat** on the host, bridging a Unix socket (``socket_path``) to squid's port. The
  socket is the sandbox's only link: it is bind-mounted at :data:`SANDBOX_SOCKET`, and its
  mode (0600, owned by the sandbox's uid) keeps every other local user off it.
* inside the sandbox, :func:`sandbox_prelude` starts a second socat listening on the
  sandbox's own 127.0.0.1:3128 and forwarding to that socket, and :data:`PROXY_ENV` points
  ``http_proxy``/``https_proxy`` at it. Tools that honour those variables (curl, pip,
  git over https, npm, Python's urllib and requests) get out through squid; tools that
  ignore them get no network at all: it fails closed. No DNS is needed inside: squid
  resolves names.

When loopbot runs as root, squid and the host-side socat run as the ``proxy`` user
(``nobody`` when it does not exist), never as root: squid is started already
unprivileged rather than left to drop privileges itself. When loopbot runs as an
unprivileged user they run as that user. Either way they get ``PR_SET_PDEATHSIG`` (via
``setpriv``), so they die with the process that started them: call :meth:`EgressProxy.start`
from the thread that lives as long as the loop (Linux sends the signal when the *thread*
that forked them exits).

What the proxy lets through, and the host allowlist's syntax: ``jobs.sandbox.egress_policy``.

Residual risk, documented rather than hidden: squid resolves a name once for the ACL and
looks it up again, from its own cache, when it connects. Every answer is cached for at
least ``negative_dns_ttl`` (one minute), so a DNS-rebinding attacker (a name whose answer
flips from a public address to 127.0.0.1) would have to make the cache entry expire in
the moment between the two look-ups. With a host allowlist this needs control of an
allowlisted domain's DNS.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from types import TracebackType

from jobs.sandbox.egress_policy import EgressPolicy

SANDBOX_SOCKET = "/run/loopbot/egress.sock"
"""Where the sandbox sees the proxy's Unix socket (bind-mount :attr:`EgressProxy.socket_path`
there, read-only is fine)."""

SANDBOX_PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"

PROXY_ENV: dict[str, str] = {
    "http_proxy": PROXY_URL,
    "https_proxy": PROXY_URL,
    "HTTP_PROXY": PROXY_URL,
    "HTTPS_PROXY": PROXY_URL,
    # The sandbox's loopback is its own (its own network namespace), so a test server the
    # command starts inside stays reachable directly; nothing else bypasses the proxy.
    "no_proxy": "localhost,127.0.0.1,::1",
    "NO_PROXY": "localhost,127.0.0.1,::1",
}
"""Environment variables for commands in a sandbox with network access."""

_SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_START_TIMEOUT = 10.0


class EgressUnavailable(RuntimeError):
    """The proxy cannot run here (a tool is missing, or it failed to start)."""


def _which(name: str) -> str | None:
    # squid lives in /usr/sbin, which an unprivileged user's PATH often lacks.
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN_PATH}")


def availability_problem() -> str | None:
    """Why sandboxes cannot have network access here, or None when they can."""
    missing = [n for n in ("squid", "socat", "setpriv") if _which(n) is None]
    if not missing:
        return None
    packages = {"squid": "squid", "socat": "socat", "setpriv": "util-linux"}
    return (
        f"{' and '.join(missing)} not installed: repositories that set sandbox.network "
        "cannot get network access (their commands will fail). Install with: apt-get "
        f"install {' '.join(packages[m] for m in missing)}"
    )


def sandbox_prelude() -> str:
    """POSIX sh run inside the sandbox before the command: the proxy on 127.0.0.1:3128.
    Use as ``sandbox_prelude() + "\\n" + command`` (see ``relay_prelude``)."""
    return relay_prelude(SANDBOX_SOCKET, SANDBOX_PROXY_PORT, "network proxy", "no network")


def relay_prelude(socket_path: str, port: int, what: str, without: str) -> str:
    """POSIX sh that relays 127.0.0.1:``port`` inside the sandbox to the Unix socket at
    ``socket_path`` (bound in from the host).

    Starts socat in the background and waits (at most about 2 s, by reading
    /proc/net/tcp, without forking a process per check) until it listens. When the socket
    or socat is missing, or socat does not come up, it says so on stderr (``what`` did not
    start: ``without``) and carries on: the command then cannot reach it (fails closed).
    """
    hexport = f"{port:04X}"
    return f"""\
if [ -S {socket_path} ] && command -v socat >/dev/null 2>&1; then
  socat TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr \
UNIX-CONNECT:{socket_path} </dev/null >/dev/null 2>&1 &
  _lb_pid=$! _lb_i=0 _lb_up=
  while [ "$_lb_i" -lt 150 ]; do
    while read -r _lb_sl _lb_local _lb_rem _lb_st _lb_rest; do
      if [ "$_lb_local" = 0100007F:{hexport} ] && [ "$_lb_st" = 0A ]; then _lb_up=1; break; fi
    done < /proc/net/tcp
    [ -n "$_lb_up" ] && break
    kill -0 "$_lb_pid" 2>/dev/null || break
    sleep 0.01
    _lb_i=$((_lb_i + 1))
  done
  [ -n "$_lb_up" ] || echo "loopbot: the {what} did not start; {without}" >&2
  unset _lb_pid _lb_i _lb_up _lb_sl _lb_local _lb_rem _lb_st _lb_rest
else
  echo "loopbot: no {what} in this sandbox (socket or socat missing)" >&2
fi"""


_ERROR_PAGES = {
    "ERR_LOOPBOT_ADDRESS": (
        "loopbot sandbox: %H is (or resolves to) a loopback, private, link-local or "
        "otherwise non-public address; the sandbox may not reach it."
    ),
    "ERR_LOOPBOT_HOST": (
        "loopbot sandbox: %H is not in this repository's network allowlist "
        "(sandbox.network in .github/loop.yml)."
    ),
    "ERR_LOOPBOT_PORT": (
        "loopbot sandbox: only https (CONNECT to port 443) and plain http to ports 80 "
        "and 443 may leave the sandbox; %M %U was refused."
    ),
}


class EgressProxy:
    """One filtering proxy (squid + a socat bridge to a Unix socket) for one loop.

    ``run_dir`` holds squid's configuration, its logs (``cache.log``, ``access.log``) and
    the socket; it is created if needed. Every directory above it must be searchable by
    the user squid runs as (``proxy`` when loopbot is root) and by ``sandbox_uid`` (bwrap
    opens the socket as that user), so a directory under /tmp or /run works and one under
    a 0700 data directory does not. ``sandbox_uid`` (default: loopbot's own uid) is the
    host uid the sandbox's processes run as: the only uid that may connect to the socket.
    """

    def __init__(
        self, policy: EgressPolicy, run_dir: Path, *, sandbox_uid: int | None = None
    ) -> None:
        self.policy = policy
        self.run_dir = Path(os.path.abspath(run_dir))
        if not re.fullmatch(r"[A-Za-z0-9/._+-]+", str(self.run_dir)):
            raise ValueError(f"egress run directory with unusual characters: {run_dir!r}")
        self.sandbox_uid = os.geteuid() if sandbox_uid is None else sandbox_uid
        self.service = f"loopbot{secrets.token_hex(4)}"  # squid's shm segments are named after it
        self.port: int | None = None
        self.startup_seconds: float | None = None
        self._squid: subprocess.Popen[bytes] | None = None
        self._socat: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("proxy")
            except KeyError:
                user = pwd.getpwnam("nobody")
            self._uid, self._gid = user.pw_uid, user.pw_gid
        else:
            self._uid, self._gid = os.geteuid(), os.getegid()
            if self.sandbox_uid != self._uid:
                raise EgressUnavailable(
                    f"loopbot runs as uid {self._uid}, so it cannot give the proxy's socket "
                    f"to the sandbox's uid {self.sandbox_uid}"
                )

    @property
    def socket_path(self) -> Path:
        """Host path of the Unix socket to bind-mount at :data:`SANDBOX_SOCKET`."""
        return self.run_dir / "egress.sock"

    @property
    def pids(self) -> list[int]:
        """Process ids of the squid and socat processes (the socat listener; its
        per-connection children share its process group)."""
        return [p.pid for p in (self._squid, self._socat) if p is not None]

    def __enter__(self) -> EgressProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        """Start squid and the socat bridge; return once both accept connections."""
        if self._squid is not None:
            raise RuntimeError("this EgressProxy is already started")
        problem = availability_problem()
        if problem:
            raise EgressUnavailable(problem)
        started = time.monotonic()
        _remove_stale_segments()
        self._prepare_run_dir()
        try:
            for attempt in range(3):  # another process may take the free port first
                self.port = _free_port()
                self._write_config()
                if self._start_squid(last_attempt=attempt == 2):
                    break
            self._start_socat()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def _prepare_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for uid, who in ((self._uid, "squid's user"), (self.sandbox_uid, "the sandbox's uid")):
            blocker = _unsearchable_ancestor(self.run_dir, uid)
            if blocker is not None:
                raise EgressUnavailable(
                    f"{blocker} is not searchable by {who} ({uid}); put the egress run "
                    "directory somewhere it is (under /tmp or /run, for instance)"
                )
        if os.geteuid() == 0:
            os.chown(self.run_dir, self._uid, self._gid)
        os.chmod(self.run_dir, 0o711)
        for stale in ("egress.sock", "squid.pid", "cache.log", "squid.out", "socat.out"):
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir / stale).unlink()
        errors = self.run_dir / "errors"
        if errors.exists():
            shutil.rmtree(errors)
        errors.mkdir(mode=0o755)
        templates = Path("/usr/share/squid/errors/templates")
        if templates.is_dir():  # the stock pages, for errors other than ours
            for page in templates.iterdir():
                (errors / page.name).symlink_to(page.resolve())
        for name, text in _ERROR_PAGES.items():
            (errors / name).write_text(
                f"<html><head><title>%c</title></head><body><p>{text}</p></body></html>\n"
            )
            (errors / name).chmod(0o644)

    def squid_config(self) -> str:
        """The squid.conf text (a method so tests can add directives)."""
        assert self.port is not None
        run = self.run_dir
        policy = self.policy
        blocked = " ".join(str(n) for n in policy.blocked_networks())
        lines = [
            f"http_port 127.0.0.1:{self.port}",
            "visible_hostname loopbot-egress",
            "httpd_suppress_version_string on",
            f"pid_filename {run}/squid.pid",
            f"cache_log {run}/cache.log",
            f"access_log stdio:{run}/access.log squid",
            "logfile_rotate 0",
            "strip_query_terms on",
            "coredump_dir none",
            "cache deny all",
            "cache_mem 0 MB",
            "shutdown_lifetime 0 seconds",
            "pinger_enable off",
            "forwarded_for delete",
            "via off",
            f"error_directory {run}/errors",
            "icp_port 0",
            "htcp_port 0",
            "snmp_port 0",
            "acl loopbot_client src 127.0.0.1/32",
            "acl loopbot_connect method CONNECT",
            "acl loopbot_http proto HTTP",
            f"acl loopbot_http_ports port {' '.join(map(str, policy.http_ports))}",
            f"acl loopbot_connect_ports port {' '.join(map(str, policy.connect_ports))}",
            f"acl loopbot_blocked dst {blocked}",
            "deny_info ERR_LOOPBOT_PORT loopbot_http",
            "deny_info ERR_LOOPBOT_PORT loopbot_http_ports",
            "deny_info ERR_LOOPBOT_PORT loopbot_connect_ports",
            "deny_info ERR_LOOPBOT_ADDRESS loopbot_blocked",
            "http_access deny !loopbot_client",
            "http_access deny manager",
            "http_access deny loopbot_connect !loopbot_connect_ports",
            "http_access deny !loopbot_connect !loopbot_http",
            "http_access deny !loopbot_connect !loopbot_http_ports",
        ]
        if policy.hosts is not None:
            if policy.hosts:
                lines.append(f"acl loopbot_hosts dstdomain -n {' '.join(policy.hosts)}")
                lines.append("deny_info ERR_LOOPBOT_HOST loopbot_hosts")
                lines.append("http_access deny !loopbot_hosts")
            else:
                lines.append("deny_info ERR_LOOPBOT_HOST all")
                lines.append("http_access deny all")
        lines += [
            "http_access deny loopbot_blocked",  # after the allowlist: no DNS for other names
            "http_access allow loopbot_client",
            "http_access deny all",
            "icp_access deny all",
            "htcp_access deny all",
            "snmp_access deny all",
        ]
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        conf = self.run_dir / "squid.conf"
        conf.write_text(self.squid_config())
        conf.chmod(0o644)

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        setpriv = _which("setpriv")
        assert setpriv is not None
        wrapper = [setpriv]
        if os.geteuid() == 0:
            wrapper += [f"--reuid={self._uid}", f"--regid={self._gid}", "--clear-groups"]
        wrapper += ["--no-new-privs", "--pdeathsig=KILL", "--"]
        with open(log, "ab") as out:
            if os.geteuid() == 0:
                os.fchown(out.fileno(), self._uid, self._gid)
            return subprocess.Popen(
                wrapper + argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.run_dir,
                env={"PATH": _SBIN_PATH, "LANG": "C.UTF-8"},
                start_new_session=True,
                umask=0o077,
            )

    def _start_squid(self, *, last_attempt: bool) -> bool:
        squid = _which("squid")
        assert squid is not None and self.port is not None
        conf = self.run_dir / "squid.conf"
        self._squid = proc = self._spawn(
            [squid, "-N", "-n", self.service, "-f", str(conf)], self.run_dir / "squid.out"
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                in_use = "Address already in use" in _tail(self.run_dir / "cache.log")
                self._squid = None
                if in_use and not last_attempt:
                    return False
                raise EgressUnavailable(f"squid exited at start:\n{self._logs()}")
            if _accepts(self.port) and "Accepting HTTP Socket" in _tail(self.run_dir / "cache.log"):
                return True
            time.sleep(0.005)
        raise EgressUnavailable(
            f"squid did not start within {_START_TIMEOUT:.0f}s:\n{self._logs()}"
        )

    def _start_socat(self) -> None:
        socat = _which("socat")
        assert socat is not None and self.port is not None
        sock = self.socket_path
        self._socat = proc = self._spawn(
            [
                socat,
                f"UNIX-LISTEN:{sock},fork,unlink-early,mode=600,backlog=128",
                f"TCP:127.0.0.1:{self.port},connect-timeout=10",
            ],
            self.run_dir / "socat.out",
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EgressUnavailable(f"socat exited at start:\n{self._logs()}")
            if _unix_accepts(sock):
                break
            time.sleep(0.002)
        else:
            raise EgressUnavailable(f"socat did not start within {_START_TIMEOUT:.0f}s")
        if os.geteuid() == 0 and self.sandbox_uid != self._uid:
            os.chown(sock, self.sandbox_uid, -1)
        os.chmod(sock, 0o600)

    def _logs(self) -> str:
        return "\n".join(
            _tail(self.run_dir / name, 2000) for name in ("squid.out", "cache.log", "socat.out")
        )

    # ------------------------------------------------------------------- stop

    def stop(self) -> None:
        """Kill squid and socat (and socat's per-connection children). Idempotent."""
        for attr in ("_socat", "_squid"):
            proc: subprocess.Popen[bytes] | None = getattr(self, attr)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            setattr(self, attr, None)
        # squid, killed, cannot remove its shared memory segments: they carry its name.
        for segment in glob.glob(f"/dev/shm/{self.service}-*"):
            with contextlib.suppress(OSError):
                os.unlink(segment)
        for leftover in ("egress.sock", "squid.pid"):
            with contextlib.suppress(OSError):
                (self.run_dir / leftover).unlink()


def _remove_stale_segments() -> None:
    """Remove the shared memory segments of loopbot squids that died without stop().

    Squid removes its segments when it exits normally, never when killed. stop() cleans
    up after its own; this catches a worker that died first (squid then gets SIGKILL)."""
    segments = glob.glob("/dev/shm/loopbot*-*.shm")
    if not segments:
        return
    running: set[bytes] = set()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = Path(cmdline).read_bytes().split(b"\0")
            running.update(args[i + 1] for i, a in enumerate(args[:-1]) if a == b"-n")
    for segment in segments:
        service = os.path.basename(segment).split("-", 1)[0]
        if re.fullmatch(r"loopbot[0-9a-f]{8}", service) and service.encode() not in running:
            with contextlib.suppress(OSError):
                os.unlink(segment)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _unix_accepts(path: Path) -> bool:
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def _tail(path: Path, limit: int = 20000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _unsearchable_ancestor(path: Path, uid: int) -> Path | None:
    """The first directory above ``path`` that ``uid`` may not search, if any."""
    if uid == 0:
        return None
    try:
        gids = set(os.getgrouplist(pwd.getpwuid(uid).pw_name, pwd.getpwuid(uid).pw_gid))
    except KeyError:
        gids = set()
    for parent in reversed(path.parents):
        st = parent.stat()
        if st.st_uid == uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in gids:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return parent
    return None
