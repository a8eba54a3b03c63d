"""Held-out verify: did the change make verify pass by changing what verify checks?

verify failed on the base; on the head it passes. That is a fix shown only if the tests
that failed are the tests that now pass. When the pull request changes files verify runs
(test files, their fixtures, the test runner's own configuration, files the verify
command names), the harness runs verify once more on the head with those files as they
are on the base: the code under the change, the tests as the writer approved them.
Failing there while the head's own verify passes says the tests were changed to pass.
With the runners' summaries (``bot.core.evidence.runs``) on the base and the head: fewer
tests, newly skipped or expected-to-fail ones, or none at all, say the same.

The evidence is loopbot's, not the critic's opinion: it becomes a sev1 finding of its
own (``bot.core.rules.pull.review.TESTS_CHANGED``), the agent gets one turn to fix the code
instead, and then a person decides. When the issue itself asks for a test to change
(``asks_for_test_change``), the agent is not told to undo it: the evidence goes
straight to a person, who merges by dismissing the finding.

Pure: paths, texts and the record's dict in, decisions out. The loop job
(``jobs.loop.held_out``) runs the commands.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bot.core.evidence import runs
from bot.core.evidence.paths import is_test_path
from bot.core.rules.loop import metric
from bot.core.text.messages import code_span

# A test runner's own configuration (the metric loop's guard list, and the shared files
# that hold a runner's section in Python projects). pyproject.toml, package.json and
# Cargo.toml are left out: code changes touch them for other reasons (a dependency), and
# a test deselected there shows in the runner's counts.
RUNNER_CONFIGS = metric.RUNNER_CONFIG | {"setup.cfg", ".coveragerc", "pytest.toml", ".pytest.ini"}
# What a verify command's first word runs, by the file that says what it does.
_TOOL_FILES = {
    "make": ("Makefile", "makefile", "GNUmakefile"),
    "npm": ("package.json",),
    "yarn": ("package.json",),
    "pnpm": ("package.json",),
    "npx": ("package.json",),
    "bun": ("package.json",),
    "just": ("justfile", "Justfile"),
    "tox": ("tox.ini",),
    "nox": ("noxfile.py",),
}
MAX_HELD = 500  # paths put back at once; more is a change no one should merge unread


def held_out_paths(changed: Iterable[str], verify: str) -> list[str]:
    """The changed paths (added, changed or deleted) that verify runs or reads: tests
    and their fixtures, the runner's configuration, files the command names."""
    named = _named(verify)
    out = []
    for path in changed:
        name = path.rsplit("/", 1)[-1]
        if (
            is_test_path(path)
            or metric.is_test_path(path)  # the broader rule: Swift, .NET, e2e folders
            or name in RUNNER_CONFIGS
            or path in named
            or any(path.startswith(d) for d in named if d.endswith("/"))
            or _runs_instead(path)
        ):
            out.append(path)
    return sorted(set(out))


# Bytecode: a committed unchecked .pyc runs instead of the source beside it (the sandbox
# also points Python's cache elsewhere: PYTHONPYCACHEPREFIX). Native modules named like a
# test module win over its .py. And what Python imports before the tests: a module at the
# root (a runner puts it first on sys.path) named like the standard library's (a
# ``difflib.py`` imported by unittest itself), site hooks and .pth files (red team).
_COMPILED = re.compile(r"(?:^|/)__pycache__/|\.py[co]$")
_NATIVE = re.compile(r"\.(?:so|pyd)$")
_SITE_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})


def _runs_instead(path: str) -> bool:
    """Whether ``path`` is something Python would run in place of the tests or before
    them, whatever its name says."""
    parts = path.split("/")
    name = parts[-1]
    module = name.split(".", 1)[0]
    if _COMPILED.search(path) or name in _SITE_HOOKS or name.endswith(".pth"):
        return True
    if _NATIVE.search(name) and is_test_path("/".join([*parts[:-1], module + ".py"])):
        return True
    # At the root: ``difflib.py``, ``difflib.cpython-311-x86_64-linux-gnu.so``, or a
    # package ``difflib/__init__.py`` (a folder without one never wins over the library).
    top = module if len(parts) == 1 else parts[0] if parts[1:] == ["__init__.py"] else ""
    return bool(top) and top in sys.stdlib_module_names and name.endswith((".py", ".so", ".pyd"))


_SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})
_INTERPRETERS = frozenset(
    {"sh", "bash", "zsh", "dash", "python", "python3", "node", "ruby", "perl", "bun", "deno"}
)
# Runners whose arguments are the tests to run (paths, modules, folders).
_RUNNERS = frozenset({"pytest", "py.test", "jest", "vitest", "mocha", "rspec", "phpunit"})
_PY_RUNNERS = frozenset({"unittest", "pytest"})


def _named(verify: str) -> set[str]:
    """What a verify command runs as tests or as its script: the script of each command
    (``./run_tests.sh``, ``sh ci/test.sh``, ``python tools/check.py``), a Python module it
    runs (``python -m checks.calc``), the tests it hands a runner (``pytest t/x.py::t``,
    ``-m unittest test_calc``, ``jest src/``), and the file its tool reads (``make``: the
    Makefile). Not any word: ``py_compile calc.py`` or ``test -d notes`` name code, not
    tests."""
    try:
        words = shlex.split(verify)
    except ValueError:
        words = verify.split()
    named: set[str] = set()
    commands: list[list[str]] = [[]]
    for word in words:
        if word in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    for words_of in commands:
        command = _unwrapped(words_of)
        if not command:
            continue
        program, args = command[0], [a for a in command[1:] if a and not a.startswith("-")]
        named.update(_TOOL_FILES.get(program.rsplit("/", 1)[-1], ()))
        if "/" in program or program.endswith((".sh", ".py", ".js", ".rb")):
            named.add(_path(program))
        name = program.rsplit("/", 1)[-1]
        if name in _INTERPRETERS or re.fullmatch(r"python3(\.\d+)?", name):
            if "-m" in command:
                after = command[command.index("-m") + 1 :]
                module, rest = (after[0], after[1:]) if after else ("", [])
                if module in _PY_RUNNERS:
                    for a in rest:
                        if not a.startswith("-"):
                            named.update(_selection(a))
                elif module:
                    named.update(_module(module))
            elif args:
                named.add(_path(args[0]))
        elif name in _RUNNERS:
            for a in args:
                named.update(_selection(a))
    return {n for n in named if n}


# Programs that run another program: what they run is the command (``timeout 600 make
# test``, ``env CI=1 pytest``, ``uv run pytest``). Their options and a duration, priority
# or CPU mask before it are theirs.
_WRAPPERS = frozenset(
    {"env", "timeout", "nice", "nohup", "time", "stdbuf", "ionice", "taskset", "xvfb-run",
     "exec", "command", "sudo", "chronic", "unbuffer", "setsid", "flock"}
)  # fmt: skip
_RUN_VIA = frozenset({"uv", "poetry", "pipenv", "hatch", "pdm", "rye"})
_WRAPPER_ARG = re.compile(r"-.*|\d+(?:\.\d+)?[smhd]?|0x[0-9a-fA-F]+|[A-Za-z_]\w*=.*")


def _unwrapped(command: list[str]) -> list[str]:
    """``command`` without the environment assignments and wrappers in front of it."""
    while command:
        first = command[0].rsplit("/", 1)[-1]
        if re.fullmatch(r"[A-Za-z_]\w*=.*", command[0]):
            command = command[1:]  # FOO=1 ./run_tests.sh
        elif first in _WRAPPERS:
            command = command[1:]
            while command and _WRAPPER_ARG.fullmatch(command[0]):
                command = command[1:]
        elif first in _RUN_VIA and command[1:2] in (["run"], ["exec"], ["-e"]):
            command = command[2:]
            while command and command[0].startswith("-"):
                command = command[1:]
        else:
            return command
    return command


def _path(word: str) -> str:
    return word.split("::", 1)[0].removeprefix("./")


def _module(word: str) -> set[str]:
    dotted = word.removesuffix(".py").replace(".", "/")
    return {dotted + ".py", dotted + "/"}


def _selection(word: str) -> set[str]:
    """A test a runner is handed, as the paths it may live in: a path
    (``t/x.py::test_one``), a folder, or a dotted module (``tests.test_calc.AddTest`` may
    be ``tests.py``, ``tests/test_calc.py``, ...)."""
    path = _path(word)
    if "/" in path or path.endswith((".py", ".js", ".ts", ".rb", ".php")):
        return {path if "." in path.rsplit("/", 1)[-1] else path.rstrip("/") + "/"}
    parts = path.split(".")
    return {"/".join(parts[:i]) + ".py" for i in range(1, len(parts) + 1)}


# An issue that asks for tests to change: a verb of change before a word for tests, or
# tests said to be wrong. Deliberately narrow: either answer ends with a person (asked:
# at once; not asked: after the agent's one turn to fix the code instead), so a miss here
# costs a turn, never a merge.
_TESTS = r"(?:tests?|test cases?|test files?|assertions?|expectations?|fixtures?|snapshots?)"
_ASK = re.compile(
    r"\b(?:fix|correct|update|change|rewrite|adjust|amend|repair|remove|delete)\w*\s+"
    r"(?:[\w`'\".()/-]+\s+){0,3}?" + _TESTS + r"\b",
    re.IGNORECASE,
)
_WRONG = re.compile(
    r"\b" + _TESTS + r"\s+(?:[\w`'\".()/-]+\s+){0,3}?(?:is|are|was|were)\s+(?:\w+\s+)?"
    r"(?:wrong|incorrect|outdated|out of date|stale|broken|buggy|mistaken|invalid)\b",
    re.IGNORECASE,
)


def asks_for_test_change(title: str, body: str) -> bool:
    """Whether the approved issue text asks for a test to be changed (see ``_ASK``)."""
    text = f"{title}\n{body}"
    return bool(_ASK.search(text) or _WRONG.search(text))


def record(
    *,
    sha: str,
    base: str,
    verify: str,
    held: Sequence[str],
    changed: Sequence[str],
    base_counts: Mapping[str, runs.Counts],
    head_counts: Mapping[str, runs.Counts],
    held_result: Mapping[str, Any] | None,
    not_run: str,
    asked: bool,
    held_tree: str = "",
    head_passed: bool = True,
) -> dict[str, Any]:
    """The record's ``test_evidence`` for the head ``sha`` (whose verify passed).
    ``held_result``: the held-out verify's outcome (None when it did not run, ``not_run``
    says why). ``held_tree``: the held-out files as the head has them (``git ls-tree``):
    with what the counts said, the evidence's ``digest``, which a writer's dismissal is
    bound to (a later head that changes the tests again is judged again)."""
    ran_less = runs.ran_less(base_counts, head_counts, head_passed=head_passed)
    digest = hashlib.sha256(json.dumps([held_tree, sorted(held), ran_less]).encode()).hexdigest()[
        :16
    ]
    return {
        "sha": sha,
        "base": base,
        "command": verify,
        "held": list(held[:MAX_HELD]),
        "held_count": len(held),
        "code_changed": any(p not in set(held) for p in changed),
        "held_out": dict(held_result) if held_result is not None else {},
        "not_run": "" if held_result is not None else not_run,
        "counts": {"base": runs.to_json(base_counts), "head": runs.to_json(head_counts)},
        "ran_less": ran_less,
        "asked": asked,
        "digest": digest,
    }


def failed_held_out(ev: Mapping[str, Any]) -> bool:
    held = ev.get("held_out") or {}
    return bool(held) and held.get("passed") is not True


def stands(ev: Mapping[str, Any], sha: str | None = None) -> bool:
    """Whether the evidence says the tests were changed to pass (on ``sha``, when given:
    evidence about another head says nothing about this one)."""
    if not ev or (sha is not None and ev.get("sha") != sha):
        return False
    return failed_held_out(ev) or bool(ev.get("ran_less"))


def _paths(paths: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(code_span(p) for p in paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def facts(ev: Mapping[str, Any]) -> list[str]:
    """What was run and what it said, one line each (the critic's prompt, the receipt,
    the pull request body, the session log)."""
    if not ev:
        return []
    lines = []
    held = list(ev.get("held") or [])
    base = str(ev.get("base") or "")[:10]
    command = code_span(str(ev.get("command") or ""))
    result = ev.get("held_out") or {}
    if result:
        outcome = (
            "passed"
            if result.get("passed")
            else "timed out"
            if result.get("timed_out")
            else f"failed (exit {result.get('exit_code')})"
        )
        lines.append(
            f"held-out verify: {command} on the head {str(ev.get('sha'))[:10]} with "
            f"{_paths(held)} as on the base {base}: {outcome}"
        )
    elif held:
        lines.append(f"held-out verify not run ({ev.get('not_run') or 'no reason recorded'})")
    if held:
        lines.append(
            "files verify runs that the change touches: "
            + _paths(held)
            + (
                "; the change touches other files too"
                if ev.get("code_changed")
                else "; the change touches no other file (the code under test is unchanged)"
            )
        )
    lines.extend(f"tests run: {line}" for line in ev.get("ran_less") or [])
    return lines


def summary(ev: Mapping[str, Any]) -> str:
    """One sentence: what shows the tests were changed to pass (call when ``stands``)."""
    held = list(ev.get("held") or [])
    parts = []
    if failed_held_out(ev):
        code = (
            "the code under test was not changed"
            if not ev.get("code_changed")
            else "the code changed too, but not enough to pass the tests as they were"
        )
        parts.append(
            f"verify passes on the head only with the changed tests: with {_paths(held)} as "
            f"on the base it fails, and {code}"
        )
    parts.extend(ev.get("ran_less") or [])
    return "; ".join(parts)


def turn_note(ev: Mapping[str, Any]) -> str:
    """The agent's next prompt: its change passed verify by changing the tests."""
    tail = str((ev.get("held_out") or {}).get("tail") or "")[-1500:]
    held = list(ev.get("held") or [])
    return (
        "verify passes, but only because the tests changed: "
        + summary(ev)
        + ".\n\nThe issue is fixed when the tests as the writer approved them pass. Put "
        + (_paths(held) if held else "the tests")
        + " back as they are on the base (unless the issue asks for a test to change) and "
        "fix the code under test instead; do not skip, delete or weaken tests. "
        + (f"verify with the tests as on the base said:\n{tail}" if tail else "")
    ).strip()


def person_detail(ev: Mapping[str, Any], finding_id: str) -> str:
    """Why the loop stopped for a person, on the issue."""
    asked = (
        "The issue asks for a test to change, so a writer decides whether this one should: "
        if ev.get("asked")
        else "The agent had a turn to fix the code instead and did not: "
    )
    how = (
        f"`/loop-dismiss {finding_id} <why the test change is right>` merges it through the gate"
        if finding_id
        else "a writer reviews it"
    )
    return (
        f"the tests were changed to pass: {summary(ev)}. {asked}{how}, or close the pull request."
    )
