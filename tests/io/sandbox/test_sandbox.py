"""The sandbox, run for real under bubblewrap."""

from __future__ import annotations

import http.server
import re
from pathlib import Path

import pytest

from bot.core.settings import Settings
from bot.standins.serving import run_in_thread
from jobs.sandbox.bwrap import Sandbox, SandboxUnavailable
from tests.helpers import worker_settings


@pytest.fixture
def box_settings(tmp_path: Path) -> Settings:
    settings = worker_settings(tmp_path)
    (tmp_path / "data" / "mirrors").mkdir(parents=True)
    (tmp_path / "data" / "mirrors" / "other-secret.txt").write_text("other repo")
    return settings


@pytest.fixture
def worktree(box_settings: Settings) -> Path:
    wt = box_settings.data_dir / "worktrees" / "issue-1"
    wt.mkdir(parents=True)
    (wt / "hello.txt").write_text("hi\n")
    return wt


def test_runs_in_worktree_and_can_write_there(box_settings: Settings, worktree: Path) -> None:
    r = Sandbox(worktree, settings=box_settings).run("cat hello.txt && echo made > new.txt && pwd")
    assert r.passed, r.output
    assert "hi" in r.output and str(worktree) in r.output
    assert (worktree / "new.txt").read_text() == "made\n"


def test_cannot_write_outside_worktree(
    box_settings: Settings, worktree: Path, tmp_path: Path
) -> None:
    target = tmp_path / "escape.txt"
    r = Sandbox(worktree, settings=box_settings).run(
        f"echo x > {target}; echo x > /etc/evil; echo x > ../sibling"
    )
    assert not target.exists()
    assert not Path("/etc/evil").exists()
    assert not (worktree.parent / "sibling").exists()
    assert "Read-only file system" in r.output or "No such file" in r.output


def test_tmp_is_private_and_writable(box_settings: Settings, worktree: Path) -> None:
    r = Sandbox(worktree, settings=box_settings).run("echo x > /tmp/t && cat /tmp/t && ls -A /tmp")
    assert r.passed and "home" in r.output


def test_no_network(box_settings: Settings, worktree: Path, redis_server: object) -> None:
    port = redis_server.port  # type: ignore[attr-defined]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
    probe = f"python3 -c \"{connect}; print('CONNECTED')\""
    with Sandbox(worktree, settings=box_settings) as box:
        r = box.run(probe)
    assert "CONNECTED" not in r.output and not r.passed
    # Network on is a proxy, never the host's network: the host's Redis stays out of reach.
    with Sandbox(worktree, settings=box_settings, network=True) as box:
        allowed = box.run(
            probe + f"; curl -sS -m 5 -p --noproxy '' -x $https_proxy http://127.0.0.1:{port}/"
        )
    assert "CONNECTED" not in allowed.output
    assert "403" in allowed.output or "ERR_LOOPBOT" in allowed.output, allowed.output


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"simple index")

    def log_message(self, *args: object) -> None:
        pass


def test_a_listed_host_is_reached_through_the_proxy(box_settings: Settings, worktree: Path) -> None:
    """The stand-in package index: 127.0.0.2 on port 80, allowed by the operator."""
    try:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.2", 80), _Index)
    except OSError as exc:
        pytest.skip(f"cannot listen on 127.0.0.2:80 here: {exc}")
    run_in_thread(httpd)
    try:
        settings = box_settings.model_copy(update={"egress_allowed_networks": "127.0.0.2/32"})
        with Sandbox(worktree, settings=settings, network=("127.0.0.2",)) as box:
            ok = box.run("curl -sS -m 5 http://127.0.0.2/simple/")
            other = box.run("curl -sS -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.3/")
        with Sandbox(worktree, settings=box_settings, network=("127.0.0.2",)) as box:
            private = box.run("curl -sS -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.2/")
    finally:
        httpd.shutdown()
    assert ok.passed and "simple index" in ok.output, ok.output
    assert "403" in other.output  # not on the list
    assert "403" in private.output  # on the list, but a loopback address the operator did not allow


def test_secrets_and_environment_are_hidden(
    box_settings: Settings, worktree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", "whsec")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    key = box_settings.github_private_key_path
    r = Sandbox(worktree, settings=box_settings).run(
        f"env; cat {key}; ls {box_settings.data_dir}/mirrors; "
        "echo PROCS=$(ls /proc | grep -c '^[0-9]')"
    )
    assert "sk-secret" not in r.output and "whsec" not in r.output
    assert "secret-key-material" not in r.output
    assert "other-secret" not in r.output
    # A new PID namespace: only the sandbox's own few processes, not the worker's.
    procs = int(r.output.split("PROCS=")[1].split()[0])
    assert procs < 6


# A module whose bytecode, "unchecked" (never compared with the source), says otherwise.
SHADOWED = (
    "echo 'print(\"from pyc\")' > m.py && "
    "python3 -c \"import py_compile; py_compile.compile('m.py', "
    "cfile='__pycache__/m.' + __import__('sys').implementation.cache_tag + '.pyc', "
    'invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)" && '
    "echo 'print(\"from source\")' > m.py"
)


def test_python_reads_the_system_s_bytecode_and_never_the_worktree_s(
    box_settings: Settings, worktree: Path
) -> None:
    """The standard library is loaded from the bytecode that ships with it (through the
    read-only links at <prefix>/usr), not compiled again at every start; a module of the
    worktree is compiled from its source, whatever ``__pycache__`` says."""
    with Sandbox(worktree, settings=box_settings) as box:
        prepared = box.run(SHADOWED)
        assert prepared.passed, prepared.output
        run = box.run("python3 -v -c 'import unittest, m' 2>&1; touch /tmp/pycache/usr/x")
    loaded = re.search(
        r"^# /tmp/pycache/usr/lib/python3[^ ]*/unittest/case\.cpython-3\d+\.pyc matches "
        r"/usr/lib/python3[^ ]*/unittest/case\.py$",
        run.output,
        re.M,
    )
    assert loaded, run.output[-3000:]
    assert "from source" in run.output and "from pyc" not in run.output
    assert "code object from" in run.output and "/m.py" in run.output
    assert "Read-only file system" in run.output  # the links are the system's, for reading


def test_timeout_kills_the_whole_tree(box_settings: Settings, worktree: Path) -> None:
    r = Sandbox(worktree, settings=box_settings, timeout=1).run("sleep 30 & sleep 30; echo never")
    assert r.timed_out and not r.passed and r.seconds < 10
    assert "timed out" in r.output


def test_output_is_bounded(box_settings: Settings, worktree: Path) -> None:
    r = Sandbox(worktree, settings=box_settings, max_output=4096).run(
        "python3 -c \"print('A' * 100000); print('THE END')\""
    )
    assert r.truncated and len(r.output) < 5000
    assert "THE END" in r.output and "omitted" in r.output


def test_exit_codes_pass_through(box_settings: Settings, worktree: Path) -> None:
    assert Sandbox(worktree, settings=box_settings).run("exit 3").exit_code == 3


def test_refuses_without_bubblewrap_unless_opted_out(
    box_settings: Settings, worktree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobs.sandbox.bwrap.bwrap_path", lambda: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(worktree, settings=box_settings)
    opted = box_settings.model_copy(update={"allow_unsandboxed": True})
    r = Sandbox(worktree, settings=opted).run("echo $ANTHROPIC_API_KEY; echo ok")
    assert r.passed and "sk-secret" not in r.output


def test_commands_the_kernel_would_refuse_are_tool_errors_and_leak_nothing(
    box_settings: Settings, worktree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.sandbox import cgroups

    # The groups these commands get, as the real cgroups.create makes them: a glob of the
    # hierarchy would also see the groups of tests running beside this one (pytest -n 2).
    made: list[cgroups.Group] = []
    create = cgroups.create

    def recorded(memory_bytes: int, processes: int) -> cgroups.Group | None:
        group = create(memory_bytes, processes)
        if group is not None:
            made.append(group)
        return group

    monkeypatch.setattr(cgroups, "create", recorded)

    def groups() -> set[str]:
        return {str(d) for g in made for d in g.dirs if d.exists()}

    before = groups()
    with Sandbox(worktree, settings=box_settings) as box:
        nul = box.run("echo a\0b")
        huge = box.run("echo " + "x" * 200_000)
        fine = box.run("echo fine")
    assert nul.exit_code == 126 and "NUL" in nul.output
    assert huge.exit_code == 126 and "bytes" in huge.output
    assert fine.passed and "fine" in fine.output
    assert groups() <= before  # no group left behind, whatever happened
