"""The house rules, read from the source: every module under bot/ and jobs/ is parsed with
``ast`` (nothing is imported, so nothing is executed) and checked, one case per module.

- Layers: ``bot.core`` imports only core; ``bot.io`` core and io; ``bot.web`` core, io and
  web; ``jobs`` core, io and jobs; ``bot.standins`` core and standins; ``bot.ops`` anything.
  Every import counts, wherever it is: at the top, in a function, under TYPE_CHECKING.
- Rooms: ``jobs`` is rooms by concern (``jobs/<room>/``, a package each) and a few modules
  that serve every room, each named below. A room imports only the rooms ``ROOMS`` allows
  it and the shared modules; a shared module imports only shared modules; the modules on
  top (the job entry points, dispatch, the reconciler) import anything in ``jobs``. A new
  module of ``jobs/`` outside a room, or not named here, fails.
- No import cycle among bot/jobs modules, counting function-level imports (a lazy import
  hides a cycle from Python, not from this test); type-only imports do not count.
- No function-level import of a bot/jobs module outside bot/ops (whose CLI imports lazily
  for start-up time) and bot/standins; ``if TYPE_CHECKING:`` imports are allowed anywhere.
- A loop's key is built by ``LoopId`` (bot/core/ids.py) alone: no ``f"{...}#{...}"``.
- A loop's status is written by the lifecycle modules alone: no ``x.status = ...``, no
  ``status=Status.X`` argument, no ``{"status": Status.X}`` update.
- A job names its function by reference: no string ``"jobs.<module>.<function>"`` naming
  where a job function lives, but the command entry point the web enqueues without
  importing jobs (``COMMAND_ENTRY``); the other wire names in bot/io/queues.py name no
  module of today's tree (they are release 0.1.0's paths, run by registration).

Failure messages name each offence as ``path:line``.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGES = ("bot", "jobs")

# Which layers each layer may import (None: any). A layer is ``jobs`` or ``bot.<part>``.
ALLOWED: dict[str, frozenset[str] | None] = {
    "bot": frozenset(),  # bot/__init__.py: the namespace, importing nothing
    "bot.core": frozenset({"bot.core"}),
    "bot.io": frozenset({"bot.core", "bot.io"}),
    "bot.web": frozenset({"bot.core", "bot.io", "bot.web"}),
    "jobs": frozenset({"bot.core", "bot.io", "jobs"}),
    "bot.standins": frozenset({"bot.core", "bot.standins"}),
    "bot.ops": None,
}
# Where a function-level import of a bot/jobs module is allowed: the CLI imports lazily
# for start-up time; the stand-ins are test and demo scaffolding, not the product.
LAZY_IMPORTS_ALLOWED = ("bot.ops", "bot.standins")

# The rooms of jobs/ (low to high), each with the rooms it may import besides itself and the
# shared modules. The graph has no circle: a room may never import a room that imports it.
ROOMS: dict[str, frozenset[str]] = {
    "jobs.sandbox": frozenset(),  # bubblewrap, cgroups, egress, safe file access
    "jobs.tree": frozenset(),  # git, the mirrors and worktrees, the tree's files
    "jobs.gateway": frozenset({"jobs.sandbox"}),  # the model gateway, both APIs
    "jobs.runtime": frozenset({"jobs.gateway"}),  # what a worker builds once (one module)
    "jobs.agents": frozenset({"jobs.gateway", "jobs.sandbox"}),  # built-in and CLI agents
    "jobs.intake": frozenset({"jobs.runtime"}),  # triage, the plan, structured calls
    "jobs.review": frozenset(  # the critic and the merge gate
        {"jobs.agents", "jobs.runtime", "jobs.sandbox", "jobs.tree"}
    ),
    "jobs.loop": frozenset(  # the loop job and its parts
        {"jobs.agents", "jobs.intake", "jobs.review", "jobs.runtime", "jobs.sandbox", "jobs.tree"}
    ),
}
# Modules directly in jobs/ that serve every room: below every room, importing none.
SHARED = frozenset(
    {
        "jobs.check_runs",  # the loop's and the critic's check runs, written beside the job
        "jobs.drain",  # SIGTERM becomes a hand-over
        "jobs.lifecycle",  # every status change
        "jobs.merge_slot",  # one merge at a time per repository (lifecycle frees it)
        "jobs.models",  # the Models API's answers
        "jobs.precall",  # the budget check before every model call
        "jobs.retries",  # the critic's and the gate's way through failures
        "jobs.spend",  # the spend caps above the loop, before every model call
        "jobs.status_comment",  # the status comment
    }
)
# Modules directly in jobs/ above every room: the job entry points and what starts jobs.
TOP = frozenset({"jobs.dispatch", "jobs.entry", "jobs.reconciler", "jobs.schedules"})
SHARED_ROOM, TOP_ROOM = "jobs (shared)", "jobs (top)"
LOOP_KEY_BUILDER = "bot/core/ids.py"
STATUS_WRITERS = ("jobs/lifecycle.py", "bot/core/rules/lifecycle.py")
# The one job named by a string: bot/web must not import jobs, so it cannot pass the function.
COMMAND_ENTRY = ("bot/io/queues.py", "COMMAND_ENTRY")

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class Module:
    name: str  # dotted: bot.core.ids
    path: str  # relative to the repository: bot/core/ids.py
    tree: ast.Module

    @property
    def package(self) -> str:
        """The package a relative import in this module starts from."""
        return self.name if self.path.endswith("__init__.py") else self.name.rpartition(".")[0]

    @classmethod
    def parse(cls, name: str, path: str, source: str) -> Module:
        return cls(name, path, ast.parse(source, filename=path))

    def at(self, node: ast.AST) -> str:
        return f"{self.path}:{getattr(node, 'lineno', 0)}"


@dataclass(frozen=True)
class Import:
    target: str  # the bot/jobs module imported (the package for ``from p import name``)
    node: ast.stmt
    in_function: bool
    type_only: bool  # under ``if TYPE_CHECKING:``: never executed


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name, rel = _module_name(path), path.relative_to(ROOT).as_posix()
            found[name] = Module.parse(name, rel, path.read_text(encoding="utf-8"))
    return found


def layer(name: str) -> str:
    parts = name.split(".")
    return "jobs" if parts[0] == "jobs" else ".".join(parts[:2])


def room(name: str) -> str | None:
    """The room of a ``jobs`` module: its package under jobs/, ``jobs.runtime``, or the
    shared or top modules; None for a module of jobs/ that is in no room."""
    parts = name.split(".")
    if len(parts) > 2:  # in a package under jobs/: a room only if ROOMS names it
        return ".".join(parts[:2]) if ".".join(parts[:2]) in ROOMS else None
    if name in ROOMS:  # a room of one module (jobs.runtime), or a room's package
        return name
    if name in SHARED:
        return SHARED_ROOM
    # The package itself is on top: ``import jobs`` reaches every room through attributes.
    return TOP_ROOM if name in TOP or name == "jobs" else None


def internal(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def walk(
    node: ast.AST, in_function: bool = False, type_only: bool = False
) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node under ``node``, with whether it is inside a function and whether it is
    under ``if TYPE_CHECKING:`` (its body, not its ``else``)."""
    yield node, in_function, type_only
    for field, value in ast.iter_fields(node):
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from walk(
                    child,
                    in_function or isinstance(node, FUNCTION_NODES),
                    type_only
                    or (
                        isinstance(node, ast.If)
                        and field == "body"
                        and _is_type_checking(node.test)
                    ),
                )


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: Module, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The bot/jobs modules an import statement loads: ``from p import m`` loads the
    module ``p.m`` when there is one, else the package ``p`` (``m`` is a name in it)."""
    known = modules()
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _resolve(module, node)
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
            for alias in node.names
        ]
    return [name for name in dict.fromkeys(names) if internal(name)]


@cache
def imports(name: str) -> tuple[Import, ...]:
    return imports_of(modules()[name])


def imports_of(module: Module) -> tuple[Import, ...]:
    out = []
    for node, in_function, type_only in walk(module.tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _targets(module, node):
                out.append(Import(target, node, in_function, type_only))
    return tuple(out)


MODULES = sorted(modules())


def offences(found: list[str]) -> str:
    return "\n".join(["", *found])


# -- imports ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODULES)
def test_imports_follow_the_layers(name: str) -> None:
    module = modules()[name]
    own = layer(name)
    assert own in ALLOWED, f"{module.path}: {name} is in no layer ({', '.join(ALLOWED)})"
    allowed = ALLOWED[own]
    if allowed is None:
        return
    bad = [
        f"{module.at(i.node)}: imports {i.target} ({own} may import only "
        f"{', '.join(sorted(allowed)) or 'nothing of bot or jobs'})"
        for i in imports(name)
        if layer(i.target) not in allowed
    ]
    assert not bad, offences(bad)


JOBS_MODULES = [name for name in MODULES if layer(name) == "jobs"]


@pytest.mark.parametrize("name", JOBS_MODULES)
def test_jobs_imports_follow_the_rooms(name: str) -> None:
    module = modules()[name]
    own = room(name)
    assert own is not None, (
        f"{module.path}: {name} is in no room of jobs/ (put it in a room: "
        f"{', '.join(sorted(ROOMS))}; or name it in SHARED or TOP in {__file__})"
    )
    if own == TOP_ROOM:
        return
    allowed = {own, SHARED_ROOM} | (ROOMS.get(own, frozenset()))
    bad = [
        f"{module.at(i.node)}: {name} ({own}) imports {i.target} ({room(i.target)}); "
        f"{own} may import only {', '.join(sorted(allowed))}"
        for i in imports(name)
        if layer(i.target) == "jobs" and room(i.target) not in allowed
    ]
    assert not bad, offences(bad)


def test_the_rooms_draw_no_circle() -> None:
    """A room may not import a room that imports it, through any number of rooms."""
    for start in ROOMS:
        seen, todo = set(), list(ROOMS[start])
        while todo:
            here = todo.pop()
            assert here != start, f"{start} can reach itself through the rooms it may import"
            if here not in seen:
                seen.add(here)
                todo.extend(ROOMS.get(here, ()))


def test_every_room_is_a_package_on_disk() -> None:
    for name in ROOMS:
        path = ROOT / name.replace(".", "/")
        assert path.is_dir() or path.with_suffix(".py").is_file(), f"{name}: no such room"
    loose = sorted(p.stem for p in (ROOT / "jobs").glob("*.py") if p.stem != "__init__")
    assert {f"jobs.{n}" for n in loose} == SHARED | TOP | {"jobs.runtime"}, loose
    # A folder is a room (with or without an __init__.py, Python imports it).
    folders = {
        f"jobs.{p.name}"
        for p in (ROOT / "jobs").iterdir()
        if p.is_dir() and p.name != "__pycache__"
    }
    assert folders <= set(ROOMS), (
        f"folders of jobs/ that are no room: {sorted(folders - set(ROOMS))}"
    )


# A folder of more than this many modules has stopped drawing itself: its concerns want
# rooms of their own (the flat jobs/ of 45 modules was the case in point; bot/core/rules at
# 23 and the local GitHub at 17 were split the same way).
MAX_ROOM_MODULES = 15


def test_no_room_outgrows_itself() -> None:
    """Each folder of bot/ and jobs/ (a room of jobs/, jobs/ itself, a layer's part such
    as bot/core/rules or the local GitHub) holds at most ``MAX_ROOM_MODULES`` modules."""
    sizes: dict[str, int] = {}
    for name in MODULES:
        if modules()[name].path.endswith("__init__.py"):
            continue
        folder = name.rsplit(".", 1)[0]
        sizes[folder] = sizes.get(folder, 0) + 1
    big = {where: n for where, n in sizes.items() if n > MAX_ROOM_MODULES}
    assert not big, f"rooms past {MAX_ROOM_MODULES} modules (split them): {big}"
    # It counted: the biggest rooms as they are.
    assert sizes["jobs.loop"] >= 10 and sizes["jobs"] >= 10 and sizes["bot.io.github"] >= 10, sizes


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("jobs.loop.job", "jobs.loop"),
        ("jobs.sandbox", "jobs.sandbox"),
        ("jobs.runtime", "jobs.runtime"),
        ("jobs.lifecycle", SHARED_ROOM),
        ("jobs.entry", TOP_ROOM),
        ("jobs", TOP_ROOM),  # ``import jobs``: every room through attributes
        ("jobs.newthing", None),
        ("jobs.newroom.x", None),  # a folder that no ROOMS entry names
    ],
)
def test_a_module_is_put_in_its_room(name: str, expected: str | None) -> None:
    assert room(name) == expected


@pytest.mark.parametrize("name", MODULES)
def test_no_function_level_import(name: str) -> None:
    module = modules()[name]
    if layer(name) in LAZY_IMPORTS_ALLOWED:
        return
    bad = [
        f"{module.at(i.node)}: imports {i.target} inside a function (import it at the top; "
        "a lazy import that hides a cycle is still a cycle)"
        for i in imports(name)
        if i.in_function and not i.type_only
    ]
    assert not bad, offences(bad)


def graph() -> dict[str, dict[str, ast.stmt]]:
    """Module -> the bot/jobs modules it imports (top-level, in functions, and under ``if
    TYPE_CHECKING:`` too: a cycle that only type checking closes is still two modules
    that cannot be understood apart), each with the first statement that does."""
    edges: dict[str, dict[str, ast.stmt]] = {name: {} for name in modules()}
    for name in modules():
        for i in imports(name):
            if i.target in edges and i.target != name:
                edges[name].setdefault(i.target, i.node)
    return edges


def shortest_cycle(start: str, edges: dict[str, dict[str, ast.stmt]]) -> list[str] | None:
    """The shortest import path from ``start`` back to itself, or None."""
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        here = todo.popleft()
        for there in edges[here]:
            if there == start:
                path = [here]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if there not in came_from:
                came_from[there] = here
                todo.append(there)
    return None


@pytest.mark.parametrize("name", MODULES)
def test_no_import_cycle(name: str) -> None:
    edges = graph()
    cycle = shortest_cycle(name, edges)
    if cycle is None:
        return
    steps = [
        f"{modules()[a].at(edges[a][b])}: {a} imports {b}" for a, b in itertools.pairwise(cycle)
    ]
    pytest.fail(f"{name} is on an import cycle: {' -> '.join(cycle)}" + offences(steps))


# -- conventions ------------------------------------------------------------------------------


def _hand_built_key(node: ast.JoinedStr) -> bool:
    """``f"{...}#{...}"``: a ``#`` standing alone between two interpolations."""
    parts = node.values
    return any(
        isinstance(part, ast.Constant)
        and part.value == "#"
        and isinstance(parts[i - 1], ast.FormattedValue)
        and isinstance(parts[i + 1], ast.FormattedValue)
        for i, part in enumerate(parts[1:-1], start=1)
    )


@pytest.mark.parametrize("name", MODULES)
def test_loop_keys_are_built_by_loop_id(name: str) -> None:
    module = modules()[name]
    if module.path == LOOP_KEY_BUILDER:
        return
    bad = [
        f"{module.at(node)}: builds a loop key by hand ({ast.unparse(node)}); use LoopId(...).key"
        for node, _, _ in walk(module.tree)
        if isinstance(node, ast.JoinedStr) and _hand_built_key(node)
    ]
    assert not bad, offences(bad)


def _status_writes(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    for node, _, _ in walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):  # tuple targets: r.status, r.reason = ...
                    # ``self.status`` is an object's own field (an HTTP error's status), not
                    # a loop record written from outside.
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr == "status"
                        and not (isinstance(t.value, ast.Name) and t.value.id == "self")
                    ):
                        yield node, f"assigns {ast.unparse(t)}"
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "status" and _is_status_member(kw.value):
                    yield node, f"passes status={ast.unparse(kw.value)}"
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == "status"
            ):
                yield node, "setattr(..., 'status', ...)"
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "status"
                    and _is_status_member(value)
                ):
                    yield node, f'writes {{"status": {ast.unparse(value)}}}'


def _is_status_member(node: ast.expr) -> bool:
    """``Status.X`` (or ``record.Status.X``)."""
    return isinstance(node, ast.Attribute) and (
        (isinstance(node.value, ast.Name) and node.value.id == "Status")
        or (isinstance(node.value, ast.Attribute) and node.value.attr == "Status")
    )


@pytest.mark.parametrize("name", MODULES)
def test_status_is_written_only_by_the_lifecycle(name: str) -> None:
    module = modules()[name]
    if module.path in STATUS_WRITERS:
        return
    bad = [
        f"{module.at(node)}: {what} (a loop's status changes only in {' or '.join(STATUS_WRITERS)})"
        for node, what in _status_writes(module.tree)
    ]
    assert not bad, offences(bad)


@cache
def module_functions() -> dict[str, frozenset[str]]:
    """The functions each module defines at its top level, by dotted module name."""
    return {
        name: frozenset(
            n.name
            for n in module.tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        )
        for name, module in modules().items()
    }


def _command_entry(module: Module) -> ast.AST | None:
    """The string ``COMMAND_ENTRY = "..."`` assigns, in the module that may have it."""
    path, constant = COMMAND_ENTRY
    if module.path != path:
        return None
    for node in module.tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and any(
            isinstance(t, ast.Name) and t.id == constant
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        ):
            return node.value
    return None


@pytest.mark.parametrize("name", MODULES)
def test_jobs_are_not_named_by_strings(name: str) -> None:
    module = modules()[name]
    allowed = _command_entry(module)
    functions = module_functions()
    bad = []
    for node, _, _ in walk(module.tree):
        if node is allowed or not isinstance(node, ast.Constant):
            continue
        if isinstance(node.value, str) and node.value.startswith("jobs."):
            owner, _, function = node.value.rpartition(".")
            if function in functions.get(owner, ()):
                bad.append(
                    f"{module.at(node)}: names the job function {node.value!r} by a string; "
                    "pass the function (bot/io/queues.py: register, func_name)"
                )
    assert not bad, offences(bad)


@pytest.mark.parametrize("name", MODULES)
def test_rq_registries_come_from_a_queue(name: str) -> None:
    """An RQ registry built by hand reads jobs with RQ's default (pickle) serializer, and
    reading one cleans it up: an abandoned job is saved again, its meta as a pickle, and
    the RQ scheduler dies on it (tests/io/test_abandoned_jobs.py). A queue's own
    registries (``queue.started_job_registry``...) carry loopbot's JSON and job class."""
    bad = [
        f"{modules()[name].at(node)}: names an RQ registry class; use the queue's own "
        "(bot/io/queues.py: loop_queue(redis).started_job_registry...)"
        for node, _, _ in walk(modules()[name].tree)
        if (isinstance(node, ast.Name) and node.id.endswith("JobRegistry"))
        or (isinstance(node, ast.Attribute) and node.attr.endswith("JobRegistry"))
        or (
            isinstance(node, ast.ImportFrom)
            and any(alias.name.endswith("JobRegistry") for alias in node.names)
        )
    ]
    assert not bad, offences(bad)


def test_every_module_was_read() -> None:
    """The checks above saw the whole tree: both packages, their sub-packages, and the
    modules each rule has an exception for."""
    names = set(MODULES)
    assert {"bot.core.ids", "bot.io.queues", "bot.web.app", "bot.ops.cli", "jobs.loop.job"} <= names
    paths = {m.path for m in modules().values()}
    assert LOOP_KEY_BUILDER in paths and COMMAND_ENTRY[0] in paths
    assert set(STATUS_WRITERS) <= paths, set(STATUS_WRITERS) - paths
    assert _command_entry(modules()["bot.io.queues"]) is not None


# -- the checks themselves, on small sources ---------------------------------------------------


def snippet(source: str, name: str = "jobs.example") -> Module:
    return Module.parse(name, name.replace(".", "/") + ".py", source)


LAZY = """\
from typing import TYPE_CHECKING

from bot.core import ids
from bot.core.rules.loop import turns as t
from jobs.loop import job as loop

if TYPE_CHECKING:
    from bot.io.store import Store
else:
    import bot.io.redis


def f() -> None:
    from jobs.review.gate import refuse_closed
    from . import dispatch
    from .sandbox import bwrap
"""


def test_imports_are_found_with_where_they_are() -> None:
    found = [
        (i.target, i.node.lineno, i.in_function, i.type_only) for i in imports_of(snippet(LAZY))
    ]
    assert found == [
        ("bot.core.ids", 3, False, False),
        ("bot.core.rules.loop.turns", 4, False, False),
        ("jobs.loop.job", 5, False, False),
        ("bot.io.store", 8, False, True),
        ("bot.io.redis", 10, False, False),
        ("jobs.review.gate", 14, True, False),
        ("jobs.dispatch", 15, True, False),
        ("jobs.sandbox.bwrap", 16, True, False),
    ]


def test_a_cycle_is_found_shortest_first() -> None:
    stmt = ast.parse("import x").body[0]
    edges: dict[str, dict[str, ast.stmt]] = {
        "a": {"b": stmt, "c": stmt},
        "b": {"d": stmt},
        "c": {"a": stmt},
        "d": {"a": stmt},
        "e": {"a": stmt},
    }
    assert shortest_cycle("a", edges) == ["a", "c", "a"]
    assert shortest_cycle("b", edges) == ["b", "d", "a", "b"]
    assert shortest_cycle("e", edges) is None


@pytest.mark.parametrize(
    ("source", "hand_built"),
    [
        ('f"{repo}#{issue}"', True),
        ('f"{owner}/{name}#{n}"', True),
        ('f"merge gate {repo}#{issue} now"', True),
        ('f"PR #{n}"', False),
        ('f"{title}\\n\\n## {section}"', False),
        ('f"{a}-{b}"', False),
    ],
)
def test_a_hand_built_key_is_told_from_other_hashes(source: str, hand_built: bool) -> None:
    node = ast.parse(source, mode="eval").body
    assert isinstance(node, ast.JoinedStr)
    assert _hand_built_key(node) is hand_built


@pytest.mark.parametrize(
    ("source", "writes"),
    [
        ("record.status = Status.FAILED", ["assigns record.status"]),
        ("r.status, r.reason = s, why", ["assigns r.status"]),
        ("store.set_fields(key, status=Status.QUEUED)", ["passes status=Status.QUEUED"]),
        ("setattr(r, 'status', s)", ["setattr(..., 'status', ...)"]),
        ("r.model_copy(update={'status': Status.RUNNING})", ['writes {"status": Status.RUNNING}']),
        ("self.status = status", []),  # an object's own field
        ("check(status='completed')", []),  # not a loop's status
        ("answer = {'status': 'ok'}", []),
        ("if r.status == Status.FAILED: pass", []),
    ],
)
def test_a_status_write_is_told_from_a_read(source: str, writes: list[str]) -> None:
    assert [what for _, what in _status_writes(ast.parse(source))] == writes
