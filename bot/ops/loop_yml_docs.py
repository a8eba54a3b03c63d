"""docs/loop-yml.md, generated from the model that parses ``.github/loop.yml``.

``python -m bot.ops.loop_yml_docs`` writes it; ``--check`` exits 1 when the committed
file differs from what this writes now, and tests/unit/test_docs.py asserts the same, so
the reference cannot drift from what the worker reads. Each key's description is its
field's docstring in ``bot/core/repo_config.py``; types, defaults and limits are read from
the fields themselves, and the operator's ceilings from ``repo_config.CAPS``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from bot.core.repo_config import (
    CAPS,
    MAX_SCHEDULES,
    STEP_CAP,
    RepoConfig,
    TaskSettings,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "loop-yml.md"
COMMAND = "python -m bot.ops.loop_yml_docs"
_CEILING = {key: env for key, _, env in CAPS}


@dataclass(frozen=True)
class Key:
    """One documented key: its dotted path in the file and its field."""

    path: str
    info: FieldInfo


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, directly or as an optional section."""
    for arg in (annotation, *get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def walk(model: type[BaseModel], prefix: str = "") -> Iterator[Key]:
    """Every key of ``model``, sections before what they hold, in the model's order.
    A mapping of models (``agent.mcp_servers``) is walked under ``<name>``, a list of
    models (``schedules``) under ``[]``."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield Key(path, info)
        annotation = info.annotation
        origin = get_origin(annotation)
        if origin is dict:
            inner = _model_of(get_args(annotation)[1])
            if inner is not None:
                yield from walk(inner, f"{path}.<name>.")
        elif origin is tuple:
            inner = _model_of(get_args(annotation)[0])
            if inner is not None:
                yield from walk(inner, f"{path}[].")
        elif (inner := _model_of(annotation)) is not None:
            yield from walk(inner, f"{path}.")


def all_keys() -> frozenset[str]:
    """Every key a ``loop.yml`` may hold, dotted (what the docs test checks names against)."""
    return frozenset(k.path for k in walk(RepoConfig))


def _type(annotation: Any) -> str:
    if annotation is type(None):
        return ""
    if _is_union(annotation):
        parts = [_type(a) for a in get_args(annotation)]
        return " or ".join(p for p in parts if p)
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin is tuple:
        return f"list of {_type(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping of {_type(key)} to {_type(value)}".replace(
            "string to section", "name to section"
        )
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def _value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, tuple | list):
        return "`[]`" if not v else "`[" + ", ".join(f'"{x}"' for x in v) + "]`"
    if isinstance(v, dict):
        return "none" if not v else f"`{v}`"
    if isinstance(v, BaseModel):
        return ""
    return f"`{v}`"


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        return _value(info.default_factory())  # type: ignore[call-arg]
    return _value(info.default)


def _limits(info: FieldInfo) -> str:
    # A string's length is in characters; a list's or a mapping's, in entries.
    text = info.annotation is str or (
        _is_union(info.annotation) and str in get_args(info.annotation)
    )

    def many(n: int) -> str:
        if text:
            return f"{n} character" + ("" if n == 1 else "s")
        return f"{n} entr" + ("y" if n == 1 else "ies")

    # Each constraint pydantic keeps (annotated_types' Ge, MaxLen...) by its attribute.
    words = []
    for m in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if (bound := getattr(m, attr, None)) is not None:
                words.append(f"{sign} {bound}")
        if (least := getattr(m, "min_length", None)) is not None and least > 0:
            words.append(f"at least {many(least)}")
        if (most := getattr(m, "max_length", None)) is not None:
            words.append(f"at most {many(most)}")
    return ", ".join(words)


def _text(info: FieldInfo) -> str:
    return " ".join((info.description or "").split()).replace("|", "\\|")


def _table(rows: list[Key], ceilings: bool = True) -> list[str]:
    head = "| key | type | default | limits | operator's ceiling | meaning |"
    out = [head, "| --- | --- | --- | --- | --- | --- |"]
    for k in rows:
        ceiling = f"`{_CEILING[k.path]}`" if k.path in _CEILING and ceilings else ""
        limits = _limits(k.info)
        if k.path == "max_steps":  # the harness's own ceiling, whatever the file asks
            limits += f"; the harness makes at most {STEP_CAP}"
        out.append(
            f"| `{k.path}` | {_type(k.info.annotation)} | {_default(k.info)} | "
            f"{limits} | {ceiling} | {_text(k.info)} |"
        )
    return out


def render() -> str:
    """The whole page, as committed in docs/loop-yml.md."""
    every = list(walk(RepoConfig))
    top = [k for k in every if "." not in k.path and "[" not in k.path]
    lines = [
        "# `.github/loop.yml` reference",
        "",
        f"<!-- Generated by `{COMMAND}` from bot/core/repo_config.py; do not edit by hand:",
        "tests/unit/test_docs.py fails when this file differs from what the script writes. -->",
        "",
        "A repository's contract with loopbot, read from its default branch and validated",
        "strictly: unknown keys are errors (the issue gets one comment naming them, and no",
        "loop runs). Only `verify` is required. `loopbot doctor --config path/to/loop.yml`",
        "checks a file the way the worker reads it. How the keys are used is in",
        "[repositories.md](repositories.md).",
        "",
        "A value above its *operator's ceiling* (an environment variable of the worker, see",
        "[operating.md](operating.md#operator-ceilings)) is lowered to it, and one comment on",
        "the issue says so; `merge.protected_paths` always holds `.github/**`. Sections",
        "(`agent`, `critic`, ...) are YAML mappings; `schedules` is a list of mappings,",
        "written `schedules[].cron` below; `agent.mcp_servers` maps a server's name to its",
        "settings, written `agent.mcp_servers.<name>.command` below.",
        "",
        "## Top level",
        "",
    ]
    lines += _table([k for k in top if _model_of(k.info.annotation) is None])
    for section in (k for k in top if _model_of(k.info.annotation) is not None):
        rows = [k for k in every if k.path.startswith((f"{section.path}.", f"{section.path}["))]
        lines += ["", f"## `{section.path}`", "", _text(section.info)]
        if section.info.default is None and not section.info.is_required():
            lines += ["", "Optional: absent, there is none."]
        lines += ["", *_table(rows)]
    # A task's ``loop.metric`` is a whole ``metric`` section, whose keys are listed above.
    tasks = [k for k in walk(TaskSettings, "loop.") if not k.path.startswith("loop.metric.")]
    lines += [
        "",
        "## A task file's `loop:`",
        "",
        f"A scheduled task file (`schedules[].task`; at most {MAX_SCHEDULES} schedules) may",
        "open with YAML front matter whose `loop:` changes these for the task's runs only,",
        "within the same ceilings:",
        "",
        *_table(tasks, ceilings=False),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if DOC.read_text() != text:
            sys.stderr.write(f"{DOC} is out of date: run {COMMAND}\n")
            return 1
        return 0
    DOC.write_text(text)
    sys.stdout.write(f"wrote {DOC}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
