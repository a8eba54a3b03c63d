"""A CLI's saved session, attacked where the harness reads and writes it (issue 37, item
4): ``pack`` reads HOME, which the agent writes, through a descriptor and never through a
link on any component; ``unpack`` writes the harness's seed and never through a link.
Real directories, real links, FIFOs, devices and a thread that swaps them meanwhile.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import resource
import shutil
import stat
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.agents import claude_code, session

SECRET = b"host-secret-0b1d"


@contextlib.contextmanager
def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A host directory outside HOME, holding a secret at every depth a session has."""
    v = tmp_path / "victim"
    (v / "sessions" / "2026").mkdir(parents=True)
    for f in (v / "s.jsonl", v / "sessions" / "s.jsonl", v / "sessions" / "2026" / "s.jsonl"):
        f.write_bytes(SECRET + b"\n")
    return v


def packed(home: Path, root: str, **kw: object) -> bytes:
    with opened(home) as fd:
        return gzip.decompress(session.pack(fd, root, "/w", **kw))  # type: ignore[arg-type]


def names(home: Path, root: str) -> list[str]:
    with opened(home) as fd:
        data = session.pack(fd, root, "/w")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return sorted(m.name for m in tar if not m.name.startswith(session.META))


@pytest.mark.parametrize(
    "link",
    [
        ".codex",  # the red team's: the first component of the session's directory
        ".codex/sessions",  # its last
        ".codex/sessions/2026",  # a directory inside it
        ".codex/sessions/2026/s.jsonl",  # a file
    ],
)
def test_a_link_on_any_component_is_never_followed(tmp_path: Path, victim: Path, link: str) -> None:
    home = tmp_path / "home"
    (home / ".codex" / "sessions" / "2026").mkdir(parents=True)
    (home / ".codex" / "sessions" / "own.jsonl").write_text("own\n")
    planted = home / link
    if planted.is_dir():
        shutil.rmtree(planted)
    target = {".codex": victim, ".codex/sessions": victim / "sessions"}.get(
        link, victim / "sessions" / "2026" / ("s.jsonl" if link.endswith("jsonl") else "")
    )
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(target)
    data = packed(home, ".codex/sessions")
    assert SECRET not in data
    if link in (".codex/sessions/2026", ".codex/sessions/2026/s.jsonl"):
        assert b"own\n" in data  # the rest of the session is saved


def test_a_hard_link_a_fifo_and_a_device_are_not_saved_and_nothing_blocks(
    tmp_path: Path, victim: Path
) -> None:
    home = tmp_path / "home"
    root = home / ".local" / "share" / "opencode"
    root.mkdir(parents=True)
    (root / "opencode.db").write_bytes(b"db")
    os.link(victim / "s.jsonl", root / "opencode.db-wal")  # its other name is on the host
    os.mkfifo(root / "opencode.db-shm")  # opening it for reading would block
    if os.geteuid() == 0:
        os.mknod(root / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    started = time.monotonic()
    data = packed(home, ".local/share/opencode")
    assert time.monotonic() - started < 5
    assert SECRET not in data and b"db" in data
    assert names(home, ".local/share/opencode") == ["opencode.db"]


def test_swapping_a_directory_or_a_file_for_a_link_while_it_is_packed_never_leaks(
    tmp_path: Path, victim: Path
) -> None:
    """A process in the sandbox turns a directory into a link (and a file into a link)
    between the harness's look and its open, again and again: no pack ever holds what
    the links lead to."""
    home = tmp_path / "home"
    sessions = home / ".codex" / "sessions"
    sessions.mkdir(parents=True)
    stop = threading.Event()

    def swap(path: Path, real: str, target: Path) -> None:
        spare = path.with_name(path.name + ".spare")
        while not stop.is_set():
            if real == "dir":  # the directory aside, a link in its place, and back
                os.rename(path, spare)
                path.symlink_to(target)
                path.unlink()
                os.rename(spare, path)
            else:  # a link over the file, atomically, and a file over the link
                spare.symlink_to(target)
                os.replace(spare, path)
                spare.write_text("own\n")
                os.replace(spare, path)

    (sessions / "d").mkdir()
    (sessions / "d" / "s.jsonl").write_text("own\n")
    (sessions / "f.jsonl").write_text("own\n")
    threads = [
        threading.Thread(target=swap, args=(sessions / "d", "dir", victim / "sessions")),
        threading.Thread(target=swap, args=(sessions / "f.jsonl", "file", victim / "s.jsonl")),
    ]
    for t in threads:
        t.start()
    packs = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                data = packed(home, ".codex/sessions")
            except session.SessionTooLarge:
                continue  # a file changed while it was read: refused, which is fine
            assert SECRET not in data
            packs += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert packs > 20


def forged(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def _member(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, b"" if kind != tarfile.REGTYPE else b"x"


@pytest.mark.parametrize(
    "members",
    [
        [_member("s", tarfile.SYMTYPE, "{victim}")],  # a link, then a file through it
        [_member("s", tarfile.SYMTYPE, "{victim}"), _member("s/s.jsonl", tarfile.REGTYPE)],
        [_member("h", tarfile.LNKTYPE, "{victim}/s.jsonl")],
        [_member("c", tarfile.CHRTYPE)],
        [_member("p", tarfile.FIFOTYPE)],
        [_member("a/../../escape", tarfile.REGTYPE)],
        [_member("/abs", tarfile.REGTYPE)],
    ],
)
def test_a_forged_saved_session_is_refused_and_writes_nothing_through_a_link(
    tmp_path: Path, victim: Path, members: list[tuple[tarfile.TarInfo, bytes]]
) -> None:
    for info, _ in members:
        info.linkname = info.linkname.replace("{victim}", str(victim))
    seed = tmp_path / "seed"
    seed.mkdir()
    before = sorted(p.name for p in victim.rglob("*"))
    with pytest.raises(session.BadSession):
        session.unpack(forged(*members), seed, ".codex/sessions")
    assert [p for p in seed.rglob("*") if p.is_symlink() or not (p.is_dir() or p.is_file())] == []
    assert sorted(p.name for p in victim.rglob("*")) == before
    assert (victim / "s.jsonl").read_bytes() == SECRET + b"\n"
    assert not (tmp_path / "escape").exists()


def test_unpacking_never_writes_through_a_link_in_the_seed(tmp_path: Path, victim: Path) -> None:
    home = tmp_path / "home"
    (home / ".codex" / "sessions" / "d").mkdir(parents=True)
    (home / ".codex" / "sessions" / "d" / "t.jsonl").write_text("turn\n")
    with opened(home) as fd:
        data = session.pack(fd, ".codex/sessions", "/w")
    for link in (".codex", ".codex/sessions/d"):
        seed = tmp_path / f"seed-{link.count('/')}"
        (seed / link).parent.mkdir(parents=True)
        (seed / link).symlink_to(victim if link == ".codex" else victim / "sessions")
        with pytest.raises(session.BadSession):
            session.unpack(data, seed, ".codex/sessions")
    assert not list(victim.rglob("t.jsonl"))
    seed = tmp_path / "seed-clean"
    seed.mkdir()
    assert session.unpack(data, seed, ".codex/sessions") == "/w"
    assert (seed / ".codex" / "sessions" / "d" / "t.jsonl").read_text() == "turn\n"


def test_a_session_of_many_directories_is_packed_without_a_descriptor_each(
    tmp_path: Path,
) -> None:
    """2,000 directories under 256 open files: the walk holds no descriptor per directory
    waiting its turn (it did: past the limit, the open failed and those directories were
    left out of the session)."""
    home = tmp_path / "home"
    root = home / ".codex" / "sessions"
    for i in range(2000):
        (root / f"d{i}").mkdir(parents=True)
        (root / f"d{i}" / "s.jsonl").write_text(f"{i}\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        got = names(home, ".codex/sessions")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len([n for n in got if n.endswith("s.jsonl")]) == 2000


@pytest.mark.parametrize("link", [".claude", ".claude/projects", "project"])
def test_claude_code_s_session_is_never_read_through_a_planted_link(
    tmp_path: Path, link: str
) -> None:
    """The same attack on Claude Code's HOME: its transcripts sit under
    ``~/.claude/projects/<the worktree's path>/``."""
    cwd, sid = "/data/wt/acme-1", "5f0c7a9e-0000-4000-8000-000000000001"
    project = claude_code.project_dir(cwd)
    victim = tmp_path / "victim"
    (victim / "projects" / project).mkdir(parents=True)
    (victim / "projects" / project / f"{sid}.jsonl").write_bytes(SECRET)
    home = tmp_path / "home"
    home.mkdir()
    if link == ".claude":
        (home / ".claude").symlink_to(victim)
    elif link == ".claude/projects":
        (home / ".claude").mkdir()
        (home / ".claude" / "projects").symlink_to(victim / "projects")
    else:
        (home / ".claude" / "projects").mkdir(parents=True)
        (home / ".claude" / "projects" / project).symlink_to(victim / "projects" / project)
    with opened(home) as fd:
        data = gzip.decompress(claude_code.pack(fd, cwd, sid))
    assert SECRET not in data
