"""Start a private redis-server on a free port (tests, benchmarks, ``loopbot demo``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway redis-server: no persistence, its own directory, killed on ``stop``."""

    def __init__(self, port: int | None = None, *, persist: bool = False) -> None:
        self.port = port or free_port()
        self.persist = persist  # an append-only file, so data survives restart()
        self.dir = Path(tempfile.mkdtemp(prefix="loopbot-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
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
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = Redis(port=self.port, socket_connect_timeout=0.2)
        while time.monotonic() < deadline:
            try:
                client.ping()
                return self
            except RedisError:
                time.sleep(0.05)
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

    def restart(self, down_for: float = 0.0) -> None:
        """Stop and start again on the same port (keys survive only with ``persist``)."""
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(5)
        self.proc = None
        time.sleep(down_for)
        self.start()


def answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except (RedisError, ValueError):
        return False
