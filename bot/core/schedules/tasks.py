"""A task file (``.github/loop-tasks/<name>.md``): what a schedule runs.

YAML front matter between ``---`` lines, then the body (Markdown), as the issue's body::

    ---
    title: Shrink the test suite's runtime
    loop:                  # optional: this task's runs in place of loop.yml's values
      metric: {command: python3 bench.py, direction: lower, scope: ['src/**']}
    ---
    Make the suite faster without dropping a test.

The text is read at the default branch's head when a run starts: being there (a writer
merged it) is its approval, as ``loop.yml``'s own keys are approved. Pure: parsing and the
issue's text; the reading is in ``jobs/schedules.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from bot.core.repo_config import TaskSettings
from bot.core.schedules import slots

MAX_TITLE = 200
# GitHub's issue body holds 65,536 characters; the footer and loopbot's marker need room.
MAX_BODY = 60_000
_KEYS = frozenset({"title", "loop"})


class TaskError(ValueError):
    """The task file is missing or breaks its format; ``problems`` say where."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Task:
    path: str
    title: str
    body: str
    settings: TaskSettings

    @property
    def kind(self) -> str:
        return self.settings.loop_kind

    def settings_dict(self) -> dict[str, Any]:
        """The ``loop:`` settings as the loop record keeps them (only those set)."""
        return self.settings.model_dump(exclude_none=True)


def parse(path: str, text: str | None) -> Task:
    """The task file ``path`` holding ``text`` (None: there is no such file)."""
    if text is None:
        raise TaskError([f"`{path}` is not on the default branch"])
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "---":
        raise TaskError([f"`{path}` starts with a `---` line, then `title:`"])
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise TaskError([f"`{path}`: the front matter has no closing `---` line"]) from None
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise TaskError([f"`{path}`: the front matter is not valid YAML: {exc}"]) from None
    if not isinstance(meta, dict):
        raise TaskError([f"`{path}`: the front matter is a mapping (`title:`, `loop:`)"])
    problems = [f"`{path}`: `{k}`: unknown key" for k in sorted(set(map(str, meta)) - _KEYS)]
    title = meta.get("title")
    if not isinstance(title, str) or not title.strip():
        problems.append(f"`{path}`: `title`: required, a line of text")
    elif len(title) > MAX_TITLE or "\n" in title.strip():
        problems.append(f"`{path}`: `title`: one line of at most {MAX_TITLE} characters")
    body = "\n".join(lines[end + 1 :]).strip()
    if not body:
        problems.append(f"`{path}`: the body (after the front matter) says what to do; it is empty")
    elif len(body) > MAX_BODY:
        problems.append(f"`{path}`: the body is {len(body)} characters; at most {MAX_BODY}")
    settings = TaskSettings()
    try:
        settings = TaskSettings.model_validate(meta.get("loop") or {})
    except ValidationError as exc:
        for err in exc.errors():
            key = ".".join(str(p) for p in ("loop", *err["loc"]))
            if err["type"] == "extra_forbidden":
                problems.append(f"`{path}`: `{key}`: unknown key")
            else:
                problems.append(f"`{path}`: `{key}`: {err['msg']}")
    if problems:
        raise TaskError(problems)
    assert isinstance(title, str)
    return Task(path, title.strip(), body, settings)


def issue_body(task: Task, *, cron: str, slot: float, commit: str, branch: str) -> str:
    """The run's issue body: the task's text, and a line saying where it came from and
    which commit approved it (the agent reads it too: it is part of the approved text)."""
    return (
        f"{task.body}\n\n---\n"
        f"Scheduled loop: `{cron}` (UTC) in `.github/loop.yml`, slot {slots.iso(slot)}. "
        f"The text is `{task.path}` as of commit {commit} on `{branch}`, which approved it."
    )
