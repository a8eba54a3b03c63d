"""A loop's session log: its conversation and events, rendered for people.

``build`` turns the stored conversation (``jobs.agents.agent``: Anthropic messages as plain
dicts) and the loop's event stream (``bot.io.store.Store.events``) into a list of
entries, in order: each turn's prompt, the agent's text, each tool call (the command, or
the edit as a diff) with its result right after it, then the turn's verify run, pushes,
the pull request, review rounds, handovers, restarts and the end. The dashboard, the CLI
and the API show these entries; ``render_text`` is the CLI's view.

The issue's status comment has its own short checklist, ``bot.core.text.timeline``; what
both read of the events is in ``bot.core.text.events``.

Every string of every entry has gone through the caller's ``Redactor``: the log shows
what tools printed, and a tool can print a token.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bot.core.text.events import (
    _clip,
    _event_order,
    _int,
    _is_int,
    _severities,
    _short,
    _tail,
    failing_test,
)
from bot.core.text.redact import Redactor, deep

Entry = dict[str, Any]

BASH = "bash"
EDITOR = "str_replace_based_edit_tool"
TITLE_CHARS = 160  # of a title taken from a command or a text's first line

# Event kinds shown under their own entry kind; any other event is an "event" entry.
_EVENT_KINDS = {
    "turn_started": "turn",
    "verify": "verify",
    "base_verify": "verify",
    "held_out_verify": "verify",
    "tests_changed_to_pass": "verify",
    "pushed": "pushed",
    "pr_opened": "pr_opened",
    "review_started": "review",
    "reviewed": "review",
    "review_skipped": "review",
    "review_carried": "review",
    "handoff": "handoff",
    "loop_restarted": "restart",
    "loop_resumed": "resume",
    "shrink": "shrink",
    "context_shrunk": "shrink",
    "loop_finished": "finished",
    "attachments": "attachments",
    "attachment_thumbnail": "attachments",
}
# A thumbnail the log page shows as an image: a small PNG or JPEG as a data URI, never
# anything a browser would run or fetch (bot/io/attachments.py makes them).
_THUMBNAIL = re.compile(r"data:image/(?:png|jpeg);base64,[A-Za-z0-9+/]+={0,2}")


# -- build -----------------------------------------------------------------------------------


def build(
    conversation: list[dict[str, Any]],
    events: list[dict[str, Any]],
    redact: Redactor,
    *,
    max_chars: int = 4000,
) -> list[Entry]:
    """The session log's entries, oldest first (see the module's doc)."""
    # Redacted whole before anything is cut or derived from it: a title clipped first
    # would keep part of a secret that no longer matches.
    conversation = deep(conversation, redact)
    events = sorted(deep(events, redact), key=_event_order)
    spans = _turn_spans(events, len(conversation))
    results = _results_by_call(conversation)
    out = _Out(redact, max_chars, turn_starts={s.start for s in spans.values()})
    done = 0  # conversation messages shown so far
    if not spans:
        # Old events say nothing of where each turn began: one block before the first event.
        out.messages(conversation, _Span(0, len(conversation), None), results)
        done = len(conversation)
    state = _EventState()
    for index, event in enumerate(events):
        out.event(event, state)
        span = spans.get(index)
        if span is None:
            continue
        if done < span.start:  # messages no event placed (turns from before an upgrade)
            out.messages(conversation, _Span(done, span.start, None), results)
        out.messages(conversation, span, results)
        done = max(done, span.end)
        if span.turn is not None and span.end > span.start:
            state.shown_turns.add(span.turn)
    if done < len(conversation):
        out.messages(conversation, _Span(done, len(conversation), None), results)
    return out.entries


@dataclass(frozen=True)
class _Span:
    """Conversation messages ``[start, end)``, of ``turn`` (None: not known)."""

    start: int
    end: int
    turn: int | None
    # The turn's prompt sits in the message before ``start`` (see ``_Out.messages``).
    prompt_before: bool = False


def _turn_spans(events: list[dict[str, Any]], length: int) -> dict[int, _Span]:
    """For each ``turn_started`` event that says where its turn began (the conversation's
    length then): its index in ``events`` -> the turn's messages.

    Kept monotonic and within the conversation: one saved shorter (a worker lost mid-turn)
    cannot point past its end. Of turns that began at the same length (a turn lost before
    its conversation was saved), the last one owns the prompt found there.
    """
    begun: list[tuple[int, int, int]] = []  # (event index, start, turn)
    floor = 0
    for index, event in enumerate(events):
        data = event.get("data") or {}
        at = data.get("messages")
        folded = data.get("summarised")
        if event.get("kind") == "context_shrunk" and _is_int(folded) and _int(folded) > 0:
            # The first ``folded`` messages became one brief: earlier starts move with it.
            begun = [(i, _after_brief(s, _int(folded)), t) for i, s, t in begun]
            floor = _after_brief(floor, _int(folded))
        if event.get("kind") == "turn_started" and _is_int(at):
            floor = min(max(floor, _int(at)), length)
            begun.append((index, floor, _int(data.get("turn"))))
    spans: dict[int, _Span] = {}
    for n, (index, start, turn) in enumerate(begun):
        end = begun[n + 1][1] if n + 1 < len(begun) else length
        last_here = end > start or n + 1 == len(begun)
        spans[index] = _Span(start, end, turn, prompt_before=start > 0 and last_here)
    return spans


def _after_brief(index: int, folded: int) -> int:
    """Where message ``index`` sits once the first ``folded`` became one brief (0: in it)."""
    return index - folded + 1 if index >= folded else 0


def _results_by_call(conversation: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for message in conversation:
        for block in _blocks(message):
            if block.get("type") == "tool_result" and block.get("tool_use_id"):
                found[str(block["tool_use_id"])] = block
    return found


@dataclass
class _EventState:
    """What earlier events said, which later ones need."""

    turn: int | None = None
    review_round: int = 0
    shown_turns: set[int] = field(default_factory=set)


class _Out:
    """The entries, each redacted and trimmed as it is added."""

    def __init__(self, redact: Redactor, max_chars: int, *, turn_starts: set[int]) -> None:
        self.redact = redact
        self.max_chars = max_chars
        self.turn_starts = turn_starts
        self.entries: list[Entry] = []

    def add(
        self,
        kind: str,
        title: str,
        body: str = "",
        *,
        turn: int | None = None,
        step: int | None = None,
        at: float | None = None,
        diff: str | None = None,
        ok: bool | None = None,
        image: str | None = None,
    ) -> None:
        # Redacted whole before any cut: a secret cut in two would match nothing.
        body = self.redact(body)
        shown, cut = _trim(body, self.max_chars)
        if diff is not None:
            diff, diff_cut = _trim(self.redact(diff), self.max_chars)
            cut = cut or diff_cut
        self.entries.append(
            {
                "kind": kind,
                "turn": turn,
                "step": step,
                "at": at,
                "title": self.redact(_one_line(self.redact(title))),
                "body": self.redact(shown),
                "truncated": cut,
                "full_chars": len(body),
                "diff": self.redact(diff) if diff is not None else None,
                "ok": ok,
            }
        )
        if image is not None and _THUMBNAIL.fullmatch(image):
            self.entries[-1]["image"] = image

    # -- the conversation

    def messages(
        self,
        conversation: list[dict[str, Any]],
        span: _Span,
        results: dict[str, dict[str, Any]],
    ) -> None:
        """The entries of ``span``'s messages.

        A turn's prompt may sit at the end of the message before its first one: when the
        turn before ended on tool results, the agent merged the prompt into that message
        (``jobs.agents.agent.add_user_text``). It is shown with the turn it starts.
        """
        if span.prompt_before:
            before = list(_blocks(conversation[span.start - 1]))
            for block in before[len(before) - _later_prompt(before) :]:
                self._prompt(str(block.get("text", "")), span.turn)
        step = 0
        for i in range(span.start, span.end):
            message = conversation[i]
            if message.get("role") == "assistant":
                step += 1
                self._assistant(message, span.turn, step, results)
            else:
                # The next turn's prompt, if it is in this message, is shown with it.
                moves = i == span.end - 1 and span.end in self.turn_starts
                self._user(message, span.turn, step, results, prompt_moves=moves)

    def _assistant(
        self,
        message: dict[str, Any],
        turn: int | None,
        step: int,
        results: dict[str, dict[str, Any]],
    ) -> None:
        for block in _blocks(message):
            kind = block.get("type")
            if kind == "text" and str(block.get("text", "")).strip():
                text = str(block["text"])
                self.add("text", _first_line(text), text, turn=turn, step=step)
            elif kind == "thinking" and str(block.get("thinking", "")).strip():
                self.add("text", "(thinking)", str(block["thinking"]), turn=turn, step=step)
            elif kind == "tool_use":
                self._call(block, turn, step)
                result = results.pop(str(block.get("id")), None)
                if result is not None:
                    self._result(result, block, turn, step)

    def _user(
        self,
        message: dict[str, Any],
        turn: int | None,
        step: int,
        results: dict[str, dict[str, Any]],
        *,
        prompt_moves: bool,
    ) -> None:
        blocks = list(_blocks(message))
        if prompt_moves:
            blocks = blocks[: len(blocks) - _later_prompt(blocks)]
        for block in blocks:
            kind = block.get("type")
            if kind == "tool_result":
                # Shown with its call already; one whose call is missing shows here.
                if results.pop(str(block.get("tool_use_id")), None) is not None:
                    self._result(block, None, turn, step)
            elif kind == "text":
                self._prompt(str(block.get("text", "")), turn)

    def _prompt(self, text: str, turn: int | None) -> None:
        if not text.strip():
            return
        self.add("prompt", _first_line(text), text, turn=turn)

    def _call(self, block: dict[str, Any], turn: int | None, step: int) -> None:
        name = str(block.get("name", "tool"))
        args = block.get("input") or {}
        if not isinstance(args, dict):
            args = {"input": args}
        title, body, diff = describe_call(name, args)
        self.add("tool_call", title, body, turn=turn, step=step, diff=diff)

    def _result(
        self,
        block: dict[str, Any],
        call: dict[str, Any] | None,
        turn: int | None,
        step: int | None,
    ) -> None:
        text = _result_text(block.get("content"))
        failed = bool(block.get("is_error"))
        self.add(
            "tool_result",
            _result_title(text, failed, call),
            text,
            turn=turn,
            step=step,
            ok=not failed,
        )

    # -- events

    def event(self, event: dict[str, Any], state: _EventState) -> None:
        kind = str(event.get("kind", ""))
        data = event.get("data") or {}
        at = _float(event.get("at"))
        turn = _int(data["turn"]) if _is_int(data.get("turn")) else state.turn
        if kind == "turn_started":
            state.turn = turn
        if kind == "review_started" and _is_int(data.get("round")):
            state.review_round = data["round"]
        if kind == "step" and not _shows_step(data, turn, state):
            return  # the conversation shows this tool call already
        if kind in ("agent_text", "agent_tool", "agent_result"):
            self._backend(kind, data, turn, at)
            return
        title, body, ok = _describe_event(kind, data, state)
        step = _int(data["step"]) if kind == "step" and _is_int(data.get("step")) else None
        self.add(
            _EVENT_KINDS.get(kind, "event"),
            title,
            body,
            turn=turn if kind != "base_verify" else None,
            step=step,
            at=at,
            ok=ok,
            image=str(data.get("src")) if kind == "attachment_thumbnail" else None,
        )

    def _backend(self, kind: str, data: dict[str, Any], turn: int | None, at: float | None) -> None:
        """What a backend in the sandbox did (Claude Code's stream, ``jobs/agents/claude_code.py``):
        its text, each tool call (a command as its title, an edit as a diff), each result."""
        step = _int(data["step"]) if _is_int(data.get("step")) else None
        if kind == "agent_text":
            text = str(data.get("text", ""))
            self.add("text", _first_line(text), text, turn=turn, at=at)
        elif kind == "agent_tool":
            given = data.get("input")
            given = given if isinstance(given, dict) else {}
            title, body, diff = describe_backend_call(str(data.get("tool", "tool")), given)
            self.add("tool_call", title, body, turn=turn, step=step, at=at, diff=diff)
        else:
            text, failed = str(data.get("output", "")), bool(data.get("error"))
            title = f"error: {_first_line(text)}" if failed else _first_line(text) or "(no output)"
            self.add("tool_result", title, text, turn=turn, at=at, ok=not failed)


def describe_backend_call(name: str, args: dict[str, Any]) -> tuple[str, str, str | None]:
    """A backend's tool call (Claude Code's ``Bash``, ``Edit``…, opencode's ``bash``,
    ``edit``…) as (title, body, diff), as ``describe_call`` does loopbot's."""
    path = str(args.get("file_path", args.get("filePath", args.get("path", "?"))))
    name = name.lower()
    if name == "bash":
        return describe_call(BASH, {"command": args.get("command", "")})
    if name == "edit":
        old = str(args.get("old_string", args.get("oldString", "")))
        new = str(args.get("new_string", args.get("newString", "")))
        return f"edit {path}", "", _diff(path, old, new)
    if name == "write":
        return f"write {path}", "", _diff(path, "", str(args.get("content", "")), created=True)
    if name == "read":
        return f"read {path}", "", None
    return name, json.dumps(args, indent=2, sort_keys=True, default=str), None


def _shows_step(data: dict[str, Any], turn: int | None, state: _EventState) -> bool:
    """A step event is worth an entry while its turn's messages are not saved yet (a turn
    under way), or when it says more than the conversation (a stalled model call)."""
    return turn not in state.shown_turns or str(data.get("tool", "")).startswith("stall")


# -- tool calls ------------------------------------------------------------------------------


def describe_call(name: str, args: dict[str, Any]) -> tuple[str, str, str | None]:
    """A tool call as (title, body, diff): a command is its own title; an edit is a diff."""
    if name == BASH:
        if args.get("restart"):
            return "bash: restart", "", None
        command = str(args.get("command", ""))
        return f"$ {_first_line(command)}", command if "\n" in command.strip() else "", None
    if name == EDITOR:
        return _describe_edit(args)
    return name, json.dumps(args, indent=2, sort_keys=True, default=str), None


def _describe_edit(args: dict[str, Any]) -> tuple[str, str, str | None]:
    command = str(args.get("command", ""))
    path = str(args.get("path", "?"))
    if command == "view":
        span = args.get("view_range")
        where = f" lines {span[0]}-{span[1]}" if isinstance(span, list) and len(span) == 2 else ""
        return f"view {path}{where}", "", None
    if command == "create":
        created = _diff(path, "", str(args.get("file_text", "")), created=True)
        return f"create {path}", "", created
    if command == "str_replace":
        old, new = str(args.get("old_str", "")), str(args.get("new_str", ""))
        return f"edit {path}", "", _diff(path, old, new)
    if command == "insert":
        line = args.get("insert_line")
        text = str(args.get("insert_text", args.get("new_str", "")))
        return f"insert into {path} after line {line}", "", _diff(path, "", text)
    body = json.dumps(args, indent=2, sort_keys=True, default=str)
    return f"{command or 'editor'} {path}", body, None


def _diff(path: str, old: str, new: str, *, created: bool = False) -> str:
    """A unified diff of the edited text (not of the whole file: only the tool's input is
    known here, so the line numbers count from the edit's start)."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile="/dev/null" if created else f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _later_prompt(blocks: list[dict[str, Any]]) -> int:
    """How many of a user message's last blocks are a later turn's prompt, merged into it:
    the text blocks after its last tool result, or after its own first text (a turn that
    ended before the model answered leaves its prompt alone in the message)."""
    results = [i for i, b in enumerate(blocks) if b.get("type") == "tool_result"]
    first = results[-1] if results else 0
    trailing = blocks[first + 1 :]
    return len(trailing) if all(b.get("type") == "text" for b in trailing) else 0


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, dict):
                parts.append(f"[{block.get('type', 'block')}]")
        return "\n".join(parts)
    return "" if content is None else str(content)


_EXIT = re.compile(r"\[exit code (-?\d+)\]\s*$")


def _result_title(text: str, failed: bool, call: dict[str, Any] | None) -> str:
    if call is not None and call.get("name") == BASH:
        if m := _EXIT.search(text):
            return f"exit {m.group(1)}"
        return "error" if failed else "exit 0"
    first = _first_line(text)
    return f"error: {first}" if failed else first or "(no output)"


# -- events ----------------------------------------------------------------------------------


def _describe_event(kind: str, data: dict[str, Any], state: _EventState) -> tuple[str, str, Any]:
    """(title, body, ok) of one event."""
    match kind:
        case "turn_started":
            return f"turn {data.get('turn')}", "", None
        case "verify" | "base_verify":
            return _verify_title(kind, data), _tail(data), bool(data.get("passed"))
        case "held_out_verify":
            return _held_out_title(data), _held_out_body(data), not data.get("stands")
        case "tests_changed_to_pass":
            then = (
                "the agent gets a turn to fix the code instead"
                if data.get("then") == "turn"
                else "a person decides"
            )
            return f"the tests were changed to pass: {then}", str(data.get("summary") or ""), False
        case "pushed":
            return f"pushed {_short(data.get('sha'))}", "", True
        case "pr_opened":
            return f"pull request #{data.get('pr')} opened", "", True
        case "review_started":
            return f"review round {data.get('round')} started", "", None
        case "reviewed":
            counts = _severities(data)
            title = f"review round {state.review_round}: {data.get('verdict')}, {counts}"
            return title, _findings(data.get("findings")), not data.get("sev1")
        case "review_skipped":
            return f"head already reviewed: {data.get('verdict')}", "", None
        case "review_carried":
            return f"same change as {_short(data.get('reviewed'))}: its approval carries", "", True
        case "step":
            return f"step {data.get('step')}: {data.get('tool')}", "", None
        case "loop_finished":
            title = f"{data.get('status')} ({data.get('reason')})"
            return title, str(data.get("detail") or ""), data.get("status") == "completed"
        case "merged":
            return f"merged as {_short(data.get('sha'))}", "", True
        case "context_shrunk":
            return _shrunk_words(data), "", None
        case "attachments":
            return _attachments(data)
        case "attachment_thumbnail":
            return str(data.get("name", "")), "", None
    return _plain_title(kind, data), _data_body(data), None


def _attachments(data: dict[str, Any]) -> tuple[str, str, Any]:
    """The approved issue's attachments: what each model got, and what was skipped."""
    files = [f for f in data.get("files") or [] if isinstance(f, dict)]
    skipped = [s for s in data.get("skipped") or [] if isinstance(s, dict)]
    lines = []
    for f in files:
        size = f"{_int(f.get('bytes')):,} bytes"
        if f.get("kind") == "image":
            size += f", {f.get('width')} x {f.get('height')} px, ~{f.get('tokens')} tokens"
        lines.append(f"{f.get('name')}: {f.get('kind')}, {size}")
    lines += [f"{s.get('name')}: skipped: {s.get('reason')}" for s in skipped]
    title = f"attachments: {len(files)} read" + (f", {len(skipped)} skipped" if skipped else "")
    return title, "\n".join(lines), None if not skipped else False


def _shrunk_words(data: dict[str, Any]) -> str:
    how = {"clear": "old tool results cleared", "brief": "older turns folded into a brief"}
    level = str(data.get("level"))
    return (
        f"context shrunk ({how.get(level, level)}): about {_int(data.get('tokens_before')):,}"
        f" → {_int(data.get('tokens_after')):,} tokens of a {_int(data.get('window')):,} window"
    )


def _held_out_title(data: dict[str, Any]) -> str:
    """``held-out verify failed (exit 1)``: verify with the tests as on the base."""
    if not data.get("ran"):
        return f"held-out verify not run: {data.get('not_run') or 'no reason recorded'}"
    if data.get("passed"):
        return "held-out verify passed (the tests as on the base)"
    if data.get("timed_out"):
        return "held-out verify failed (timed out)"
    return f"held-out verify failed (exit {data.get('exit_code')})"


def _held_out_body(data: dict[str, Any]) -> str:
    held = data.get("held") if isinstance(data.get("held"), list) else []
    lines = [f"command: {data.get('command')}"]
    if held:
        lines.append("as on the base: " + ", ".join(str(p) for p in held))
    lines.extend(f"tests run: {line}" for line in data.get("ran_less") or [])
    tail = _tail(data)
    return "\n".join(lines) + (f"\n\n{tail}" if tail else "")


def _verify_title(kind: str, data: dict[str, Any]) -> str:
    what = "base verify" if kind == "base_verify" else "verify"
    if data.get("passed"):
        return f"{what} passed"
    if data.get("timed_out"):
        return f"{what} failed (timed out)"
    test = failing_test(_tail(data))
    code = data.get("exit_code")
    why = test or (f"exit {code}" if code is not None else "")
    return f"{what} failed ({why})" if why else f"{what} failed"


def _findings(found: Any) -> str:
    """Findings, when the event carries them: one line each."""
    if not isinstance(found, list):
        return ""
    lines = []
    for f in found:
        if isinstance(f, dict):
            where = f.get("path") or ""
            if where and f.get("line"):
                where = f"{where}:{f['line']}"
            text = f.get("title") or f.get("body") or ""
            lines.append(f"- [{f.get('severity', '?')}] {where} {text}".replace("  ", " "))
    return "\n".join(lines)


def _plain_title(kind: str, data: dict[str, Any]) -> str:
    """Any other event: its kind in words and its short scalar fields."""
    shown = [
        f"{k}={v}"
        for k, v in data.items()
        if isinstance(v, str | int | float | bool)
        and k not in ("error", "detail")
        and len(str(v)) <= 40
    ]
    words = kind.replace("_", " ")
    return f"{words}: {', '.join(shown)}" if shown else words


def _data_body(data: dict[str, Any]) -> str:
    long = {k: v for k, v in data.items() if not isinstance(v, str | int | float | bool)}
    long |= {k: v for k, v in data.items() if isinstance(v, str) and len(v) > 40}
    long |= {k: v for k, v in data.items() if k in ("error", "detail")}
    return json.dumps(long, indent=2, sort_keys=True, default=str) if long else ""


# -- text for the CLI ------------------------------------------------------------------------

BODY_LINES = 12  # of a body shown without --full: the head and tail of it


def render_text(entries: list[Entry], *, full: bool = False) -> str:
    """The CLI's view: one block per entry, a header line and the body indented."""
    return "\n".join(_render_entry(e, full) for e in entries)


def _render_entry(e: Entry, full: bool) -> str:
    when = time.strftime("%H:%M:%S", time.gmtime(e["at"])) if e.get("at") else " " * 8
    where = " ".join(
        part
        for part in (
            f"turn {e['turn']}" if e.get("turn") is not None else "",
            f"step {e['step']}" if e.get("step") is not None else "",
        )
        if part
    )
    mark = "" if e.get("ok") is None else " ✓" if e["ok"] else " ✗"
    head = f"{when} {where:<16} {e['kind']:<11} {e['title']}{mark}"
    if e["kind"] == "turn":
        head = f"\n{when} ── {e['title']} " + "─" * 40
    lines = [head]
    for text in (e.get("body") or "", e.get("diff") or ""):
        if text and text.strip() != e["title"]:  # a one-line text is its own title
            lines += _indented(text if full else _head_and_tail(text, BODY_LINES))
    if e.get("truncated"):
        lines.append(f"    [{e['full_chars']} characters in all; the dashboard shows more]")
    return "\n".join(lines)


def _indented(text: str) -> list[str]:
    return ["    " + line for line in text.rstrip("\n").splitlines()]


def _head_and_tail(text: str, keep: int) -> str:
    lines = text.rstrip("\n").splitlines()
    if len(lines) <= keep:
        return text
    half = keep // 2
    cut = len(lines) - 2 * half
    return "\n".join([*lines[:half], f"… {cut} lines (--full shows them)", *lines[-half:]])


# -- small helpers ---------------------------------------------------------------------------


def _trim(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` within ``max_chars``: its head and tail, and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    tail = max_chars // 3
    head = max_chars - tail
    cut = len(text) - head - tail
    return f"{text[:head]}\n… [{cut} characters cut] …\n{text[len(text) - tail :]}", True


def _blocks(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        yield {"type": "text", "text": content}
    elif isinstance(content, list):
        yield from (b for b in content if isinstance(b, dict))


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return _clip(line.strip(), TITLE_CHARS)
    return ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _float(v: Any) -> float | None:
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None
