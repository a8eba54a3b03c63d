"""The sandbox's network egress, for real: squid and socat on the host, a bwrap sandbox
with its own network namespace, HTTP servers and a Redis on the host's loopback.

127.0.0.2 stands in for a public package index: the tests allow it with
``extra_allowed_networks``. Everything else on 127.0.0.0/8 stands for the host's own
services (Redis, the worker), which the sandbox must never reach. No test sends anything
off this machine: squid resolves names from a hosts file of ours, asks 127.0.0.1 for
anything else, and connects from 127.0.0.1 (``tcp_outgoing_address``), which the kernel
refuses to route anywhere but loopback, so even a broken ACL could not leak.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from bot.standins.redis_server import RedisServer
from bot.standins.serving import run_in_thread
from jobs.sandbox import egress, egress_policy
from jobs.sandbox.egress import (
    PROXY_ENV,
    SANDBOX_SOCKET,
    EgressProxy,
    EgressUnavailable,
    availability_problem,
    sandbox_prelude,
)
from jobs.sandbox.egress_policy import EgressPolicy, policy_from_setting
from tests.helpers import ROOT

BWRAP = shutil.which("bwrap")
IS_ROOT = os.geteuid() == 0
needs_tools = pytest.mark.skipif(
    availability_problem() is not None or BWRAP is None or shutil.which("curl") is None,
    reason=f"needs squid, socat, bwrap and curl ({availability_problem()})",
)
needs_root = pytest.mark.skipif(not IS_ROOT, reason="switches to other uids")


def _as(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


AS_NOBODY = _as(65534)
AS_12345 = _as(12345)


# -- the policy, no processes ----------------------------------------------------------------


def test_host_list_is_validated_and_normalised() -> None:
    policy = EgressPolicy(hosts=("PyPI.org.", ".pythonhosted.org", "files.pythonhosted.org"))
    # squid refuses a list where a .suffix entry covers another entry, so those go.
    assert policy.hosts == (".pythonhosted.org", "pypi.org")
    for bad in (
        "pypi.org\nhttp_access allow all",  # a new line would be a new squid directive
        "pypi.org all",
        "https://pypi.org",
        "pypi.org:443",
        "[::1]",
        "",
        "-n",
    ):
        with pytest.raises(ValueError):
            EgressPolicy(hosts=(bad,))
    with pytest.raises(ValueError):
        EgressPolicy(hosts="pypi.org")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        EgressPolicy(extra_allowed_networks=("10.0.0.0/8 all",))
    with pytest.raises(ValueError):
        EgressPolicy(http_ports=(0,))


def test_extra_networks_are_carved_out_of_the_deny_list() -> None:
    blocked = EgressPolicy(extra_allowed_networks=("127.0.0.2/32", "fd00::/8")).blocked_networks()
    as_text = {str(n) for n in blocked}
    assert "127.0.0.0/8" not in as_text and "127.0.0.0/31" in as_text
    assert "127.0.0.3/32" in as_text and "169.254.0.0/16" in as_text
    assert "fc00::/8" in as_text and "fc00::/7" not in as_text
    covers = [n for n in blocked if n.version == 4 and n.overlaps(_net("127.0.0.2/32"))]
    assert covers == []


def _net(text: str) -> egress_policy.Network:
    import ipaddress

    return ipaddress.ip_network(text)


def test_policy_from_loop_yml_setting() -> None:
    assert policy_from_setting(False) is None
    assert policy_from_setting(True) == EgressPolicy(hosts=None)
    assert policy_from_setting(["pypi.org"], extra_allowed_networks=["10.1.0.0/16"]) == (
        EgressPolicy(hosts=("pypi.org",), extra_allowed_networks=("10.1.0.0/16",))
    )


def test_missing_tools_are_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(egress, "_which", lambda name: None if name == "squid" else "/x")
    problem = availability_problem()
    assert problem is not None and "squid" in problem and "apt-get install squid" in problem
    with pytest.raises(EgressUnavailable, match="squid"):
        EgressProxy(EgressPolicy(), tmp_path / "run").start()


def test_prelude_is_posix_sh() -> None:
    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("dash is not installed")
    subprocess.run([dash, "-n", "-c", sandbox_prelude()], check=True)
    assert "[[" not in sandbox_prelude() and "0C38" in sandbox_prelude()


# -- fixtures: servers on the host's loopback, the proxy, the sandbox -----------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        address = self.server.server_address
        body = f"hello from {address[0] if isinstance(address, tuple) else address}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Server:
    def __init__(self, host: str) -> None:
        self.httpd = http.server.ThreadingHTTPServer((host, 0), _Recorder)
        self.httpd.seen = []  # type: ignore[attr-defined]
        self.port: int = self.httpd.server_address[1]
        run_in_thread(self.httpd, "egress-test-server")

    @property
    def seen(self) -> list[str]:
        return self.httpd.seen  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def index() -> Iterator[Server]:
    """The stand-in for a public package index."""
    server = Server("127.0.0.2")
    yield server
    server.httpd.shutdown()


@pytest.fixture(scope="module")
def host_service() -> Iterator[Server]:
    """A service on the host's loopback that the sandbox must never reach."""
    server = Server("127.0.0.1")
    yield server
    server.httpd.shutdown()


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # Not under pytest's tmp_path: /tmp/pytest-of-root is 0700, and squid runs as `proxy`.
    path = Path(tempfile.mkdtemp(prefix="loopbot-egress-test-"))
    path.chmod(0o711)
    yield path / "run"
    shutil.rmtree(path, ignore_errors=True)


class LocalOnlyProxy(EgressProxy):
    """The real proxy with three test-only directives (see the module docstring)."""

    def squid_config(self) -> str:
        hosts = self.run_dir.parent / "hosts"
        hosts.write_text(
            "127.0.0.1 localhost pypi.example\n"  # a public-looking name on loopback
            "::1 localhost\n"
            "127.0.0.2 mirror.example\n"
        )
        hosts.chmod(0o644)
        return super().squid_config() + (
            f"hosts_file {hosts}\n"
            "dns_nameservers 127.0.0.1\n"
            "tcp_outgoing_address 127.0.0.1\n"
            "tcp_outgoing_address ::1\n"
        )


@contextlib.contextmanager
def started(policy: EgressPolicy, run_dir: Path, **kw: int) -> Iterator[EgressProxy]:
    with LocalOnlyProxy(policy, run_dir, **kw) as proxy:
        yield proxy


def sandbox(
    proxy: EgressProxy | None,
    script: str,
    *,
    uid: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under bwrap with only its own loopback, the prelude first."""
    assert BWRAP is not None
    argv = []
    if uid is not None:
        argv += _as(uid)
    argv += [
        BWRAP,
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--unshare-all",
        "--unshare-net",
        "--die-with-parent",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
    ]
    if proxy is not None:
        argv += ["--ro-bind", str(proxy.socket_path), SANDBOX_SOCKET]
    for k, v in {**(PROXY_ENV if proxy else {}), **(env or {})}.items():
        argv += ["--setenv", k, v]
    argv += ["/bin/sh", "-c", f"{sandbox_prelude()}\n{script}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


# Inside the sandbox: ask the proxy for each target, by hand (curl would normalise odd
# IPv4 spellings before squid sees them). One JSON line per target.
ASK = r"""
import json, socket, sys, time
for first in sys.argv[1:]:
    started = time.monotonic()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(first.encode() + b"\r\nHost: x\r\n\r\n")
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        data += b"TIMEOUT"
    head = data.split(b"\r\n\r\n")[0].decode("latin-1").splitlines() or [""]
    error = [h.split(":", 1)[1].split()[0] for h in head if h.lower().startswith("x-squid-error:")]
    print(json.dumps({"ask": first, "status": head[0], "error": error[0] if error else None,
                      "seconds": time.monotonic() - started}))
"""


def ask(proxy: EgressProxy, *first_lines: str) -> list[dict[str, object]]:
    args = " ".join(f"'{line}'" for line in first_lines)
    r = sandbox(proxy, f'python3 -c "$ASK" {args}', env={"ASK": ASK})
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.fixture(scope="module")
def bwrap_works() -> None:
    if BWRAP is None:
        pytest.skip("bwrap is not installed")
    r = sandbox(None, "true")
    if r.returncode != 0:
        pytest.skip(f"bwrap cannot create namespaces here: {r.stderr.strip()}")


# -- the path out works, for allowed hosts only ----------------------------------------------


@needs_tools
def test_allowed_host_is_reached_through_the_proxy(
    bwrap_works: None, run_dir: Path, index: Server
) -> None:
    policy = EgressPolicy(
        hosts=("127.0.0.2", "mirror.example"),
        extra_allowed_networks=("127.0.0.2/32",),
        http_ports=(80, 443, index.port),
        connect_ports=(443, index.port),
    )
    with started(policy, run_dir) as proxy:
        assert proxy.startup_seconds is not None and proxy.startup_seconds < 2
        url = f"http://127.0.0.2:{index.port}"
        r = sandbox(
            proxy,
            f"curl -sS -m 5 {url}/curl && echo"
            f" && curl -sS -m 5 -p {url}/tunnel && echo"  # -p: through CONNECT, like https
            f" && curl -sS -m 5 http://mirror.example:{index.port}/by-name && echo"
            f" && python3 -c \"import urllib.request as u; print(u.urlopen('{url}/py').read())\"",
        )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("hello from 127.0.0.2") == 4, r.stdout
    assert index.seen[-4:] == ["/curl", "/tunnel", "/by-name", "/py"]


@needs_tools
def test_loopback_is_refused_even_by_allowed_names(
    bwrap_works: None, run_dir: Path, index: Server, host_service: Server
) -> None:
    port = host_service.port
    policy = EgressPolicy(
        hosts=("127.0.0.2", "127.0.0.1", "localhost", "pypi.example"),
        extra_allowed_networks=("127.0.0.2/32",),
        http_ports=(80, 443, port),
        connect_ports=(443, port),
    )
    with started(policy, run_dir) as proxy:
        answers = ask(
            proxy,
            f"GET http://127.0.0.1:{port}/raw-ip HTTP/1.1",
            f"GET http://localhost:{port}/localhost HTTP/1.1",
            f"GET http://pypi.example:{port}/resolves-to-loopback HTTP/1.1",
            f"CONNECT 127.0.0.1:{port} HTTP/1.1",
            f"CONNECT pypi.example:{port} HTTP/1.1",
        )
        # curl, as a tool would: a 403 from the proxy, not a timeout.
        r = sandbox(
            proxy,
            f"curl -sS -m 5 --noproxy '' -o /dev/null -w '%{{http_code}}' "
            f"http://localhost:{port}/curl",
        )
    for answer in answers:
        assert answer["status"] == "HTTP/1.1 403 Forbidden", answer
        assert answer["error"] == "ERR_LOOPBOT_ADDRESS", answer
    assert r.stdout == "403", r.stdout + r.stderr
    assert host_service.seen == []


@needs_tools
def test_redis_on_the_host_is_unreachable(
    bwrap_works: None, run_dir: Path, redis_server: RedisServer
) -> None:
    """The incident: the agent reached Redis on 127.0.0.1 and planted a job."""
    port = redis_server.port
    conn = Redis(port=port)
    before = int(conn.info("stats")["total_connections_received"])
    policy = EgressPolicy(hosts=None, http_ports=(80, 443, port), connect_ports=(443, port))
    with started(policy, run_dir) as proxy:
        answers = ask(
            proxy,
            f"CONNECT 127.0.0.1:{port} HTTP/1.1",
            f"CONNECT localhost:{port} HTTP/1.1",
            f"GET http://127.0.0.1:{port}/ HTTP/1.1",
        )
        plant = (
            f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2);"
            " s.sendall(b'SET planted 1\\r\\n'); print(s.recv(100))"
        )
        direct = sandbox(proxy, 'python3 -c "$PLANT"', env={"PLANT": plant})
        cli = sandbox(proxy, f"redis-cli -h 127.0.0.1 -p {port} SET planted 1")
    assert [a["error"] for a in answers] == ["ERR_LOOPBOT_ADDRESS"] * 3, answers
    assert direct.returncode != 0 and "ConnectionRefusedError" in direct.stderr
    assert "OK" not in cli.stdout and "refused" in cli.stdout + cli.stderr
    after = int(conn.info("stats")["total_connections_received"])
    assert after == before  # our client reuses its one connection: nobody else came
    assert conn.get("planted") is None
    conn.close()


@needs_tools
def test_host_not_on_the_allowlist_is_refused_without_a_lookup(
    bwrap_works: None, run_dir: Path, index: Server
) -> None:
    policy = EgressPolicy(
        hosts=("127.0.0.2",),
        extra_allowed_networks=("127.0.0.2/32",),
        http_ports=(80, 443, index.port),
    )
    seen = len(index.seen)
    with started(policy, run_dir) as proxy:
        answers = ask(
            proxy,
            "GET http://example.com/ HTTP/1.1",
            "GET http://sub.127.0.0.2.nip.io/ HTTP/1.1",
            "CONNECT pypi.org:443 HTTP/1.1",
            f"GET http://mirror.example:{index.port}/ HTTP/1.1",  # allowed address, other name
        )
        r = sandbox(proxy, "curl -sS -m 5 -o /dev/null https://pypi.org/simple/ 2>&1")
    for answer in answers:
        assert answer["error"] == "ERR_LOOPBOT_HOST", answer
        assert float(str(answer["seconds"])) < 1, answer
    assert "403" in r.stdout, r.stdout
    assert len(index.seen) == seen


@needs_tools
def test_any_public_host_still_refuses_private_addresses(bwrap_works: None, run_dir: Path) -> None:
    targets = [
        "127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",  # cloud metadata
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "[::1]",
        "[fe80::1]",
        "[fd00:ec2::254]",  # AWS metadata over IPv6
        "[::ffff:127.0.0.1]",
        "[::ffff:a9fe:a9fe]",  # 169.254.169.254, mapped
        "[64:ff9b::a00:1]",  # 10.0.0.1 through NAT64
        "2130706433",  # 127.0.0.1 in other spellings
        "0x7f000001",
        "0177.0.0.1",
        "127.1",
        "localhost",
    ]
    with started(EgressPolicy(hosts=None), run_dir) as proxy:
        answers = ask(
            proxy,
            *(f"GET http://{t}/ HTTP/1.1" for t in targets),
            "CONNECT 169.254.169.254:443 HTTP/1.1",
            "CONNECT 10.0.0.1:443 HTTP/1.1",
        )
    assert len(answers) == len(targets) + 2
    for answer in answers:
        # squid's own refusal, by ACL, before any connection: no timeout, no connect error.
        assert answer["status"] == "HTTP/1.1 403 Forbidden", answer
        assert answer["error"] == "ERR_LOOPBOT_ADDRESS", answer
        assert float(str(answer["seconds"])) < 1, answer


@needs_tools
def test_only_http_and_https_ports(bwrap_works: None, run_dir: Path) -> None:
    with started(EgressPolicy(hosts=None), run_dir) as proxy:
        answers = ask(
            proxy,
            "CONNECT example.com:22 HTTP/1.1",
            "GET http://example.com:6379/ HTTP/1.1",
            "GET ftp://example.com/ HTTP/1.1",
            "GET https://example.com/ HTTP/1.1",
        )
        manager = ask(proxy, f"GET http://127.0.0.1:{proxy.port}/squid-internal-mgr/info HTTP/1.1")
    assert [a["error"] for a in answers] == ["ERR_LOOPBOT_PORT"] * 4, answers
    assert manager[0]["status"] == "HTTP/1.1 403 Forbidden"


@needs_tools
def test_sandbox_has_no_direct_route(
    bwrap_works: None, run_dir: Path, index: Server, host_service: Server
) -> None:
    policy = EgressPolicy(hosts=("127.0.0.2",), extra_allowed_networks=("127.0.0.2/32",))
    targets = [("127.0.0.1", host_service.port), ("127.0.0.2", index.port), ("10.0.0.1", 80)]
    probe = (
        "import socket\n"
        f"for host, port in {targets!r}:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=1); print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, e)\n"
    )
    seen = len(index.seen)
    with started(policy, run_dir) as proxy:
        r = sandbox(proxy, 'python3 -c "$PROBE"', env={"PROBE": probe})
    assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3, r.stdout + r.stderr
    assert "Network is unreachable" in r.stdout  # 10.0.0.1: no route at all
    assert host_service.seen == [] and len(index.seen) == seen


@needs_tools
def test_without_the_socket_there_is_no_network(bwrap_works: None, index: Server) -> None:
    r = sandbox(None, f"curl -sS -m 2 -x http://127.0.0.1:3128 http://127.0.0.2:{index.port}/")
    assert r.returncode != 0
    assert "no network proxy in this sandbox" in r.stderr


# -- who may use the socket, who runs squid, and cleaning up -------------------------------


@needs_tools
@needs_root
def test_socket_belongs_to_the_sandbox_uid_only(
    bwrap_works: None, run_dir: Path, index: Server
) -> None:
    policy = EgressPolicy(
        hosts=("127.0.0.2",),
        extra_allowed_networks=("127.0.0.2/32",),
        http_ports=(80, 443, index.port),
    )
    with started(policy, run_dir, sandbox_uid=65534) as proxy:
        st = proxy.socket_path.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o600)
        for pid in proxy.pids:  # squid and socat never run as root
            uids = Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[:4]
            assert "0" not in uids
        r = sandbox(proxy, f"curl -sS -m 5 http://127.0.0.2:{index.port}/as-nobody", uid=65534)
        other = subprocess.run(
            [*AS_12345, "socat", "-u", "/dev/null", f"UNIX-CONNECT:{proxy.socket_path}"],
            capture_output=True,
            text=True,
        )
    assert r.returncode == 0 and "hello from 127.0.0.2" in r.stdout, r.stdout + r.stderr
    assert other.returncode != 0 and "Permission denied" in other.stderr


@needs_tools
@needs_root
def test_works_when_loopbot_is_not_root(run_dir: Path) -> None:
    """The whole proxy started by an unprivileged user (uid 65534)."""
    run_dir.parent.chmod(0o777)
    code = (
        "import socket; from pathlib import Path; from jobs.sandbox.egress import *\n"
        "from jobs.sandbox.egress_policy import EgressPolicy\n"
        f"p = EgressProxy(EgressPolicy(hosts=('pypi.org',)), Path('{run_dir}'))\n"
        "p.start()\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(str(p.socket_path))\n"
        "s.sendall(b'GET http://10.0.0.1/ HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
        "print(s.recv(200).decode().splitlines()[0], p.startup_seconds)\n"
        "p.stop()\n"
    )
    r = subprocess.run(
        [*AS_NOBODY, "/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("HTTP/1.1 403 Forbidden"), r.stdout


@needs_tools
def test_stop_leaves_nothing_behind(run_dir: Path) -> None:
    proxy = LocalOnlyProxy(EgressPolicy(hosts=None), run_dir)
    proxy.start()
    held = socket.socket(socket.AF_UNIX)
    held.connect(str(proxy.socket_path))  # socat forks a child for it
    time.sleep(0.1)
    groups = set(proxy.pids)
    members = [pid for pid in _all_pids() if _pgid(pid) in groups]
    assert len(members) >= 3  # squid, the socat listener and its child
    proxy.stop()
    proxy.stop()  # idempotent
    held.close()
    alive = [pid for pid in members if _alive(pid)]
    assert alive == []
    assert not proxy.socket_path.exists()
    assert list(Path("/dev/shm").glob(f"{proxy.service}-*")) == []


@needs_tools
def test_two_proxies_at_once_stay_apart(run_dir: Path) -> None:
    """One proxy per loop, several loops per worker: separate ports, shm and sockets."""
    nothing = LocalOnlyProxy(EgressPolicy(hosts=()), run_dir.parent / "a")
    anything = LocalOnlyProxy(EgressPolicy(hosts=None), run_dir.parent / "b")
    with nothing, anything:
        assert nothing.port != anything.port and nothing.service != anything.service
        refused = _ask_socket(nothing.socket_path, "GET http://example.com/ HTTP/1.1")
        private = _ask_socket(anything.socket_path, "GET http://10.0.0.1/ HTTP/1.1")
    assert "X-Squid-Error: ERR_LOOPBOT_HOST" in refused
    assert "X-Squid-Error: ERR_LOOPBOT_ADDRESS" in private


@needs_tools
def test_segments_of_a_killed_squid_are_removed_at_the_next_start(run_dir: Path) -> None:
    crashed = LocalOnlyProxy(EgressPolicy(hosts=()), run_dir.parent / "a")
    crashed.start()
    squid = crashed.pids[0]
    os.kill(squid, 9)  # the worker died: stop() never ran
    assert crashed._squid is not None
    crashed._squid.wait(5)
    assert list(Path("/dev/shm").glob(f"{crashed.service}-*"))
    with LocalOnlyProxy(EgressPolicy(hosts=()), run_dir.parent / "b") as alive:
        assert list(Path("/dev/shm").glob(f"{crashed.service}-*")) == []
        assert list(Path("/dev/shm").glob(f"{alive.service}-*"))
    crashed.stop()


def _ask_socket(path: Path, first_line: str) -> str:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(first_line.encode() + b"\r\nHost: x\r\n\r\n")
        return s.recv(4096).decode("latin-1")


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for a reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@needs_tools
def test_run_dir_must_be_reachable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    if not IS_ROOT:
        pytest.skip("as root only: squid then runs as another user")
    with pytest.raises(EgressUnavailable, match="not searchable"):
        EgressProxy(EgressPolicy(), locked / "run").start()
