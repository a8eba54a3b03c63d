"""Containment: attacks from the repository and from the agent, each of which must fail.

Every test plants secrets where an attacker would look (the App key, the worker's
environment, another repository's mirror, a file under the operator's HOME) and a
payload that, if anything ran it outside the sandbox, would write a marker next to the
test's files and copy the secrets into it. Each asserts that no marker exists and that
no secret reached the command's output, the pushed branch or a comment.

Run as root (as CI does) and, through ``test_the_same_attacks_fail_for_a_non_root_worker``,
again as an unprivileged user.
"""

from __future__ import annotations

import gzip
import http.server
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot.core.record import Status
from bot.core.settings import Settings, load_settings
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from bot.standins.serving import run_in_thread
from jobs.agents import session
from jobs.sandbox import cgroups
from jobs.sandbox.bwrap import Extra, Sandbox
from jobs.sandbox.home import HomeLink
from jobs.tree.worktree import Checkout, GitError, Worktrees, git
from tests.conftest import Web
from tests.helpers import (
    REPO,
    ROOT,
    label,
    open_issue,
    sample_repo,
    worker_settings,
)

NON_ROOT_RUN = "LOOPBOT_TEST_NON_ROOT_RUN"


@dataclass
class Hostile:
    settings: Settings
    secrets: list[str]
    key: Path
    other_mirror: Path
    home_secret: Path
    markers: Path  # an escaped payload writes here

    def payload(self, name: str) -> str:
        """sh code that proves an escape: a marker with the secrets it could read."""
        marker = self.markers / f"escaped-{name}"
        return (
            f'echo escaped > "{marker}"; env >> "{marker}"; '
            f'cat "{self.key}" "{self.other_mirror}/SECRET" "{self.home_secret}" '
            f'>> "{marker}" 2>&1'
        )

    def escaped(self) -> list[str]:
        return sorted(p.name for p in self.markers.iterdir())

    def leaked(self, text: str) -> list[str]:
        return [s for s in self.secrets if s in text]


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hostile]:
    tag = uuid.uuid4().hex[:10]
    settings = worker_settings(tmp_path)
    assert settings.github_private_key_path is not None
    env_secret = f"sk-ant-env-secret-{tag}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", env_secret)
    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", f"whsec-{tag}")
    other = settings.data_dir / "mirrors" / "other" / "private.git"
    other.mkdir(parents=True)
    (other / "SECRET").write_text(f"other-mirror-secret-{tag}\n")
    home_secret = Path.home() / f".loopbot-test-vault-token-{tag}"
    home_secret.write_text(f"home-vault-secret-{tag}\n")
    markers = tmp_path / "markers"
    markers.mkdir()
    try:
        yield Hostile(
            settings,
            [
                "secret-key-material",
                env_secret,
                f"whsec-{tag}",
                f"other-mirror-secret-{tag}",
                f"home-vault-secret-{tag}",
            ],
            settings.github_private_key_path,
            other,
            home_secret,
            markers,
        )
    finally:
        home_secret.unlink(missing_ok=True)


EVIL_GITCONFIG = """\
[filter "x"]
\tclean = sh {script} clean
\tsmudge = sh {script} smudge
\trequired = true
[diff "x"]
\ttextconv = sh {script} textconv
[merge "x"]
\tdriver = sh {script} merge
[commit]
\tgpgSign = true
[gpg]
\tprogram = sh {script} gpg
[core]
\tfsmonitor = sh {script} fsmonitor
\thooksPath = hooks
\tpager = sh {script} pager
[include]
\tpath = {script}.cfg
"""
EVIL_ATTRIBUTES = "* filter=x diff=x merge=x\n"


def _evil_files(h: Hostile, name: str) -> dict[str, str]:
    script = f"evil-{name}.sh"
    return {
        ".gitconfig": EVIL_GITCONFIG.format(script=script),
        ".gitattributes": EVIL_ATTRIBUTES,
        script: f"#!/bin/sh\n{h.payload(name)}\ncat\n",
        "hooks/pre-commit": f"#!/bin/sh\n{h.payload(name + '-hook')}\n",
    }


def _repo(github: GitHubServer, h: Hostile, files: dict[str, str]) -> tuple[Worktrees, Path, str]:
    iid = github.add_installation("acme")
    github.add_repo(REPO, {"a.py": "x = 1\n", **files}, installation_id=iid)
    token = github.app_token_for(iid)
    wt = Worktrees(h.settings.data_dir)
    mirror = wt.sync_mirror(REPO, f"{github.url}/git/{REPO}.git", token)
    return wt, mirror, token


def _box(h: Hostile, co: Checkout, **kw: Any) -> Sandbox:
    return Sandbox(co.path, settings=h.settings, readonly=(co.mirror,), **kw)


def _with_timeout(fn: Any, seconds: float) -> Any:
    """Run ``fn`` on a thread; fail the test if it has not returned in time (a hang)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"hung for more than {seconds}s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- 1, 2: harness git never runs what the repository or the agent configured ------------


def test_repository_gitconfig_and_attributes_never_run_in_harness_git(
    github: GitHubServer, hostile: Hostile
) -> None:
    wt, mirror, token = _repo(github, hostile, _evil_files(hostile, "repo"))
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    (co.path / "a.py").write_text("x = 2\n")
    sha = wt.commit_all(co, "loop(turn-1): change")
    assert sha is not None
    wt.diff_stat(co)
    wt.push(co, token)
    wt.release(REPO, 1)
    assert hostile.escaped() == []
    # The filter did not run on the way in either: the blob is what the file says.
    assert github.file_at(REPO, "loop/issue-1", "a.py") == "x = 2\n"


def test_agent_planted_config_filters_and_gpg_never_run(
    github: GitHubServer, hostile: Hostile
) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    box = _box(hostile, co)
    files = _evil_files(hostile, "agent")
    for name, text in files.items():
        (co.path / name).parent.mkdir(parents=True, exist_ok=True)
        (co.path / name).write_text(text)
    box.adopt()
    admin = mirror / "worktrees" / co.path.name
    # What an agent would try from inside: git config, the admin dir, the mirror's
    # config and hooks, and a .git directory of its own with a filter and hooks.
    r = box.run(
        "git config filter.x.clean 'sh evil-agent.sh clean'; "
        f"echo '[filter \"x\"]' >> {admin}/config.worktree; "
        f"echo '[core]' >> {mirror}/config; echo hi > {mirror}/hooks/pre-commit; "
        "mv .git .git-old; mkdir -p .git/hooks; "
        "printf '[core]\\n\\tfsmonitor = sh evil-agent.sh fsm\\n"
        '[filter "x"]\\n\\tclean = sh evil-agent.sh clean\\n\' > .git/config; '
        "cp hooks/pre-commit .git/hooks/pre-commit; echo change > a.py; echo done"
    )
    assert "done" in r.output
    assert "Read-only file system" in r.output  # the mirror is read-only inside
    box.close()
    sha = wt.commit_all(co, "loop(turn-1): agent change")
    assert sha is not None
    assert hostile.escaped() == []
    assert (co.path / ".git").is_file()  # put back
    assert "filter" not in (mirror / "config").read_text()
    assert not (admin / "config.worktree").exists()


# -- 2b: nested repositories and special files --------------------------------------------


def test_nested_repository_config_never_runs_and_its_files_commit_as_plain_files(
    github: GitHubServer, hostile: Hostile
) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    with _box(hostile, co) as box:
        (co.path / "evil.sh").write_text(f"#!/bin/sh\n{hostile.payload('nested')}\ncat\n")
        box.adopt()
        r = box.run(
            "mkdir sub && cd sub && git init -q && "
            "git config filter.x.clean 'sh ../evil.sh' && "
            "git config core.fsmonitor 'sh ../evil.sh' && "
            "echo '* filter=x' > .gitattributes && echo data > f && git add -A && "
            "cd .. && mkdir -p sub2/.git && mkfifo sub2/.git/HEAD && mkfifo pipe && echo ok"
        )
        assert r.passed, r.output
    sha = _with_timeout(lambda: wt.commit_all(co, "loop(turn-1): nested"), 60)
    assert sha is not None
    assert hostile.escaped() == []
    tree = git(mirror, "ls-tree", "-r", sha)
    assert "160000" not in tree  # no gitlink: the nested repository is not a submodule
    assert "sub/f" in tree and "sub/.gitattributes" in tree
    assert "pipe" not in tree and not (co.path / "sub" / ".git").exists()


def test_a_fifo_for_dot_git_does_not_hang_the_harness(
    github: GitHubServer, hostile: Hostile
) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    with _box(hostile, co) as box:
        r = box.run("rm .git && mkfifo .git && echo change > a.py && ls -l .git")
        assert r.passed and r.output.startswith("p"), r.output
    sha = _with_timeout(lambda: wt.commit_all(co, "loop(turn-1): fifo"), 60)
    assert sha is not None and (co.path / ".git").is_file()


# -- 3, 5: no privileges, nothing of the host but the allowlist ----------------------------


def test_no_capabilities_no_remount_no_secrets(github: GitHubServer, hostile: Hostile) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    data = hostile.settings.data_dir
    outside = hostile.markers / "escaped-write"
    with _box(hostile, co) as box:
        r = box.run(
            "id -u; grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; "
            f"umount -l {co.path}; umount -l /usr; umount -l /proc; "
            "mount -o remount,rw /; mount -o remount,rw /usr; mount -t tmpfs none /tmp/x; "
            "unshare -U -r true && echo NESTED-USERNS; "
            f"cat {hostile.key} {hostile.other_mirror}/SECRET {hostile.home_secret}; "
            "cat /proc/1/environ /proc/self/environ; env; cat /etc/shadow; "
            f"ls -a {Path.home()} {data} {data}/mirrors; "
            f"echo x > {outside}; touch /usr/pwned /etc/pwned /pwned; echo END"
        )
    out = r.output
    assert "END" in out
    assert out.splitlines()[0] == "1000"
    for line in out.splitlines():
        if line.startswith("Cap"):
            assert line.split()[1] == "0000000000000000", line
    assert "NESTED-USERNS" not in out
    assert hostile.leaked(out) == []
    assert "other" not in out.split("END")[0].split("mirrors")[-1]
    assert not outside.exists() and hostile.escaped() == []
    assert not Path("/usr/pwned").exists() and not Path("/etc/pwned").exists()
    assert not Path("/pwned").exists()


def test_only_allowlisted_etc_and_an_empty_home(github: GitHubServer, hostile: Hostile) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    with _box(hostile, co) as box:
        r = box.run("ls -A /etc; echo HOME=$HOME; ls -A $HOME; ls /; python3 -c 'print(6*7)'")
    etc = set(r.output.split("HOME=")[0].split())
    assert {"shadow", "gshadow", "sudoers", "environment", "gitconfig"}.isdisjoint(etc)
    assert {"passwd", "hosts", "ssl"} <= etc
    assert "HOME=/tmp/home\n" in r.output and "42" in r.output
    assert "root" not in r.output.split("HOME=")[1].split("42")[0].split()


# -- 4: network on is a filtering proxy, never the host's network ------------------------


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_network_on_reaches_neither_redis_nor_other_loopback_services(
    github: GitHubServer, hostile: Hostile, redis_server: Any
) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    run_in_thread(service)
    port, rport = service.server_address[1], redis_server.port
    plant = (
        "import socket\n"
        f"for p in ({rport}, {port}):\n"
        "    try:\n"
        "        s = socket.create_connection(('127.0.0.1', p), timeout=2)\n"
        "        s.sendall(b'SET planted 1\\r\\n'); print('SENT', p)\n"
        "    except OSError as e:\n"
        "        print('NO', p, e)\n"
    )
    (co.path / "plant.py").write_text(plant)
    conn = Redis(port=rport)
    try:
        with _box(hostile, co, network=True) as box:
            box.adopt()
            r = box.run(
                "python3 plant.py; "
                f"for u in http://127.0.0.1:{port}/x http://localhost:{port}/y "
                f"http://169.254.169.254/latest/meta-data/ http://10.0.0.1/; do "
                "curl -s -m 5 --noproxy '' -o /dev/null -w '%{http_code} ' \"$u\"; done; "
                f"curl -s -m 5 -p --noproxy '' -o /dev/null -w 'C%{{http_code}}' "
                f"http://127.0.0.1:{rport}/",
                timeout=60,
            )
    finally:
        service.shutdown()
    assert "SENT" not in r.output, r.output
    assert r.output.count("403") >= 4, r.output
    assert _Recorder.seen == []
    assert conn.get("planted") is None
    assert hostile.escaped() == []


# -- 6: bounded output, processes, memory, files, /tmp -------------------------------------


def test_an_output_flood_is_bounded_in_memory_and_never_spooled(
    github: GitHubServer, hostile: Hostile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    spool = tmp_path / "worker-tmp"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    before = _rss()
    with _box(hostile, co, max_output=16 * 1024) as box:
        r = box.run("head -c 1500000000 /dev/zero | tr '\\0' A; echo; echo THE-END")
        used = sum(f.stat().st_size for f in spool.rglob("*") if f.is_file())
    assert r.passed and r.truncated and "THE-END" in r.output
    assert len(r.output) < 20 * 1024
    assert used < 64 * 1024  # only the sandbox's few small files, no spooled output
    assert _rss() - before < 64 * 1024 * 1024


def test_a_fork_bomb_is_contained(github: GitHubServer, hostile: Hostile) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    settings = hostile.settings.model_copy(update={"sandbox_max_processes": 64})
    counter = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(20)\n            os._exit(0)\n        n += 1\n"
        "except OSError:\n    print('FORKS', n)\n"
    )
    (co.path / "count.py").write_text(counter)
    with Sandbox(co.path, settings=settings, readonly=(mirror,), timeout=20) as box:
        box.adopt()
        counted = box.run("python3 count.py; kill -9 -1 2>/dev/null; true", timeout=20)
        started = time.monotonic()
        bomb = box.run("bomb_c0ffee() { bomb_c0ffee | bomb_c0ffee & }; bomb_c0ffee", timeout=8)
        elapsed = time.monotonic() - started
    assert "FORKS" in counted.output, counted.output
    assert int(counted.output.split("FORKS")[1].split()[0]) < 64
    assert elapsed < 30 and "timed out" not in bomb.output
    # The worker is fine: it can still start processes, and nothing of the bomb is left.
    assert subprocess.run(["true"], check=False).returncode == 0
    leftover = subprocess.run(["pgrep", "-f", "bomb_c0ffee"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""


def test_memory_file_size_and_tmp_are_bounded(github: GitHubServer, hostile: Hostile) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    settings = hostile.settings.model_copy(
        update={"sandbox_max_memory_mb": 1024, "sandbox_max_file_mb": 64, "sandbox_tmp_mb": 32}
    )
    with Sandbox(co.path, settings=settings, readonly=(mirror,)) as box:
        mem = box.run("python3 -c 'b = bytearray(8 * 1024**3); print(len(b))'")
        sparse = box.run("truncate -s 10G big && echo MADE")
        tmp = box.run("dd if=/dev/zero of=/tmp/fill bs=1M count=48 2>&1; ls -l /tmp/fill")
    assert "MemoryError" in mem.output and not mem.passed
    assert not sparse.passed and "MADE" not in sparse.output, sparse.output
    assert not (co.path / "big").exists() or (co.path / "big").stat().st_size <= 64 << 20
    assert "No space left" in tmp.output or "File size limit" in tmp.output


def _allocated(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (what a command could have put there)."""
    total = 0
    for base, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                continue
    return total


def test_a_cli_home_is_a_bounded_tmpfs_and_never_the_worker_s_disk(
    github: GitHubServer, hostile: Hostile
) -> None:
    """A backend CLI's HOME (issue 37, item 7: it was a directory in the host's /tmp, and
    ``fallocate`` put 8 GiB there before a once-a-second check saw it) is the sandbox's
    own /tmp tmpfs: the kernel refuses what passes LOOPBOT_SANDBOX_TMP_MB, nothing lands
    on the worker's disk, and what the harness seeds (from its own directory under the
    data directory) is there before the command starts and gone from the disk after. The
    harness still reads HOME once the sandbox is killed."""
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    # The file size limit far above the tmpfs: only the file system bounds HOME here.
    update = {"sandbox_tmp_mb": 64, "sandbox_max_file_mb": 16 << 10}
    settings = hostile.settings.model_copy(update=update)
    data = settings.data_dir
    command = (
        "cat ~/.cfg/seeded; stat -f -c %T ~; fallocate -l 8G ~/big; echo big=$?; "
        "fallocate -l 24M ~/half; echo half=$?; fallocate -l 48M ~/more; echo more=$?; "
        "echo kept > ~/kept; sleep 600"
    )
    with (
        Sandbox(co.path, settings=settings, readonly=(mirror,)) as box,
        HomeLink(data, box.file_owner) as home,
    ):
        assert home.seed.is_relative_to(data)  # the harness's side of HOME: the data dir
        (home.seed / ".cfg").mkdir()
        (home.seed / ".cfg" / "seeded").write_text("seeded by the harness\n")

        def kept() -> str | None:  # the command got that far: end it (as a cancel does)
            assert home.fd is not None
            return "done" if "kept" in os.listdir(home.fd) else None

        r = box.run(command, timeout=300, extra=Extra(home=home), watch=kept)
        on_disk = _allocated(data) + _allocated(box._stage)
        assert home.fd is not None and not home.seed.exists()
        fd = os.open("kept", os.O_RDONLY, dir_fd=home.fd)  # the sandbox is gone; HOME is not
        try:
            assert os.read(fd, 100) == b"kept\n"
        finally:
            os.close(fd)
        half = os.stat("half", dir_fd=home.fd, follow_symlinks=False)
    assert r.over_limit == "done" and not r.timed_out, r.output
    assert "seeded by the harness" in r.output and "\ntmpfs\n" in r.output, r.output
    assert "big=1" in r.output and "No space left on device" in r.output, r.output
    assert "half=0" in r.output and "more=1" in r.output, r.output  # the bound: 64 MiB
    assert half.st_size == 24 << 20
    assert on_disk < 16 << 20, on_disk  # the worktree and the mirror, not HOME's 24 MiB


def test_links_fifos_and_hard_links_planted_in_a_cli_home_never_reach_its_saved_session(
    github: GitHubServer, hostile: Hostile
) -> None:
    """Issue 37, item 4, from inside a real sandbox: the agent links its CLI's session
    directories (at the first component, the last and deeper) to host paths, plants a
    FIFO and tries hard links to host files; the session packed from HOME afterwards
    holds none of the host's files, and packing does not block."""
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    vault = hostile.other_mirror  # a host directory holding a secret (SECRET)
    plant = (
        f"ln -s {vault} ~/.codex; mkdir -p ~/.local/share; ln -s {vault} ~/.local/share/opencode; "
        f"mkdir -p ~/.c/s/d; ln -s {vault} ~/.c/s/deep; ln -s {vault}/SECRET ~/.c/s/f; "
        "mkfifo ~/.c/s/fifo; echo own > ~/.c/s/d/own; "
        "ln /etc/hostname ~/.c/s/hard 2>&1; ln /usr/bin/env ~/.c/s/env 2>&1; echo planted"
    )
    with _box(hostile, co) as box, HomeLink(hostile.settings.data_dir, box.file_owner) as home:
        r = box.run(plant, extra=Extra(home=home))
        assert home.fd is not None
        started = time.monotonic()
        packs = [
            gzip.decompress(session.pack(home.fd, root, "/w"))
            for root in (".codex/sessions", ".local/share/opencode", ".c/s")
        ]
        took = time.monotonic() - started
    assert "planted" in r.output, r.output
    assert "Invalid cross-device link" in r.output or "Operation not permitted" in r.output
    assert not any(hostile.leaked(p.decode(errors="replace")) for p in packs)
    assert b"own\n" in packs[2] and took < 10


def test_keyrings_dev_and_kernel_interfaces_are_closed(
    github: GitHubServer, hostile: Hostile
) -> None:
    """The worker's session keyring is shared by every process it starts unless the
    sandbox blocks the keyring syscalls; bwrap's /dev is a tmpfs the size of half the RAM."""
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr, args in (('keyctl', 250, (0, -3, 0)), "
        "('add_key', 248, (b'user', b'x', b'leak', 4, -3)), ('bpf', 321, (0, 0, 0)), "
        "('unshare', 272, (0x10000000,)), ('ptrace', 101, (16, os.getppid(), 0, 0)), "
        "('pidfd_getfd', 438, (0, 1, 0)), ('process_vm_readv', 310, (1, 0, 0, 0, 0, 0))):\n"
        "    r = libc.syscall(nr, *args)\n"
        "    print(name, r, ctypes.get_errno())\n"
        "import socket\n"
        "for fam in ('AF_VSOCK', 'AF_PACKET', 'AF_INET', 'AF_UNIX'):\n"
        "    try:\n"
        "        socket.socket(getattr(socket, fam), socket.SOCK_DGRAM).close()\n"
        "        print(fam, 'open')\n"
        "    except OSError as e:\n"
        "        print(fam, 'refused', e.errno)\n"
    )
    (co.path / "probe.py").write_text(probe)
    with _box(hostile, co) as box:
        box.adopt()
        r = box.run("python3 probe.py; dd if=/dev/zero of=/dev/fill bs=1M count=8 2>&1; true")
    if os.uname().machine == "x86_64":
        # ptrace, pidfd_getfd, process_vm_*: no process may reach into another (a backend
        # CLI's stdout, which the harness reads, is its tools' parent's).
        for name in ("keyctl", "add_key", "bpf", "unshare", "ptrace", "pidfd_getfd"):
            assert f"{name} -1 1\n" in r.output, r.output  # EPERM
        assert "process_vm_readv -1 1\n" in r.output, r.output
        assert "AF_VSOCK refused 1" in r.output and "AF_PACKET refused" in r.output
        assert "AF_INET open" in r.output and "AF_UNIX open" in r.output
    assert "Read-only file system" in r.output


@pytest.mark.skipif(cgroups.available() is not None, reason=str(cgroups.available()))
def test_memory_and_processes_are_bounded_per_command_not_per_process(
    github: GitHubServer, hostile: Hostile
) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    settings = hostile.settings.model_copy(
        update={"sandbox_max_memory_mb": 256, "sandbox_max_processes": 64}
    )
    hog = (
        "import os, sys, time\n"
        "for i in range(6):\n"
        "    if os.fork() == 0:\n"
        "        b = bytearray(100 * 1024 * 1024)\n"
        "        for j in range(0, len(b), 4096): b[j] = 1\n"
        "        print('HELD', flush=True); time.sleep(3); os._exit(0)\n"
        "for i in range(6):\n"
        "    print('EXIT', os.wait()[1], flush=True)\n"
    )
    counter = (
        "import os, time, sys\nn = 0\ntry:\n    while n < int(sys.argv[1]):\n"
        "        if os.fork() == 0:\n            time.sleep(6)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError:\n    pass\nprint('FORKS', n, flush=True)\n"
        "time.sleep(6)\n"
    )
    (co.path / "hog.py").write_text(hog)
    (co.path / "count.py").write_text(counter)
    results: dict[str, Any] = {}
    with Sandbox(co.path, settings=settings, readonly=(mirror,), timeout=30) as box:
        box.adopt()
        results["hog"] = box.run("python3 hog.py")
        # Two commands at once: one holding 60 processes must not starve the other.
        a = threading.Thread(target=lambda: results.update(a=box.run("python3 count.py 60")))
        a.start()
        time.sleep(1.5)
        results["b"] = box.run("python3 count.py 40")
        a.join()
    # 6 x 100 MiB against 256 MiB for the whole command: the kernel kills children (status
    # 9, SIGKILL) to keep the command within it; a limit per process would kill none. How
    # many printed HELD first depends on when the kills came (a child killed after it
    # printed frees room for the next), so that count is not what is asserted.
    assert "EXIT 9" in results["hog"].output, results["hog"].output
    assert "FORKS 60" in results["a"].output, results["a"].output
    assert "FORKS 40" in results["b"].output, results["b"].output


def test_a_deep_tree_sparse_files_and_inode_floods_are_charged(
    github: GitHubServer, hostile: Hostile
) -> None:
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    settings = hostile.settings.model_copy(update={"sandbox_max_worktree_mb": 64})
    with Sandbox(co.path, settings=settings, readonly=(mirror,)) as box:
        # Past PATH_MAX: 18 levels of 250-character names, 70 MB at the bottom.
        hidden = box.run(
            "python3 -c \"import os\nfor i in range(18): os.mkdir('x' * 250); "
            "os.chdir('x' * 250)\nopen('f', 'wb').write(bytes(70_000_000))\""
        )
        assert hidden.passed or hidden.over_limit is not None, hidden.output
        assert box.worktree_problem() is not None
        box.run("rm -rf xxxxxxxxxx*")
        assert box.worktree_problem() is None
        deep = box.run(
            "python3 -c \"import os\nfor i in range(1500): os.mkdir('d'); os.chdir('d')\n"
            "open('f', 'w').write('x')\""
        )
        assert deep.passed or deep.over_limit is not None, deep.output
        box.adopt()  # walks without a RecursionError
        assert "deeper than" in (box.worktree_problem() or "")
        # On a loaded machine the watchdog's first look can come before rm is done, see
        # the tree still too deep and stop it: each try removes part of it.
        for _ in range(5):
            removed = box.run("rm -rf d")
            if removed.passed or box.worktree_problem() is None:
                break
        assert box.worktree_problem() is None, removed.output
        sparse = box.run("for i in 1 2 3; do truncate -s 30M sparse$i; done")
        assert sparse.passed
        assert box.worktree_problem() is not None  # 90 MiB apparent, a few KiB on disk
        box.run("rm -f sparse*")
        assert box.worktree_problem() is None
        flood = box.run("mkdir many && cd many && seq 1 20000 | xargs touch")
        assert flood.passed or flood.over_limit is not None
        assert box.worktree_problem() is not None  # 20,000 entries of 4 KiB each
        box.run("rm -rf many")
        started = time.monotonic()
        grow = box.run(
            "i=0; while true; do i=$((i+1)); head -c 8000000 /dev/zero > f$i; done", timeout=60
        )
        took = time.monotonic() - started
    try:
        assert grow.over_limit is not None and not grow.passed, grow.output
        assert took < 20 and "killed" in grow.output
        assert wt.commit_all(co, "loop(turn-1): deep") is not None
    finally:
        wt.remove(REPO, 1)  # pytest's own clean-up of old temp dirs recurses
    assert not co.path.exists()


# -- 8: one lock per mirror across processes -----------------------------------------------


def test_concurrent_processes_share_a_mirror_without_failures(
    github: GitHubServer, hostile: Hostile
) -> None:
    from bot.standins import gitrepo
    from tests.e2e import mirror_fetch

    wt, mirror, token = _repo(github, hostile, {})
    url = f"{github.url}/git/{REPO}.git"
    for i in range(20):  # many refs to update at once
        gitrepo.seed(github.repo(REPO).path, f"b{i}", {f"f{i}.txt": f"{i}\n"}, f"b{i}")
    args = (str(hostile.settings.data_dir), REPO, url, token)
    # forkserver, not fork: this process runs server threads, and a child forked while one
    # of them held a lock (logging, the stand-in's) waited on it forever (seen once in CI).
    with multiprocessing.get_context("forkserver").Pool(12) as pool:
        results = pool.map(mirror_fetch.fetch, [args] * 24)
    assert [r for r in results if r != "ok"] == []
    assert wt.remote_sha(mirror, "b19") is not None


# -- the whole loop: a hostile repository and agent, secrets nowhere on GitHub -----------


def test_hostile_repository_and_agent_end_to_end(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", settings.anthropic_api_key.get_secret_value())  # type: ignore[union-attr]
    markers = tmp_path / "markers"
    markers.mkdir()
    payload = f'echo escaped > "{markers}/escaped"; env >> "{markers}/escaped"'
    evil = {
        ".gitconfig": EVIL_GITCONFIG.format(script="evil.sh"),
        ".gitattributes": EVIL_ATTRIBUTES,
        "evil.sh": f"#!/bin/sh\n{payload}\ncat\n",
    }
    sample_repo(
        github,
        loop_yml="verify: python3 -m unittest -q\nmax_turns: 2\ncritic:\n  enabled: false\n"
        "merge:\n  enabled: false\n",
        extra=evil,
    )
    data = settings.data_dir
    model.play(
        m.bash(
            "cat /proc/1/environ > loot.txt; env >> loot.txt; "
            f"cat {data}/../*.pem $HOME/.ssh/* {Path.home()}/.* /etc/shadow >> loot.txt 2>&1; "
            "mkdir nested && cd nested && git init -q && "
            f"git config filter.x.clean 'sh ../evil.sh'; echo '* filter=x' > .gitattributes; "
            "echo y > y.txt; true"
        ),
        m.replace("calc.py", "return a - b", "return a + b"),
        m.text("Fixed add."),
    )
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None and record.status == Status.COMPLETED, record
    assert sorted(p.name for p in markers.iterdir()) == []
    loot = github.file_at(REPO, "loop/issue-1", "loot.txt") or ""
    pushed = loot + (github.file_at(REPO, "loop/issue-1", "nested/y.txt") or "")
    comments = " ".join(str(c.get("body", "")) for c in github.repo(REPO).comments.values())
    secrets = [
        settings.private_key_pem().splitlines()[1],
        settings.anthropic_api_key.get_secret_value(),  # type: ignore[union-attr]
        settings.github_webhook_secret.get_secret_value(),
    ]
    for secret in secrets:
        assert secret not in pushed and secret not in comments
    assert "ANTHROPIC" not in loot and "BEGIN RSA" not in loot


# -- the disk budget of the worktree -------------------------------------------------------


def test_a_worktree_over_its_disk_limit_stops_the_loop_and_pushes_nothing(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    env: dict[str, str],
) -> None:
    from jobs import runtime as runtime_mod
    from jobs.runtime import Runtime

    limited = load_settings({**env, "LOOPBOT_SANDBOX_MAX_WORKTREE_MB": "16"}, role="worker")
    runtime_mod.install(Runtime(limited, redis))
    sample_repo(
        github,
        loop_yml="verify: python3 -m unittest -q\nmax_turns: 3\ncritic:\n  enabled: false\n",
    )
    model.play(
        m.bash("head -c 40000000 /dev/urandom > blob.bin; echo wrote"),
        m.bash("echo never reached"),
        m.text("done"),
    )
    n = open_issue(github)
    label(github, "writer", n)
    drain()
    record = Store(redis).get(f"{REPO}#{n}")
    assert record is not None
    assert (record.status, record.reason) == (Status.FAILED, "resource_limit"), record
    assert "MiB" in record.detail
    assert github.file_at(REPO, "loop/issue-1", "blob.bin") is None
    assert not github.repo(REPO).pulls
    # The turn ended at the tool call; the stored conversation tells the model why.
    results = [
        b
        for msg in Store(redis).conversation(f"{REPO}#{n}")
        if isinstance(msg["content"], list)
        for b in msg["content"]
        if b.get("type") == "tool_result"
    ]
    assert any("disk" in str(b.get("content")) and b.get("is_error") for b in results)


# -- harness git, second pass (issue 27): the tree cannot hang, exhaust or fool it -----------


def _agent(h: Hostile, co: Checkout, script: str) -> None:
    """What the agent does, as the agent: in the sandbox, on the worktree."""
    with _box(h, co) as box:
        r = box.run(script)
        assert r.passed, r.output


def test_a_fifo_named_gitignore_does_not_hang_harness_git(
    github: GitHubServer, hostile: Hostile
) -> None:
    """1. ``mkfifo sub/.gitignore``: every harness call that reads ignore rules (the
    ignored-file snapshot, the leftovers, a commit) returns at once; the FIFO is gone."""
    wt, mirror, _token = _repo(github, hostile, {"sub/keep": "k\n"})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    _agent(hostile, co, "mkfifo sub/.gitignore && echo y > sub/f")
    started = time.monotonic()
    _with_timeout(lambda: wt.ignored_files(co), 30)
    _agent(hostile, co, "mkfifo sub/.gitignore")
    assert _with_timeout(lambda: wt.commit_all(co, "loop(turn-1): fifo"), 30) is not None
    _agent(hostile, co, "mkfifo sub/.gitignore")
    _with_timeout(lambda: wt.exclude_leftovers(co, set()), 30)
    assert time.monotonic() - started < 30
    assert not (co.path / "sub" / ".gitignore").exists()


@pytest.mark.parametrize("size", [300 * 1024, 40 << 20])
def test_ignore_rules_past_their_size_are_refused_before_git_reads_them(
    github: GitHubServer, hostile: Hostile, size: int
) -> None:
    """2, 3. A .gitignore of many patterns (the cost is patterns by files) or of 40 MiB
    (git took 1.5 GiB for it): refused with a clear error in well under a second, git
    never started on it; and many small rule files add up to the same refusal."""
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    lines = size // 12
    _agent(
        hostile,
        co,
        f"python3 -c \"import sys; sys.stdout.write(''.join(f'/p{{i:09d}}\\n' for i in "
        f'range({lines})))" > .gitignore && mkdir -p d && touch d/f1 d/f2',
    )
    started = time.monotonic()
    for call in (lambda: wt.commit_all(co, "x"), lambda: wt.ignored_files(co)):
        with pytest.raises(GitError, match="ignore and attribute files may hold at most"):
            call()
    assert time.monotonic() - started < 5
    _agent(
        hostile,
        co,
        "rm .gitignore && for i in $(seq 1 12); do mkdir -p s$i && "
        "head -c 100000 /dev/zero | tr '\\0' 'a' > s$i/.gitattributes; done",
    )
    with pytest.raises(GitError, match="in all"):
        wt.commit_all(co, "x")


def test_a_forged_or_deleted_setup_file_is_seen(github: GitHubServer, hostile: Hostile) -> None:
    """4. Setup installed an ignored helper; the agent rewrites it at the same length and
    restores its mtime (``touch -r``): it is purged all the same (its ctime moved). One it
    deletes is reported missing, so setup can make it again."""
    wt, mirror, _token = _repo(github, hostile, {".gitignore": ".venv/\n"})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    _agent(hostile, co, "mkdir -p .venv/bin && echo 'exit 1' > .venv/bin/check && echo k > .venv/k")
    before = wt.ignored_files(co)
    assert set(before) == {".venv/bin/check", ".venv/k"}
    time.sleep(0.05)
    _agent(
        hostile,
        co,
        "cp -p .venv/bin/check /tmp/ref && echo 'exit 0' > .venv/bin/check && "
        "touch -r /tmp/ref .venv/bin/check && rm .venv/k",
    )
    assert wt.purge_ignored(co, before) == [".venv/bin/check"]
    assert not (co.path / ".venv/bin/check").exists()
    assert wt.missing_ignored(co, before) == [".venv/bin/check", ".venv/k"]


def test_a_tree_past_path_max_or_unwritable_neither_blinds_git_nor_stops_the_reaper(
    github: GitHubServer, hostile: Hostile
) -> None:
    """5. Directories nested past PATH_MAX (git does not see them) make a commit fail
    with a clear error instead of committing around them; releasing the worktree, which
    git cannot clean, removes it whole; the reaper survives it. The same for a
    directory without write permission (``chmod 555``)."""
    wt, mirror, _token = _repo(github, hostile, {})
    name = "d" * 200
    for issue, script in (
        (1, f"for i in $(seq 1 26); do mkdir {name} && cd {name}; done; echo x > f"),
        (2, "mkdir -p ro/sub && echo x > ro/sub/f && chmod 555 ro/sub ro"),
    ):
        co = wt.checkout(REPO, issue, f"loop/issue-{issue}", "main", mirror)
        _agent(hostile, co, script)
        if issue == 1:
            with pytest.raises(GitError, match="longer than"):
                wt.commit_all(co, "deep")
        _with_timeout(lambda issue=issue: wt.release(REPO, issue), 60)
        assert not co.path.exists()
        assert not list(wt.spares_dir(REPO).glob("*")) or all(
            wt.is_clean(Checkout(p, mirror, "", "", resumed=False))
            for p in wt.spares_dir(REPO).glob("*")
        )


def test_attributes_never_make_the_commit_differ_from_the_tree_verify_saw(
    github: GitHubServer, hostile: Hostile
) -> None:
    """6. ``*.py ident``, ``text eol=crlf`` and ``working-tree-encoding`` in a
    .gitattributes: each would make ``git add`` store other bytes than the worktree holds
    (verify ran on the worktree). The commit holds the worktree's bytes, exactly."""
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    hidden = 'TAG = "$Id:"; import os; os._exit(0); "$"\n'
    files = {
        ".gitattributes": "*.py ident\n*.txt text eol=crlf\n*.enc working-tree-encoding=UTF-16\n",
        "a.py": hidden,
        "b.txt": "one\r\ntwo\r\n",
        "c.enc": "plain\n",
    }
    for name, text in files.items():
        (co.path / name).write_bytes(text.encode())
    with _box(hostile, co) as box:
        box.adopt()
    sha = wt.commit_all(co, "loop(turn-1): attributes")
    assert sha is not None
    for name, text in files.items():
        blob = subprocess.run(
            ["git", "-C", str(mirror), "cat-file", "blob", f"{sha}:{name}"],
            capture_output=True,
            check=True,
        ).stdout
        assert blob == text.encode(), name
        assert (co.path / name).read_bytes() == text.encode(), name


def test_git_is_never_found_in_the_worktree_through_path(
    github: GitHubServer, hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """7. An empty entry in the worker's PATH (a trailing or leading ``:``) means the
    current directory, which for harness git is the worktree: the agent's ``./git``
    never runs outside the sandbox."""
    wt, mirror, _token = _repo(github, hostile, {})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    payload = hostile.payload("path-git")
    _agent(hostile, co, f"printf '#!/bin/sh\\n{payload}\\n' > git && chmod +x git && echo y > b")
    for path in (":" + os.environ["PATH"], ".:" + os.environ["PATH"], "bin:" + os.environ["PATH"]):
        monkeypatch.setenv("PATH", path)
        wt.commit_all(co, "loop(turn-1): path")
        wt.ignored_files(co)
    assert hostile.escaped() == []


def test_what_setup_and_verify_leave_behind_is_never_committed(
    github: GitHubServer, hostile: Hostile
) -> None:
    """8. verify writes a ``__pycache__`` (a build step's own; the sandbox's Python keeps
    its cache in /tmp) and a report the repository does not ignore: the next commit holds
    the agent's new file and its edit, not those. A
    file of the agent's that was already there uncommitted (a turn a killed worker left)
    stays the agent's and is committed."""
    wt, mirror, _token = _repo(github, hostile, {"calc.py": "X = 1\n"})
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    _agent(hostile, co, "echo mine > unfinished.py")
    before = wt.untracked(co)
    assert before == {"unfinished.py"}
    with _box(hostile, co) as box:
        r = box.run(
            "mkdir __pycache__ && echo x > __pycache__/calc.pyc && "
            "echo ran > 'report [1].txt' && ls"
        )
        assert r.passed and "__pycache__" in r.output, r.output
    left = wt.exclude_leftovers(co, before)
    assert set(left) == {"__pycache__/", "report [1].txt"}
    _agent(
        hostile,
        co,
        "echo 'X = 2' > calc.py && echo new > added.py && echo more >> 'report [1].txt'",
    )
    sha = wt.commit_all(co, "loop(turn-1): change")
    assert sha is not None
    tree = git(mirror, "ls-tree", "-r", "--name-only", sha).split("\n")
    assert "calc.py" in tree and "added.py" in tree and "unfinished.py" in tree
    assert not [p for p in tree if "__pycache__" in p or p.startswith("report")], tree
    # The next loop in this worktree (a recycled spare) starts with no exclusions.
    wt.release(REPO, 1)
    co2 = wt.checkout(REPO, 2, "loop/issue-2", "main", mirror)
    (co2.path / "report [1].txt").write_text("agent's own\n")
    sha2 = wt.commit_all(co2, "loop(turn-1): second")
    assert sha2 is not None and "report [1].txt" in git(mirror, "ls-tree", "--name-only", sha2)


ZOMBIES = """
import ctypes, os, sys, time
from pathlib import Path
from jobs.sandbox.bwrap import Sandbox
from tests.helpers import worker_settings

def start_of(pid):
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rfind(")") + 2 :].split()[19])

me = os.getpid()
born = start_of(me)
tmp = Path(sys.argv[1])
work = tmp / "wt"
work.mkdir()
with Sandbox(work, settings=worker_settings(tmp)) as box:
    for _ in range(8):
        box.run("true")
    nice = box.run("nice").output.strip()
time.sleep(0.5)
# Orphans of the sandboxes come back to this process (it is their subreaper, so none goes
# to PID 1), and none stays a zombie under it. (Zombies under PID 1 are not counted: other
# tests on this machine kill workers whose orphans go there.)
flag = ctypes.c_int(0)
ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
found = []
for proc in Path("/proc").iterdir():
    if not proc.name.isdigit():
        continue
    try:
        text = (proc / "stat").read_text()
    except OSError:
        continue
    name = text[text.find("(") + 1 : text.rfind(")")]
    rest = text[text.rfind(")") + 2 :].split()
    if rest[0] == "Z" and int(rest[1]) == me and start_of(proc.name) >= born:
        found.append(f"{proc.name}:{name}:ppid={rest[1]}")
print("NICE", nice)
print("SUBREAPER", flag.value)
print("ZOMBIES", " ".join(found) or "none")
"""


def test_sandbox_commands_leave_no_zombies_and_yield_the_cpu(tmp_path: Path) -> None:
    """9. Eight sandbox commands in a fresh worker process: it is the subreaper of their
    orphans (none goes to PID 1, which in a container may be a worker that never reaps)
    and none stays a zombie under it; each runs at a lower CPU priority (niceness 10)."""
    root = ROOT
    proc = subprocess.run(
        [sys.executable, "-c", ZOMBIES, str(tmp_path)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ZOMBIES none" in proc.stdout, proc.stdout
    assert "SUBREAPER 1" in proc.stdout, proc.stdout
    assert "NICE 10" in proc.stdout, proc.stdout


def test_a_commit_whose_push_failed_does_not_stay_in_the_shared_mirror(
    github: GitHubServer, hostile: Hostile
) -> None:
    """9. A turn commits 8 MiB the push never delivers (refused); once the loop's
    worktree is released, the mirror is back to its size: nothing keeps that commit."""
    wt, mirror, _token = _repo(github, hostile, {})

    def size_kb() -> int:
        out = git(mirror, "count-objects", "-v")
        fields = dict(line.split(": ") for line in out.splitlines())
        return int(fields["size"]) + int(fields["size-pack"])

    before = size_kb()
    co = wt.checkout(REPO, 1, "loop/issue-1", "main", mirror)
    _agent(hostile, co, "head -c 8388608 /dev/urandom > big.bin")
    assert wt.commit_all(co, "loop(turn-1): big") is not None
    with pytest.raises(GitError):
        wt.push(co, "not-a-token")
    assert size_kb() - before > 8000
    wt.release(REPO, 1)
    assert size_kb() - before < 100, (before, size_kb())
    assert "loop/issue-1" not in git(mirror, "for-each-ref", "refs/heads")


def test_harness_git_on_a_tree_runs_with_its_heap_and_cpu_bounded() -> None:
    """3. The limits ``git`` puts on a command on a worktree, read back from the kernel."""
    from jobs.tree import git as harness

    proc = subprocess.Popen(["sleep", "5"])
    try:
        harness._bound(proc.pid)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
    finally:
        proc.kill()
        proc.wait()
    data = next(line for line in limits.splitlines() if line.startswith("Max data size"))
    cpu = next(line for line in limits.splitlines() if line.startswith("Max cpu time"))
    assert data.split()[3:5] == [str(harness.TREE_MEMORY)] * 2, data
    assert cpu.split()[3:5] == [str(harness.TREE_TIMEOUT)] * 2, cpu


# -- the same, as a non-root worker ---------------------------------------------------------


# The re-run in shards, each its own test, so that the test processes share it out.
NON_ROOT_SHARDS = 3


def _attacks() -> list[str]:
    """This module's tests but the re-run itself, in the order they are defined."""
    return [
        name
        for name, obj in globals().items()
        if name.startswith("test_")
        and callable(obj)
        and name != "test_the_same_attacks_fail_for_a_non_root_worker"
    ]


def test_the_shards_cover_every_attack_once() -> None:
    shards = [_attacks()[i::NON_ROOT_SHARDS] for i in range(NON_ROOT_SHARDS)]
    assert sorted(name for shard in shards for name in shard) == sorted(_attacks())
    assert all(shards)
    assert len(_attacks()) >= 25


@pytest.mark.skipif(os.geteuid() != 0, reason="already running as a non-root user")
@pytest.mark.skipif(bool(os.environ.get(NON_ROOT_RUN)), reason="inside the non-root run")
@pytest.mark.parametrize("shard", range(NON_ROOT_SHARDS))
def test_the_same_attacks_fail_for_a_non_root_worker(shard: int) -> None:
    """Re-run this module as uid 65534: the sandbox then rests on an unprivileged user
    namespace instead of dropping root, and every attack must fail the same way."""
    # Not under pytest's own temp root: every pytest session started as root (another
    # run on this machine) resets /tmp/pytest-of-root to 0700, which uid 65534 cannot enter.
    tmp_path = Path(tempfile.mkdtemp(prefix="loopbot-non-root-", dir="/tmp"))
    try:
        _run_as_non_root(tmp_path, _attacks()[shard::NON_ROOT_SHARDS])
    finally:
        subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False)


def _run_as_non_root(tmp_path: Path, names: list[str]) -> None:
    tmp_path.chmod(0o755)
    home = tmp_path / "home"
    base = tmp_path / "base"
    for d in (home, base):
        d.mkdir()
        os.chown(d, 65534, 65534)
    root = ROOT
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        NON_ROOT_RUN: "1",
    }
    pytest_argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={base / 't'}",
        "-rs",
        *(f"{Path(__file__).resolve()}::{name}" for name in names),
    ]
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    # The interpreter or the checkout may sit under a directory that uid 65534 cannot
    # enter (pyenv under /root): in a private mount namespace of this test only, cover
    # that directory with an open tmpfs and bind the needed tree back into it.
    script, args = ["set -e"], []
    for i, need in enumerate({Path(sys.base_prefix).resolve(), root}):
        blocked = next((p for p in reversed(need.parents) if not p.stat().st_mode & 0o001), None)
        if blocked is None:
            continue
        stage = tmp_path / f"stage{i}"
        stage.mkdir()
        script += [
            f'mount --bind "{need}" "{stage}"',
            f'mount -t tmpfs -o mode=0755 none "{blocked}"',
            f'mkdir -p "{need}"',
            f'mount --bind "{stage}" "{need}"',
        ]
    script.append('exec "$@"')
    argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
    argv += ["\n".join(script), "sh", *args, *drop, *pytest_argv]
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    passed = int(proc.stdout.rsplit(" passed", 1)[0].split()[-1])
    # Every test of the shard ran (cases of a parametrised one count apart); only the
    # cgroup test may skip, where a non-root user cannot have a cgroup of its own.
    assert passed >= len(names) - 1 and "failed" not in proc.stdout, proc.stdout[-2000:]


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
