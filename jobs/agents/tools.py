"""The agent's client tools, executed by the harness: Anthropic's ``bash`` and text
editor tool types. Commands run in the sandbox. File edits run here, in the worker, on
files the agent controls, so they go through :mod:`jobs.sandbox.safefs`: confined to the
worktree (symlinks followed only inside it, never for the file written), regular files
only, bounded reads and writes. Anything bigger or stranger is left to bash.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, TypeGuard

from jobs.sandbox import safefs
from jobs.sandbox.bwrap import Sandbox

BASH_TOOL = {"type": "bash_20250124", "name": "bash"}
EDITOR_TOOL = {
    "type": "text_editor_20250728",
    "name": "str_replace_based_edit_tool",
    "max_characters": 20000,
}
TOOLS = [BASH_TOOL, EDITOR_TOOL]
MAX_VIEW = 20000  # characters of a view (the tool's max_characters)
MAX_VIEW_READ = 2 * 1024 * 1024  # bytes a file view reads at most
MAX_EDIT = 4 * 1024 * 1024  # bytes of a file str_replace/insert/create handle at most
MAX_LIST = 1000  # entries of a directory view


class ToolError(Exception):
    pass


class ToolBox:
    def __init__(self, worktree: Path, sandbox: Sandbox) -> None:
        self.root = worktree.resolve()
        self.sandbox = sandbox

    def run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """Execute one tool call; returns (text for the model, is_error)."""
        try:
            if name == "bash":
                return self._bash(args)
            if name == "str_replace_based_edit_tool":
                try:
                    return self._edit(args), False
                except OSError as exc:  # the worktree is the agent's: anything can fail
                    return f"{args.get('command')} failed: {exc.strerror or exc}", True
            return f"unknown tool {name!r}", True
        except (ToolError, safefs.AccessError) as exc:
            return str(exc), True

    def _bash(self, args: dict[str, Any]) -> tuple[str, bool]:
        if args.get("restart"):
            return "bash restarted (every command runs in a fresh shell in the repository)", False
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("bash needs a `command`")
        r = self.sandbox.run(command)
        text = r.output if r.output.strip() else "(no output)"
        if r.exit_code != 0:
            text += f"\n[exit code {r.exit_code}]"
        return text, r.exit_code != 0

    def _path(self, raw: Any, *, write: bool = False) -> Path:
        if not isinstance(raw, str) or not raw:
            raise ToolError("a `path` is required")
        return safefs.resolve(self.root, raw, write=write)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def _edit(self, args: dict[str, Any]) -> str:
        cmd = args.get("command")
        if cmd == "view":
            return self._view(args)
        if cmd == "create":
            content = args.get("file_text")
            if not isinstance(content, str):
                raise ToolError("create needs `file_text`")
            path = self._path(args.get("path"), write=True)
            self._write(path, content)
            return f"created {self._rel(path)}"
        if cmd == "str_replace":
            old, replacement = args.get("old_str"), args.get("new_str", "")
            if not isinstance(old, str) or not isinstance(replacement, str):
                raise ToolError("str_replace needs `old_str` and `new_str`")
            if not old:
                raise ToolError("str_replace needs a non-empty `old_str`")
            path = self._path(args.get("path"), write=True)
            rel = self._rel(path)
            text = self._read_for_edit(path)
            count = text.count(old)
            if count == 0:
                raise ToolError(f"no match for old_str in {rel}")
            if count > 1:
                raise ToolError(f"old_str matches {count} times in {rel}; make it unique")
            self._write(path, text.replace(old, replacement, 1))
            return f"edited {rel}"
        if cmd == "insert":
            line = args.get("insert_line")
            new = args.get("insert_text", args.get("new_str"))
            if not _is_int(line) or not isinstance(new, str):
                raise ToolError("insert needs `insert_line` (an integer) and `insert_text`")
            path = self._path(args.get("path"), write=True)
            text = self._read_for_edit(path)
            known = _count_lines(text)
            if not 0 <= line <= known:
                raise ToolError(f"insert_line {line} is outside 0..{known}")
            at = _line_offset(text, line)
            before = text[:at] + ("\n" if at and text[at - 1] != "\n" else "")
            new = new if new.endswith("\n") else new + "\n"
            self._write(path, before + new + text[at:])
            return f"inserted into {self._rel(path)} after line {line}"
        raise ToolError(f"unknown editor command {cmd!r}")

    def _view(self, args: dict[str, Any]) -> str:
        path = self._path(args.get("path"))
        rel = self._rel(path)
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)  # resolved: no symlink left
        except FileNotFoundError:
            raise ToolError(f"{rel} does not exist") from None
        if is_dir:
            if args.get("view_range") is not None:
                raise ToolError("view_range only applies to files, and this is a directory")
            listing = safefs.list_dir(path, root=self.root, depth=2, limit=MAX_LIST)
            prefix = "" if rel == "." else rel + "/"
            shown = "\n".join(prefix + e for e in listing.entries) or "(empty directory)"
            if listing.omitted or listing.incomplete:
                more = "more than " if listing.incomplete else ""
                shown += (
                    f"\n[{more}{listing.omitted} more entries not shown; "
                    "list subdirectories, or use bash (find, ls)]"
                )
            return shown
        text, got = safefs.read_text(path, MAX_VIEW_READ, root=self.root)
        if got.truncated and 0 <= text.rfind("\n") < len(text) - 1:
            text = text[: text.rfind("\n") + 1]  # cut mid-line: keep whole lines only
        known = _count_lines(text)  # never a list of lines: there may be millions
        if known == 0:
            return "(empty file)"
        start, end = 1, known
        rng = args.get("view_range")
        if rng is not None:
            start, end = _view_range(rng, known, got.truncated, got.size)
        out: list[str] = []
        size = 0
        shown_to = start - 1
        pos = _line_offset(text, start - 1)
        while shown_to < end and size <= MAX_VIEW:
            nl = text.find("\n", pos)
            stop = len(text) if nl < 0 else nl
            shown_to += 1
            out.append(f"{shown_to:6}\t{text[pos : min(stop, pos + MAX_VIEW)]}")
            size += len(out[-1]) + 1
            pos = stop + 1
        view = "\n".join(out)
        notes: list[str] = []
        if len(view) > MAX_VIEW:
            view = view[:MAX_VIEW]
            notes.append(f"output cut at {MAX_VIEW} characters, in line {shown_to}")
        elif shown_to < end:
            notes.append(f"shown up to line {shown_to}")
        if got.truncated:
            notes.append(
                f"the file is {got.size} bytes and only its first {len(got.data)}, "
                f"{known} line(s), were read"
            )
        if notes:
            view += "\n[truncated: " + "; ".join(notes)
            view += ". Use view_range, or bash (sed -n, grep -n).]"
        return view

    def _read_for_edit(self, path: Path) -> str:
        try:
            got = safefs.read_file(path, MAX_EDIT, root=self.root, whole=True)
        except safefs.TooLarge as exc:
            raise ToolError(
                f"{exc}: the editor changes files up to {MAX_EDIT} bytes. "
                "Use bash instead (sed, or a python script) in the sandbox."
            ) from None
        if got.truncated:  # grew while being read
            raise ToolError(f"{self._rel(path)} changed while being read; try again")
        return got.data.decode("utf-8", "surrogateescape")

    def _write(self, path: Path, content: str) -> None:
        try:
            safefs.write_text(
                path, content, self.sandbox.file_owner, root=self.root, max_bytes=MAX_EDIT
            )
        except safefs.TooLarge as exc:
            raise ToolError(f"{exc}. Write large files with bash in the sandbox.") from None


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _count_lines(text: str) -> int:
    """Lines in ``text``; only ``\\n`` ends a line (as for sed and grep -n)."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _line_offset(text: str, n: int) -> int:
    """Where the line after the first ``n`` lines starts (len(text) past the end)."""
    pos = 0
    for _ in range(n):
        nl = text.find("\n", pos)
        if nl < 0:
            return len(text)
        pos = nl + 1
    return pos


def _view_range(rng: Any, known: int, truncated: bool, size: int) -> tuple[int, int]:
    if not (isinstance(rng, list | tuple) and len(rng) == 2 and all(_is_int(v) for v in rng)):
        raise ToolError("view_range must be two integers, [start_line, end_line]")
    start, end = int(rng[0]), int(rng[1])
    beyond = (
        f"; the editor reads only the first {known} line(s) of this {size}-byte file, "
        "use bash (sed -n) for the rest"
        if truncated
        else ""
    )
    if start < 1 or start > max(known, 1):
        raise ToolError(f"view_range start {start} is outside 1..{known}{beyond}")
    if end == -1:
        return start, known
    if end < start:
        raise ToolError(f"view_range end {end} is before its start {start} (use -1 for the end)")
    if end > known:
        raise ToolError(f"view_range end {end} is beyond the last line, {known}{beyond}")
    return start, end
