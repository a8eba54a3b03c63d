"""Start a private redis-server on a free port (tests, benchmarks, ``loopbot demo``), or a
whole Sentinel set: a master, its replicas and the sentinels watching them."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from redis import Redis
from redis.exceptions import RedisError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """A private CA and a server certificate for 127.0.0.1 signed by it (PEM files)."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A fresh self-signed CA and a server certificate for 127.0.0.1 (tests only)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("loopbot test CA"))
        .issuer_name(name("loopbot test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    files.key.chmod(0o600)
    return files


class RedisServer:
    """A throwaway redis-server: no persistence, its own directory, killed on ``stop``.

    ``password``: the server requires it (``--requirepass``). ``tls``: the server speaks
    only TLS (no plain port), with the certificate in ``tls``; clients need not present
    one. ``url`` carries both, as ``REDIS_URL`` would.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        persist: bool = False,
        password: str | None = None,
        tls: TlsFiles | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.port = port or free_port()
        self.persist = persist  # an append-only file, so data survives restart()
        self.password = password
        self.tls = tls
        self.args = list(args)  # more redis-server options (after loopbot's, so they win)
        self.dir = Path(tempfile.mkdtemp(prefix="loopbot-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_with(self.password)

    def url_with(self, password: str | None) -> str:
        """The URL with another password (or none), e.g. to try a wrong one."""
        auth = f":{quote(password, safe='')}@" if password is not None else ""
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={quote(str(self.tls.ca))}"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            listen = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls.cert),
                "--tls-key-file",
                str(self.tls.key),
                "--tls-ca-cert-file",
                str(self.tls.ca),
                "--tls-auth-clients",
                "no",
            ]
        if self.password is not None:
            listen += ["--requirepass", self.password]
        self.proc = subprocess.Popen(
            [
                exe,
                *listen,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.persist else "no",
                "--appendfsync",
                "no",
                "--dir",
                str(self.dir),
                "--protected-mode",
                "no",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self.proc.returncode} (port {self.port})"
                    )
                try:
                    client.ping()
                    return self
                except RedisError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server, as when its machine goes away (its directory stays)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)
            self.proc = None

    def restart(self, down_for: float = 0.0) -> None:
        """Stop and start again on the same port (keys survive only with ``persist``)."""
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(5)
        self.proc = None
        time.sleep(down_for)
        self.start()


class SentinelSet:
    """A real Redis Sentinel deployment on 127.0.0.1: a master, ``replicas`` replicas and
    ``sentinels`` sentinels (``redis-server sentinel.conf --sentinel``), each on a free
    port, with sentinel timings short enough for tests (``down_after_ms``).

    Every node has the append-only file on and ``password`` (if any) as both its
    ``requirepass`` and its ``masterauth``, so a replica can become the master and the old
    master, restarted, can follow it. ``sentinel_password``: the sentinels' own.
    ``url`` is the ``redis+sentinel://`` URL for all of it, as ``REDIS_URL`` would be.
    """

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        master_name: str = "mymaster",
        password: str | None = None,
        sentinel_password: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        node_args: Sequence[str] = (),
    ) -> None:
        self.master_name = master_name
        self.password = password
        self.sentinel_password = sentinel_password
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.node_args = list(node_args)
        self.n_replicas = replicas
        self.nodes: dict[int, RedisServer] = {}  # by port; the first is the first master
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        # Each sentinel is told the others (and the replicas) up front, so the set is
        # ready at once instead of after their hello messages have gone round.
        self.sentinel_ids = {p: os.urandom(20).hex() for p in self.sentinel_ports}
        self.sentinel_procs: dict[int, subprocess.Popen[bytes]] = {}
        self.dir = Path(tempfile.mkdtemp(prefix="loopbot-sentinel-"))

    # -- addresses -------------------------------------------------------------------

    @property
    def hosts(self) -> str:
        """The sentinels as ``REDIS_SENTINELS`` lists them."""
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        query = (
            f"?sentinel_password={quote(self.sentinel_password, safe='')}"
            if self.sentinel_password is not None
            else ""
        )
        return f"redis+sentinel://{auth}{self.hosts}/{quote(self.master_name, safe='')}/0{query}"

    def node_url(self, port: int) -> str:
        return self.nodes[port].url

    def client(self, port: int) -> Redis:
        """A plain client of one node (not through the sentinels)."""
        return Redis.from_url(self.node_url(port), socket_connect_timeout=0.5, socket_timeout=5)

    def sentinel(self, port: int) -> Redis:
        return Redis(
            "127.0.0.1",
            port,
            password=self.sentinel_password,
            socket_connect_timeout=0.5,
            socket_timeout=2,
            decode_responses=True,
        )

    def master_port(self) -> int | None:
        """The master's port as a majority of the sentinels name it (None: no majority)."""
        seen: dict[int, int] = {}
        for port in self.sentinel_ports:
            try:
                with self.sentinel(port) as s:
                    addr = s.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                    )
            except RedisError:
                continue
            if addr:
                seen[int(addr[1])] = seen.get(int(addr[1]), 0) + 1
        best = max(seen.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] > len(self.sentinel_ports) // 2 else None

    def role(self, port: int) -> str | None:
        try:
            with self.client(port) as c:
                return str(c.execute_command("ROLE")[0].decode())
        except (RedisError, OSError):
            return None

    # -- life ------------------------------------------------------------------------

    def _node(self, port: int | None = None, replica_of: int | None = None) -> RedisServer:
        # No 5 s wait before a full sync (the default delay for diskless syncs).
        args = ["--appendfsync", "everysec", "--repl-diskless-sync-delay", "0", *self.node_args]
        if self.password is not None:
            args += ["--masterauth", self.password]
        if replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(replica_of)]
        node = RedisServer(port, persist=True, password=self.password, args=args)
        self.nodes[node.port] = node
        return node.start()

    def start(self) -> SentinelSet:
        try:
            master = self._node()
            for _ in range(self.n_replicas):
                self._node(replica_of=master.port)
            self.wait_in_sync(master.port)
            for port in self.sentinel_ports:
                self._start_sentinel(port, master.port)
            self.wait_settled(master.port)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, port: int, master_port: int) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        work = self.dir / f"sentinel-{port}"
        work.mkdir(exist_ok=True)
        name = self.master_name
        quorum = len(self.sentinel_ports) // 2 + 1
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            "protected-mode no",
            f"dir {work}",
            f"sentinel monitor {name} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
            f"sentinel myid {self.sentinel_ids[port]}",
        ]
        lines += [
            f"sentinel known-sentinel {name} 127.0.0.1 {other} {self.sentinel_ids[other]}"
            for other in self.sentinel_ports
            if other != port
        ]
        lines += [
            f"sentinel known-replica {name} 127.0.0.1 {replica}"
            for replica in self.nodes
            if replica != master_port
        ]
        if self.password is not None:
            lines.append(f"sentinel auth-pass {name} {self.password}")
        if self.sentinel_password is not None:
            lines += [
                f"requirepass {self.sentinel_password}",
                f"sentinel sentinel-pass {self.sentinel_password}",
            ]
        conf = work / "sentinel.conf"
        conf.write_text("\n".join(lines) + "\n")
        with open(work / "sentinel.log", "ab") as log:
            self.sentinel_procs[port] = subprocess.Popen(
                [exe, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
            )

    def wait_in_sync(self, master_port: int, timeout: float = 15) -> None:
        """Until every other running node has all that ``master_port`` has written so far
        (Redis's ``WAIT``: the replicas acknowledged the master's replication offset).

        "online" in INFO is not enough: right after a full sync the master holds the
        stream back until the replica's first acknowledgement, and a master killed then
        takes those writes with it.
        """
        want = len([p for p, n in self.nodes.items() if p != master_port and n.proc])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.client(master_port) as m:
                    # WAIT waits for this client's last write: a PUBLISH goes down the
                    # replication stream (and writes no key).
                    m.publish("__loopbot_sync__", b"")
                    if int(m.execute_command("WAIT", want, 1000)) >= want:
                        return
            except RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"the replicas of 127.0.0.1:{master_port} did not catch up")

    def wait_settled(self, master_port: int, timeout: float = 30) -> None:
        """Until every sentinel names ``master_port``, knows the others and the replicas.
        On a timeout the error says what each sentinel said last (a CI run once timed
        out here, at the start of a test, on a loaded machine)."""
        deadline = time.monotonic() + timeout
        want_replicas = len([p for p, n in self.nodes.items() if p != master_port and n.proc])
        while time.monotonic() < deadline:
            if all(self._settled(p, master_port, want_replicas) for p in self.sentinel_ports):
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"the sentinels did not settle on 127.0.0.1:{master_port} "
            f"(replicas wanted: {want_replicas}): {self._said()}"
        )

    def _said(self) -> str:
        """What each sentinel says of the master now, and whether its process runs."""
        out = []
        for port in self.sentinel_ports:
            proc = self.sentinel_procs.get(port)
            alive = proc is not None and proc.poll() is None
            try:
                with self.sentinel(port) as s:
                    st = s.sentinel_master(self.master_name)
                said = (
                    f"port={st.get('port')} flags={st.get('flags')} "
                    f"sentinels={st.get('num-other-sentinels')} replicas={st.get('num-slaves')}"
                )
            except (RedisError, OSError) as exc:
                said = f"no answer ({exc})"
            log = self.dir / f"sentinel-{port}" / "sentinel.log"
            tail = log.read_text(errors="replace").splitlines()[-4:] if log.exists() else []
            out.append(f"{port}{'' if alive else ' (exited)'}: {said} | " + " / ".join(tail))
        return "; ".join(out)

    def _settled(self, sentinel_port: int, master_port: int, replicas: int) -> bool:
        try:
            with self.sentinel(sentinel_port) as s:
                state = s.sentinel_master(self.master_name)
        except RedisError:
            return False
        flags = set(str(state.get("flags", "")).split(","))
        return (
            int(state["port"]) == master_port
            and flags == {"master"}
            and int(state.get("num-other-sentinels", 0)) >= len(self.sentinel_ports) - 1
            and int(state.get("num-slaves", 0)) >= replicas
        )

    def kill_master(self) -> int:
        """SIGKILL the current master's redis-server; its port."""
        port = self.master_port()
        assert port is not None, "the sentinels name no master"
        self.nodes[port].kill()
        return port

    def wait_failover(self, old_port: int, timeout: float = 30) -> int:
        """Until the sentinels name a master other than ``old_port`` and it acts as one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old_port and self.role(port) == "master":
                return port
            time.sleep(0.05)
        raise RuntimeError(f"no failover from 127.0.0.1:{old_port} within {timeout}s")

    def restart_node(self, port: int) -> None:
        """Start a killed node again on its port, with its data (the sentinels then make
        it a replica of whoever is master now)."""
        self.nodes[port].start()

    def stop(self) -> None:
        for proc in self.sentinel_procs.values():
            proc.kill()
            proc.wait(5)
        self.sentinel_procs.clear()
        for node in self.nodes.values():
            node.kill()
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def sentinel_log(self) -> str:
        return "\n".join(
            (self.dir / f"sentinel-{p}" / "sentinel.log").read_text(errors="replace")
            for p in self.sentinel_ports
            if (self.dir / f"sentinel-{p}" / "sentinel.log").exists()
        )


def answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (RedisError, ValueError):
        return False
