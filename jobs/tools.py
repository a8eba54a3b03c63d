"""The agent's client tools, executed by the harness: Anthropic's ``bash`` and text
editor tool types. Commands run in the sandbox; file edits are confined to the worktree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.sandbox import Sandbox

BASH_TOOL = {"type": "bash_20250124", "name": "bash"}
EDITOR_TOOL = {
    "type": "text_editor_20250728",
    "name": "str_replace_based_edit_tool",
    "max_characters": 20000,
}
TOOLS = [BASH_TOOL, EDITOR_TOOL]
MAX_VIEW = 20000


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
                return self._edit(args), False
            return f"unknown tool {name!r}", True
        except ToolError as exc:
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

    def _path(self, raw: Any) -> Path:
        if not isinstance(raw, str) or not raw:
            raise ToolError("a `path` is required")
        p = Path(raw)
        p = (self.root / p) if not p.is_absolute() else p
        resolved = p.resolve()
        if resolved != self.root and not resolved.is_relative_to(self.root):
            raise ToolError(f"{raw} is outside the repository at {self.root}")
        if resolved == self.root / ".git" or (self.root / ".git") in resolved.parents:
            raise ToolError("the .git directory is managed by the harness")
        return resolved

    def _edit(self, args: dict[str, Any]) -> str:
        cmd = args.get("command")
        path = self._path(args.get("path"))
        rel = path.relative_to(self.root).as_posix() or "."
        if cmd == "view":
            if path.is_dir():
                entries = sorted(
                    p.relative_to(self.root).as_posix() + ("/" if p.is_dir() else "")
                    for p in path.rglob("*")
                    if ".git" not in p.relative_to(self.root).parts
                    and len(p.relative_to(path).parts) <= 2
                )
                return "\n".join(entries[:1000]) or "(empty directory)"
            text = self._read(path)
            lines = text.splitlines()
            start, end = 1, len(lines)
            rng = args.get("view_range")
            if isinstance(rng, list) and len(rng) == 2:
                start = max(1, int(rng[0]))
                end = len(lines) if int(rng[1]) == -1 else min(len(lines), int(rng[1]))
            out = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, end + 1))
            return out[:MAX_VIEW] + ("\n[truncated]" if len(out) > MAX_VIEW else "")
        if cmd == "create":
            content = args.get("file_text")
            if not isinstance(content, str):
                raise ToolError("create needs `file_text`")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            return f"created {rel}"
        if cmd == "str_replace":
            old, replacement = args.get("old_str"), args.get("new_str", "")
            if not isinstance(old, str) or not isinstance(replacement, str):
                raise ToolError("str_replace needs `old_str` and `new_str`")
            text = self._read(path)
            count = text.count(old)
            if count == 0:
                raise ToolError(f"no match for old_str in {rel}")
            if count > 1:
                raise ToolError(f"old_str matches {count} times in {rel}; make it unique")
            path.write_text(text.replace(old, replacement, 1))
            return f"edited {rel}"
        if cmd == "insert":
            line = args.get("insert_line")
            new = args.get("insert_text", args.get("new_str"))
            if not isinstance(line, int) or not isinstance(new, str):
                raise ToolError("insert needs `insert_line` and `insert_text`")
            lines = self._read(path).splitlines(keepends=True)
            if not 0 <= line <= len(lines):
                raise ToolError(f"insert_line {line} is outside 0..{len(lines)}")
            lines.insert(line, new if new.endswith("\n") else new + "\n")
            path.write_text("".join(lines))
            return f"inserted into {rel} after line {line}"
        raise ToolError(f"unknown editor command {cmd!r}")

    def _read(self, path: Path) -> str:
        if not path.is_file():
            raise ToolError(f"{path.relative_to(self.root).as_posix()} is not a file")
        return path.read_text(errors="replace")
