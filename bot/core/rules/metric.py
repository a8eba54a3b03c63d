"""Metric loops (label ``labels.optimize``, ``metric:`` in loop.yml): pure decisions.

One atomic change per iteration; the harness commits it, measures it with the metric
command, runs the guard, and keeps it only if the number improved by at least
``min_delta`` against the best kept so far and the guard passed. Otherwise it is
discarded (``git revert``: the history keeps it). ``jobs/loop/metric.py`` does the I/O
and asks these functions what every result means.

Nothing here reads a clock, a file or the network: each function is a table of cases.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, Literal

TSV_NAME = "loop-results.tsv"  # committed at the end, in the pull request's files
TSV_HEADER = ("iteration", "commit", "metric", "delta", "status", "description")
HINT_AFTER = 5  # consecutive discards before the prompt asks for another area or technique
DESCRIPTION_CHARS = 200
SHORT_SHA = 10

Direction = Literal["higher", "lower"]
RowStatus = Literal["baseline", "keep", "discard"]

# -- reading the number -----------------------------------------------------------------

# A decimal number, not glued to a word before it ("py3", "x86", "v2" are not numbers) nor
# to a dot (the ".3" of "1.2.3"); units after it are fine ("1.5s", "84.7%", "12ms").
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# What Python's float() and most tools print for values that are not numbers.
_NOT_FINITE = re.compile(r"(?<![\w.])[-+]?(?:nan|inf(?:inity)?)(?!\w)", re.IGNORECASE)


@dataclass(frozen=True)
class Reading:
    """What a metric command's run gave: a finite number, or why there is none."""

    value: float | None
    error: str = ""  # "" when ``value`` is a number

    @property
    def ok(self) -> bool:
        return self.value is not None


# The sandbox's mark where it cut a long output (jobs/sandbox/bwrap.py ``_HeadTail``): its
# byte count is loopbot's, never the metric's.
_OMITTED = re.compile(r"\n\[\.\.\. \d+ bytes of output omitted \.\.\.\]\n")


def last_number(output: str) -> Reading:
    """The last number ``output`` prints; nan and inf are refused, with the reason."""
    output = _OMITTED.sub("\n", output)
    found = [(m.start(), m.group()) for m in _NUMBER.finditer(output)]
    bad = [(m.start(), m.group()) for m in _NOT_FINITE.finditer(output)]
    last = max(found + bad, default=None)
    if last is None:
        return Reading(None, "the metric command printed no number")
    _, token = last
    if last in bad:
        return Reading(None, f"the last value the metric command printed is {token.strip()}")
    value = float(token)
    if not math.isfinite(value):  # "1e999": a number too large for a float
        return Reading(None, f"the last number the metric command printed ({token}) overflows")
    return Reading(value)


def reading(exit_code: int, timed_out: bool, output: str, seconds: float = 0.0) -> Reading:
    """A metric command's run as a reading: a crash or a timeout is an error whatever it
    printed (a half-run benchmark's number is not the metric)."""
    if timed_out:
        return Reading(None, f"the metric command timed out after {seconds:.0f}s")
    if exit_code != 0:
        return Reading(None, f"the metric command failed (exit {exit_code})")
    return last_number(output)


# -- the scope ------------------------------------------------------------------------------


@cache
def _glob(pattern: str) -> re.Pattern[str]:
    """A scope glob as a regular expression over repository paths: ``**`` spans any
    number of directories, ``*`` and ``?`` stay within one name, ``[...]`` is a class. A
    pattern that names a directory (``src/`` or ``src`` itself) covers what is under it."""
    pattern = pattern.strip().removeprefix("./")
    if pattern.endswith("/"):
        pattern += "**"
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + "(?:/.*)?")


def in_scope(path: str, globs: Iterable[str], named: Iterable[str] = ()) -> bool:
    """Whether the agent may change ``path``. The results file is the harness's, and
    what the metric and guard commands name (``named_paths``) is the measurement's:
    never in scope whatever the globs say."""
    for n in (TSV_NAME, *named):
        if n.startswith(":") and _RULES.get(n, _never)(path):
            return False  # a rule: any path of its kind, tracked or new (see RULES)
        if path == n or path.startswith(n + "/"):
            return False
    return any(_glob(g).fullmatch(path) for g in globs)


def outside_scope(
    paths: Iterable[str], globs: Sequence[str], named: Sequence[str] = ()
) -> list[str]:
    """The paths a change touched that the scope does not allow, sorted."""
    return sorted({p for p in paths if not in_scope(p, globs, named)})


def matching(paths: Iterable[str], globs: Sequence[str], named: Sequence[str] = ()) -> list[str]:
    """The paths the scope allows (phase 0: at least one tracked file must match)."""
    return [p for p in paths if in_scope(p, globs, named)]


_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
# Programs that run a script named after their options (the script is the measurement).
_INTERPRETERS = re.compile(
    r"(?:python[\d.]*|pypy[\d.]*|node|nodejs|deno|bun|tsx|ts-node|bash|sh|zsh|dash|ruby|perl"
    r"|php|Rscript|lua|julia)"
)
# Interpreter options that take the next word as their value (not the script).
_VALUED = frozenset(
    {"-W", "-X", "-r", "--require", "--import", "--loader", "--experimental-loader"}
)
# Test runners: every path they are given is a test the guard (or the metric) is made of.
_RUNNERS = ("pytest", "py.test", "unittest", "nose2", "jest", "vitest", "mocha", "rspec")
_OPERATORS = frozenset({"|", "||", "&", "&&", ";", "(", ")", ";;", "|&"})


def _words(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``|``, ``&&``, ``;`` ...), as words."""
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: the shell's error to report, not ours
        tokens = command.split()
    segments: list[list[str]] = [[]]
    for t in tokens:
        if t in _OPERATORS:
            segments.append([])
        else:
            segments[-1].append(t)
    return [seg for seg in segments if seg]


def _script_words(words: list[str]) -> list[str]:
    """What one simple command runs: the program itself when it is a path
    (``./bench.sh``), the script after an interpreter and its options (``python3 -X
    dev bench/run.py``, ``python -m bench.run``), every argument of a test runner
    (``pytest tests/``, ``python -m unittest tests.test_x``)."""
    out = [words[0]]
    for i, word in enumerate(words):
        name = word.rsplit("/", 1)[-1]
        if name in _RUNNERS:
            return out + [w for w in words[i + 1 :] if not w.startswith("-")]
        if not _INTERPRETERS.fullmatch(name):
            continue
        rest = words[i + 1 :]
        if name in ("deno", "bun") and rest[:1] in (["run"], ["test"], ["bench"]):
            rest = rest[1:]  # deno run -A x.ts, bun run x.ts
        j = 0
        while j < len(rest) and rest[j].startswith("-"):
            if rest[j] in ("-e", "--eval", "-p", "--print"):  # node's inline code
                return out
            if rest[j] == "-c":  # inline code: no script file
                return out
            if rest[j] == "-m" and j + 1 < len(rest):
                module = rest[j + 1]
                if module in _RUNNERS:
                    return out + [w for w in rest[j + 2 :] if not w.startswith("-")]
                return [*out, module]
            j += 2 if rest[j] in _VALUED else 1
        return out + rest[j : j + 1]
    return out


Reader = Callable[[str], str | None]  # a tracked file's text, None when it cannot be read
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})
_MAKES = frozenset({"make", "gmake"})
_MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
_NPMS = frozenset({"npm", "yarn", "pnpm"})
_DEPTH = 4  # commands within commands (sh -c, make recipes, npm scripts) followed this deep


def named_paths(
    commands: Iterable[str], tracked: Iterable[str], read: Reader | None = None
) -> list[str]:
    """The tracked files and directories the commands run (``followed``'s first half)."""
    return followed(commands, tracked, read)[0]


def followed(
    commands: Iterable[str], tracked: Iterable[str], read: Reader | None = None
) -> tuple[list[str], bool]:
    """The tracked files and directories the metric and guard commands run: the script
    that measures (``python3 bench/run.py``, ``./size.sh``) and the tests the guard runs
    (``pytest tests/``, ``python -m unittest tests.test_x``). A wide scope (``**/*.py``)
    would otherwise let a change rewrite the measurement, or the check it must pass, and
    be kept for it. Arguments that are data (``cloc src``, ``wc -l src/big.py``) are
    what is measured, and stay in scope. Sorted; and whether a test runner (pytest,
    unittest, jest...) is among what the commands run.

    Followed as far as they can be read without running anything (``read`` gives a
    tracked file's text): ``cd DIR && ...`` (later paths are under DIR), ``sh -c '...'``,
    ``make [-C DIR] [-f FILE] [TARGET]`` (the makefile, and the recipes of the target
    and its prerequisites), ``npm|yarn|pnpm test|run NAME`` (package.json and the
    script), ``tox`` and ``nox`` (their config). Not followed: variables, functions,
    includes, scripts a script calls."""
    files = set(tracked)
    dirs = {f.rsplit("/", i)[0] for f in files for i in range(1, f.count("/") + 1)}
    found: set[str] = set()
    runners: set[str] = set()

    def add(path: str) -> bool:
        path = _normal(path)
        if path and (path in files or path in dirs):
            found.add(path)
            return True
        return False

    def follow(command: str, cwd: str, depth: int) -> None:
        if depth > _DEPTH:
            return
        command = command.replace("$(MAKE)", "make").replace("${MAKE}", "make")
        for words in _words(command):
            words = _unwrapped(words)  # FOO=1, env, time, nice, timeout 60, exec...
            if not words:
                continue
            program = words[0].rsplit("/", 1)[-1]
            if program in ("cd", "pushd") and len(words) > 1:
                cwd = _join(cwd, words[1])  # for the rest of the line: cd x && pytest
                continue
            if program in _SHELLS and (code := _inline_code(words)) is not None:
                follow(code, cwd, depth + 1)
                continue
            if program in _MAKES:
                _make(words[1:], cwd, depth)
                continue
            if program in _NPMS and len(words) > 1:
                _npm(words[1:], cwd, depth)
                continue
            if program == "hyperfine":  # its arguments are commands
                for arg in words[1:]:
                    if not arg.startswith("-"):
                        follow(arg, cwd, depth + 1)
                continue
            if program in ("tox", "nox"):
                for config in ("tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py"):
                    if add(_join(cwd, config)) and config == "tox.ini" and read is not None:
                        for line in tox_commands(read(_join(cwd, config)) or ""):
                            follow(line, cwd, depth + 1)
                runners.add(program)
                continue
            if any(w.rsplit("/", 1)[-1] in _RUNNERS for w in words):
                runners.add(program)
            script = _join(cwd, words[0].removeprefix("./"))
            if script.endswith(".sh") and add(script) and read is not None:
                for line in (read(script) or "").splitlines():  # a shell script's commands
                    if line.strip() and not line.lstrip().startswith("#"):
                        follow(line, cwd, depth + 1)
            for word in _script_words(words):
                word = word.partition("::")[0].removeprefix("./").rstrip("/")
                candidates = [_join(cwd, word)]
                if _MODULE.fullmatch(word):  # a module: a/b.py or the package a/b/
                    module = word.replace(".", "/")
                    candidates += [_join(cwd, module + ".py"), _join(cwd, module)]
                for c in candidates:
                    add(c)

    def _make(args: list[str], cwd: str, depth: int) -> None:
        where, makefile, targets, i = cwd, "", [], 0
        while i < len(args):
            a = args[i]
            if a in ("-C", "--directory") and i + 1 < len(args):
                where, i = _join(cwd, args[i + 1]), i + 2
                continue
            if a.startswith("--directory=") or (a.startswith("-C") and len(a) > 2):
                where, i = _join(cwd, a.split("=", 1)[1] if "=" in a else a[2:]), i + 1
                continue
            if a in ("-f", "--file", "--makefile") and i + 1 < len(args):
                makefile, i = args[i + 1], i + 2
                continue
            if not a.startswith("-") and "=" not in a:
                targets.append(a)
            i += 1
        names = [makefile] if makefile else list(_MAKEFILES)
        for name in names:
            path = _join(where, name)
            if add(path):
                text = read(_normal(path)) if read is not None else None
                if text is not None:
                    for recipe in make_recipes(text, targets):
                        follow(recipe, where, depth + 1)
                return

    def _npm(args: list[str], cwd: str, depth: int) -> None:
        rest: list[str] = []
        i = 0
        while i < len(args):  # where the package is: npm --prefix, yarn --cwd, pnpm -C
            a = args[i]
            if a in ("--prefix", "--cwd", "-C", "--dir") and i + 1 < len(args):
                cwd, i = _join(cwd, args[i + 1]), i + 2
                continue
            if a.split("=", 1)[0] in ("--prefix", "--cwd", "--dir") and "=" in a:
                cwd, i = _join(cwd, a.split("=", 1)[1]), i + 1
                continue
            rest.append(a)
            i += 1
        args = [a for a in rest if not a.startswith("-")] or ["test"]
        path = _join(cwd, "package.json")
        if not add(path):
            return
        name = args[0]
        if name in ("run", "run-script") and len(args) > 1:
            name = args[1]
        text = read(_normal(path)) if read is not None else None
        try:
            scripts = json.loads(text or "{}").get("scripts") or {}
        except (ValueError, AttributeError):
            return
        script = scripts.get(name) if isinstance(scripts, dict) else None
        if isinstance(script, str):
            follow(script, cwd, depth + 1)

    for command in commands:
        follow(command, "", 0)
    return sorted(found), bool(runners)


_WRAPPERS = frozenset({"env", "time", "nice", "nohup", "exec", "command", "stdbuf", "ionice"})


def _unwrapped(words: list[str]) -> list[str]:
    """The command a wrapper runs: ``FOO=1 x``, ``env A=1 x``, ``time x``, ``nice -n 5 x``,
    ``timeout 60 x`` are all ``x``."""
    while words:
        first = words[0].rsplit("/", 1)[-1]
        if re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            words = words[1:]
        elif first in _WRAPPERS:
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[2:] if words[0] in ("-n", "-c", "-o", "-e", "-i") else words[1:]
        elif first == "timeout" and len(words) > 2:
            rest = [w for w in words[1:] if not w.startswith("-")]
            words = rest[1:]  # the duration, then the command
        else:
            return words
    return words


def tox_commands(text: str) -> list[str]:
    """The ``commands`` of every ``[testenv…]`` section of a tox.ini (continuation lines
    included), as shell lines."""
    out: list[str] = []
    section, in_commands = "", False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section, in_commands = stripped, False
            continue
        if not section.startswith("[testenv"):
            continue
        if re.match(r"commands\s*=", stripped):
            in_commands = True
            first = stripped.split("=", 1)[1].strip()
            if first:
                out.append(first)
        elif in_commands and line[:1] in (" ", "\t") and stripped:
            out.append(stripped)
        elif stripped:
            in_commands = False
    return out


OUTSIDE = "\0outside"  # a directory outside the repository: nothing there is tracked


def _normal(path: str) -> str:
    """``a/./b/../c`` as ``a/c``; ``OUTSIDE`` for a path that leaves the repository."""
    if path.startswith("/") or path.startswith(OUTSIDE):
        return OUTSIDE
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return OUTSIDE
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def _join(cwd: str, path: str) -> str:
    return _normal(f"{cwd}/{path}" if cwd else path)


def _inline_code(words: list[str]) -> str | None:
    """The command string of ``sh -c '...'`` (also ``bash -lc '...'``), if any."""
    for i, word in enumerate(words[1:-1], start=1):
        if re.fullmatch(r"-[a-zA-Z]*c[a-zA-Z]*", word):
            return words[i + 1]
        if not word.startswith("-"):
            return None
    return None


_RULE = re.compile(r"^([^\s:=#][^:=#]*?)\s*::?(?!=)\s*(.*)$")


def make_recipes(text: str, targets: Sequence[str]) -> list[str]:
    """The recipe lines ``make TARGETS`` runs, read statically: each target's recipe and
    its prerequisites' (the first rule's target when none is given), with ``@``, ``-``
    and ``+`` prefixes dropped. Pattern rules, variables and includes are not expanded."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    order: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("\t"):
            if current is not None:
                current.append(line[1:].lstrip("@-+ \t"))
            continue
        current = None
        match = _RULE.match(line)
        if match is None or line.lstrip().startswith(("#", ".PHONY")):
            continue
        prereqs = match.group(2).split(";", 1)
        recipe = [prereqs[1].strip()] if len(prereqs) > 1 and prereqs[1].strip() else []
        for target in match.group(1).split():
            entry = rules.setdefault(target, ([], []))
            entry[0].extend(prereqs[0].split())
            entry[1].extend(recipe)
            if target not in order and not target.startswith("."):
                order.append(target)
        current = rules[match.group(1).split()[0]][1] if match.group(1).split() else None
    wanted = list(targets) or order[:1]
    out: list[str] = []
    seen: set[str] = set()
    while wanted:
        target = wanted.pop(0)
        if target in seen or target not in rules:
            continue
        seen.add(target)
        prereqs, recipe = rules[target]
        out.extend(r for r in recipe if r)
        wanted.extend(prereqs)
    return out


# What a guard that names no tests is assumed to run: the tests where test runners look
# for them, and what configures those runners. Out of scope then, changes to them are
# discarded unmeasured: a change that weakens a test cannot pass the guard by it. These
# are rules on any path, tracked or new (a conftest.py the agent adds is one too).
TEST_DIRS = frozenset(
    {"test", "tests", "spec", "specs", "__tests__", "testing", "e2e", "it", "cypress"}
)
# FooTests (Swift), Lib.Tests (.NET), unit_tests, integration-tests; not "latest".
_TEST_DIR = re.compile(r".+(?:Tests?|[._-][Tt]ests?)")
_TEST_FILE = re.compile(
    r"(?:^|/)(?:test_[^/]*\.py|tests\.py|[^/]*_test\.(?:py|go|rb|rs|exs?)"
    r"|[^/]*_spec\.(?:rb|[cm]?[jt]sx?)|[^/]*\.(?:test|spec|cy)\.[cm]?[jt]sx?"
    r"|[^/]*Tests?\.(?:java|kt|swift|cs|scala)|conftest\.py)$"
)
# Files that only configure test runners: always the guard's.
RUNNER_CONFIG = frozenset(
    {
        "pytest.ini", "tox.ini", "noxfile.py", "conftest.py", "jest.config.js",
        "jest.config.ts", "jest.config.mjs", "jest.config.cjs", "vitest.config.ts",
        "vitest.config.js", "vitest.config.mjs", ".mocharc.js", ".mocharc.json",
        ".mocharc.yml", ".mocharc.yaml", "karma.conf.js", ".rspec", "phpunit.xml",
        "cypress.config.js", "cypress.config.ts", "playwright.config.ts",
    }
)  # fmt: skip
# Files that may configure a test runner among other things: the guard's too when it
# runs one, or names no test of its own (then what they say decides what it runs).
SHARED_CONFIG = frozenset(
    {"setup.cfg", "pyproject.toml", "package.json", "Makefile", "makefile", "GNUmakefile"}
)


def is_test_path(path: str) -> bool:
    """A test folder's content or a test file, by the names runners look for."""
    parts = path.split("/")
    dirs = parts[:-1]
    return bool(_TEST_FILE.search(path)) or any(
        d.lower() in TEST_DIRS or _TEST_DIR.fullmatch(d) is not None for d in dirs
    )


def _never(path: str) -> bool:
    return False


# The rules ``protected_paths`` puts among the named paths (``in_scope`` applies them).
RUNNER_RULE, SHARED_RULE, TESTS_RULE = ":runner-config", ":shared-config", ":tests"
_RULES: dict[str, Callable[[str], bool]] = {
    RUNNER_RULE: lambda p: p.rsplit("/", 1)[-1] in RUNNER_CONFIG,
    SHARED_RULE: lambda p: p.rsplit("/", 1)[-1] in SHARED_CONFIG,
    TESTS_RULE: is_test_path,
}
RULE_WORDS = {
    RUNNER_RULE: "test-runner config and conftest files",
    SHARED_RULE: "config a test runner reads (pyproject.toml, setup.cfg, package.json, "
    "the Makefile)",
    TESTS_RULE: "test folders and test files",
}


def protected_paths(
    command: str, guard: str, tracked: Sequence[str], read: Reader | None = None
) -> list[str]:
    """What the agent of a metric loop may never change, whatever the scope says: the
    paths the metric and guard commands name (``named_paths``), and rules on any path,
    new ones included: test-runner config and conftest files always (they change what
    any test run does); the shared config a runner also reads when the guard runs a test
    runner or names no test of its own; and, when it names no test of its own (only a
    script, a makefile or package.json, or nothing), test folders and test files.
    Sorted, the rules (``:...``) first."""
    named = named_paths((command, guard), tracked, read)
    by_guard, runs_tests = followed((guard,), tracked, read)
    own_tests = [p for p in by_guard if is_test_path(p) or p.rsplit("/", 1)[-1] in TEST_DIRS]
    rules = {RUNNER_RULE}
    if runs_tests or not own_tests:
        rules.add(SHARED_RULE)
    if not own_tests:
        rules.add(TESTS_RULE)
    return sorted(rules) + named


# -- keep or discard --------------------------------------------------------------------------


def improvement(direction: Direction, best: float, value: float) -> float:
    """How much better ``value`` is than ``best``: positive is better, in either direction."""
    return value - best if direction == "higher" else best - value


def _enough(gain: float, min_delta: float, best: float, value: float) -> bool:
    """Better at all, and by at least ``min_delta``, with room for the float error of a
    subtraction (0.3 - 0.1 is 0.19999999999999998)."""
    slack = 1e-9 * max(1.0, abs(best), abs(value))
    return gain > slack and gain >= min_delta - slack


def improved(direction: Direction, min_delta: float, best: float, value: float) -> bool:
    """Whether ``value`` beats ``best`` by at least ``min_delta`` (and beats it at all:
    a change that measures the same helps nothing measurable)."""
    return _enough(improvement(direction, best, value), min_delta, best, value)


@dataclass(frozen=True)
class Verdict:
    status: Literal["keep", "discard"]
    reason: str  # why, in a few words; "" for a keep
    run_guard: bool = False  # only for ``first_look``: the guard decides


def first_look(
    *,
    changed: bool,
    outside: Sequence[str],
    reading: Reading | None,
    direction: Direction,
    min_delta: float,
    best: float,
) -> Verdict:
    """What the metric alone says, before the guard runs (the guard runs only for a
    change that improved the metric: whatever it says, anything else is discarded).

    ``changed``: the iteration committed something; ``outside``: the paths it touched
    that the scope does not allow (then the metric is not measured: ``reading`` None).
    """
    if not changed:
        return Verdict("discard", "no change: the iteration left the tree as it was")
    if outside:
        shown = ", ".join(outside[:5]) + (
            f" and {len(outside) - 5} more" if len(outside) > 5 else ""
        )
        return Verdict("discard", f"changed files outside the scope: {shown}")
    if reading is None or reading.value is None:
        return Verdict("discard", reading.error if reading is not None else "not measured")
    gain = improvement(direction, best, reading.value)
    if not _enough(gain, min_delta, best, reading.value):
        if gain <= 0:
            return Verdict("discard", "no improvement" if gain == 0 else "worse")
        return Verdict("discard", f"improved by {fmt(gain)}, less than min_delta {fmt(min_delta)}")
    return Verdict("keep", "", run_guard=True)


def with_guard(verdict: Verdict, guard_passed: bool, guard_detail: str = "") -> Verdict:
    """The final verdict once the guard ran on an improving change."""
    if not verdict.run_guard:
        return verdict
    if guard_passed:
        return Verdict("keep", "")
    return Verdict("discard", "guard failed" + (f" ({guard_detail})" if guard_detail else ""))


# -- the results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the results table. ``commit``: the iteration's commit (kept or
    reverted; the baseline's base commit); ``metric``: what it measured (None: an error
    or not measured); ``delta``: against the best kept before it."""

    iteration: int
    commit: str
    metric: float | None
    delta: float | None
    status: RowStatus
    description: str
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Row:
        metric, delta = data.get("metric"), data.get("delta")
        return cls(
            iteration=int(data.get("iteration", 0)),
            commit=str(data.get("commit", "")),
            metric=float(metric) if metric is not None else None,
            delta=float(delta) if delta is not None else None,
            status=_status(data.get("status")),
            description=str(data.get("description", "")),
            reason=str(data.get("reason", "")),
        )


def _status(value: object) -> RowStatus:
    if value == "baseline":
        return "baseline"
    return "keep" if value == "keep" else "discard"


def rows_of(data: Iterable[Mapping[str, Any]]) -> list[Row]:
    return [Row.of(d) for d in data]


def baseline_row(commit: str, value: float, iteration: int = 0) -> Row:
    """Iteration 0 (or, measured again after the metric command changed, the last
    iteration's number: the table stays in order)."""
    return Row(iteration, commit, value, None, "baseline", "baseline, before any change")


def iteration_row(
    iteration: int,
    commit: str,
    value: float | None,
    best: float,
    verdict: Verdict,
    description: str,
) -> Row:
    """The row for a decided iteration; ``delta`` is signed as the metric moved (a
    lower-is-better metric that improved has a negative delta), None when not measured."""
    delta = None if value is None else value - best
    return Row(
        iteration,
        commit,
        value,
        delta,
        verdict.status,
        clean_description(description) or "(no description)",
        verdict.reason,
    )


def clean_description(text: str) -> str:
    """One line, no tabs or control characters, at most ``DESCRIPTION_CHARS``: a
    description comes from the model and must not break a TSV line or a table row."""
    line = "".join(" " if (ord(c) < 32 or ord(c) == 127) else c for c in text)
    line = " ".join(line.split())
    if len(line) > DESCRIPTION_CHARS:
        line = line[: DESCRIPTION_CHARS - 1].rstrip() + "…"
    return line


def best_kept(rows: Sequence[Row]) -> float | None:
    """The metric as it stands on the branch: the last kept value, else the baseline."""
    for row in reversed(rows):
        if row.status in ("keep", "baseline") and row.metric is not None:
            return row.metric
    return None


def baseline(rows: Sequence[Row]) -> float | None:
    """The latest baseline: a loop whose metric command changed measured the base again."""
    return next((r.metric for r in reversed(rows) if r.status == "baseline"), None)


def last_iteration(rows: Sequence[Row]) -> int:
    return max((r.iteration for r in rows), default=0)


def streak(rows: Sequence[Row], since: int = 0) -> int:
    """Consecutive discards at the end of the table, counting iterations after ``since``
    (a writer's restart starts the count over)."""
    n = 0
    for row in reversed(rows):
        if row.iteration <= since or row.status != "discard":
            break
        n += 1
    return n


# -- stuck detection and the end -------------------------------------------------------------


def hint_after(max_consecutive_discards: int) -> int:
    """Discards in a row before the prompt asks for another area or technique: 5, or
    half the stop threshold when that is smaller (so the hint comes before the stop)."""
    return max(1, min(HINT_AFTER, max_consecutive_discards // 2))


@dataclass(frozen=True)
class Go:
    iteration: int
    hint: bool  # the prompt says: change area or technique


@dataclass(frozen=True)
class End:
    why: Literal["max_iterations", "stuck"]
    detail: str


def next_step(
    rows: Sequence[Row], *, since: int, max_iterations: int, max_consecutive_discards: int
) -> Go | End:
    """Whether another iteration runs. ``since``: the iteration after which the current
    allowance began (0, or the last one before a writer's restart)."""
    done = last_iteration(rows) - since
    run = streak(rows, since)
    if run >= max_consecutive_discards:
        return End(
            "stuck",
            f"{run} discards in a row (max_consecutive_discards {max_consecutive_discards}): "
            "the loop stopped trying",
        )
    if done >= max_iterations:
        return End("max_iterations", f"{done} iterations run (max_iterations {max_iterations})")
    return Go(last_iteration(rows) + 1, hint=run >= hint_after(max_consecutive_discards))


@dataclass(frozen=True)
class Report:
    iterations: int
    kept: int
    discarded: int
    baseline: float | None
    best: float | None
    direction: Direction

    @property
    def delta(self) -> float | None:
        if self.baseline is None or self.best is None:
            return None
        return self.best - self.baseline

    @property
    def percent(self) -> float | None:
        """The change relative to the baseline, in percent; None for a zero baseline."""
        if self.delta is None or not self.baseline:
            return None
        return 100.0 * self.delta / abs(self.baseline)


def report(rows: Sequence[Row], direction: Direction) -> Report:
    iterations = [r for r in rows if r.status != "baseline"]
    return Report(
        iterations=len(iterations),
        kept=sum(r.status == "keep" for r in iterations),
        discarded=sum(r.status == "discard" for r in iterations),
        baseline=baseline(rows),
        best=best_kept(rows),
        direction=direction,
    )


# -- rendering --------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    """A metric as the table shows it: up to 10 significant digits, "-" for none."""
    if value is None:
        return "-"
    return f"{value:.10g}"


def fmt_delta(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:+.10g}"


def description_cell(row: Row) -> str:
    """The description with the reason of a discard after it."""
    if row.status == "discard" and row.reason:
        return clean_description(f"{row.description} [discarded: {row.reason}]")
    return row.description


def tsv(rows: Sequence[Row]) -> str:
    """``loop-results.tsv``: a header line, then one tab-separated line per row. No field
    holds a tab or a line break (descriptions are cleaned; the rest are numbers, shas
    and fixed words)."""
    lines = ["\t".join(TSV_HEADER)]
    for r in rows:
        fields = (
            str(r.iteration),
            r.commit[:SHORT_SHA] or "-",
            fmt(r.metric),
            fmt_delta(r.delta),
            r.status,
            clean_description(description_cell(r)).replace("\t", " "),
        )
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"
