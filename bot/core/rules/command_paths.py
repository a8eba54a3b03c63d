"""The repository paths shell commands run, read without running anything: the script an
interpreter runs, the tests a runner is given, followed through ``cd``, ``sh -c``, make
recipes, npm scripts and tox. It reads shell, make, npm and tox, not metrics: metric
loops (bot/core/rules/loop/metric.py ``protected_paths``) use it to keep the measurement and
the guard's tests out of the agent's reach.

Nothing here reads a clock, a file or the network: files come through ``read``."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Sequence

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
