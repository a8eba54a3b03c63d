"""The manual checked against the code: what README.md, CHANGELOG.md and docs/*.md name
must exist.

- each ``loopbot <command>`` in a code span or block answers ``--help`` (the CLI run
  in-process), and each ``--option`` written after it is one of that command's;
- each setting (``LOOPBOT_*``, ``REDIS_*``, ``GITHUB_*``, ``ANTHROPIC_*``, ``OPENAI_*``) is
  one the settings model reads, or one the CLI or the env file reads by name; ``X_*``
  stands for every setting it begins;
- each dotted ``loop.yml`` key in a code span whose first part is one of the file's
  top-level keys (``spend.day_usd``, ``critic.enabled: false``) is a key of the config
  model (a misspelt first part, ``critc.enabled``, is not recognised as a key);
- each relative link (and image) points at a file that exists, and its ``#anchor`` at a
  heading of the target, by GitHub's slug rules.
- each repository path a code span is made of (``bot/core/rules/loop/context.py``,
  ``tests/io/test_webhook.py::test_ping_is_200``) exists, and a test it names is defined
  there: the security page cites the tests that show each claim.

The names to check against are parameters, so a test can take one away and watch the
check fail on the docs that name it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import click
from click.testing import CliRunner

from bot.core.settings import ENV_FILE_VARIABLE, Settings
from bot.ops import loop_yml_docs
from bot.ops.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
SETTING = re.compile(r"\b((?:LOOPBOT|REDIS|GITHUB|ANTHROPIC|OPENAI)_[A-Z0-9_]*[A-Z0-9])(_\*)?")
# ``loopbot`` then a word: the command; the rest of the line up to a comment or the next
# command in a pipeline holds its options.
COMMAND = re.compile(r"(?<![\w.-])loopbot ([a-z][a-z-]*)((?:[^#`;|&\n])*)")
# A code span is a command only when it starts with one (``.venv/bin/loopbot`` too): a
# quoted message may say "loopbot refuses ...".
SPAN_COMMAND = re.compile(r"^(?:\S*/)?loopbot ")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
KEY = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_<>\[\]*]+)+)\s*(?::.*)?$")
FILE_SUFFIXES = {"py", "md", "yml", "yaml", "json", "toml", "txt", "cfg", "ini", "sh", "png"}
# Dotted names in the docs that begin like a loop.yml key but belong to another program.
NOT_LOOP_YML = {"agent.build.steps"}  # opencode's own config key (operating.md)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
PATH = re.compile(r"((?:bot|jobs|tests|bench|scripts|deploy|docs)/[\w/.@-]*)(?:::(\w+))?")
SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)


# Read by the tests themselves, not by loopbot (tests/unit/test_docs.py checks they still are).
TEST_SETTINGS = frozenset({"LOOPBOT_SCREENSHOT_DIR"})


@dataclass(frozen=True)
class Problem:
    doc: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.what}"


@dataclass(frozen=True)
class Names:
    """What the docs may name: the CLI, the settings, the loop.yml keys."""

    cli: click.Group
    settings: frozenset[str]
    keys: frozenset[str]


def settings_names(group: click.Group = cli) -> frozenset[str]:
    """Every setting read by name: the settings model's, the env file's own variable, the
    CLI options' environment variables (``LOOPBOT_WORKER_LOOPS``) and the tests' own."""
    names = {f.alias for f in Settings.model_fields.values() if f.alias}
    names.add(ENV_FILE_VARIABLE)
    names |= TEST_SETTINGS
    for command in _commands(group):
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str):
                names.add(envvar)
    return frozenset(names)


def _commands(group: click.Group) -> Iterator[click.Command]:
    for command in group.commands.values():
        yield command
        if isinstance(command, click.Group):
            yield from _commands(command)


def current() -> Names:
    return Names(cli, settings_names(), loop_yml_docs.all_keys())


def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]


def check(pages: Mapping[Path, str], names: Names | None = None) -> list[Problem]:
    """Every problem in ``pages`` (path → text; a path need not exist, its links are
    resolved from its folder)."""
    names = names or current()
    problems: list[Problem] = []
    helps: dict[tuple[str, ...], str | None] = {}
    for path, text in pages.items():
        doc = _name(path)
        for line, code, fenced in _code(text):
            if fenced or SPAN_COMMAND.match(code):
                problems += [Problem(doc, line, w) for w in _commands_in(code, names.cli, helps)]
            problems += [Problem(doc, line, w) for w in _keys_in(code, names.keys)]
            if not fenced:
                problems += [Problem(doc, line, w) for w in _paths_in(code)]
        for line, raw in enumerate(text.split("\n"), 1):
            for m in SETTING.finditer(raw):
                if not _setting_known(m.group(1), bool(m.group(2)), names.settings):
                    problems.append(Problem(doc, line, f"unknown setting {m.group(0)}"))
        for line, target in _links(text):
            if (why := broken(path, target, pages)) is not None:
                problems.append(Problem(doc, line, why))
    return problems


def check_files(paths: Iterable[Path], names: Names | None = None) -> list[Problem]:
    return check({p: p.read_text() for p in paths}, names)


def _name(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _segments(text: str) -> Iterator[tuple[bool, int, str]]:
    """(fenced, first line, text) of each fenced block and each stretch between them."""
    fenced, start, chunk = False, 1, []
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line.lstrip()):
            yield fenced, start, "\n".join(chunk)
            fenced, start, chunk = not fenced, n + 1, []
        else:
            chunk.append(line)
    yield fenced, start, "\n".join(chunk)


def _spans(chunk: str) -> Iterator[re.Match[str]]:
    """Code spans, which may run over a line break but not a blank line."""
    return (m for m in SPAN.finditer(chunk) if "\n\n" not in m.group(0))


def _code(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line, text, fenced) of each code span and each line of a fenced block."""
    for fenced, start, chunk in _segments(text):
        if fenced:
            yield from ((start + i, line, True) for i, line in enumerate(chunk.split("\n")))
        else:
            for m in _spans(chunk):
                line = start + chunk.count("\n", 0, m.start())
                yield line, " ".join(m.group(2).split()), False


def _prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each line outside fenced blocks, code spans blanked out."""
    for fenced, start, chunk in _segments(text):
        if fenced:
            continue
        for m in _spans(chunk):
            blank = "".join(c if c == "\n" else " " for c in m.group(0))
            chunk = chunk[: m.start()] + blank + chunk[m.end() :]
        yield from ((start + i, line) for i, line in enumerate(chunk.split("\n")))


def _commands_in(
    code: str, group: click.Group, helps: dict[tuple[str, ...], str | None]
) -> Iterator[str]:
    for m in COMMAND.finditer(code):
        words = [m.group(1)]
        rest = m.group(2)
        sub = group.commands.get(words[0])
        if isinstance(sub, click.Group):  # ``loopbot app create``
            second = re.match(r"\s+([a-z][a-z-]*)", rest)
            if second:
                words.append(second.group(1))
                rest = rest[second.end() :]
        help_text = _help(group, tuple(words), helps)
        if help_text is None:
            yield f"unknown command: loopbot {' '.join(words)}"
            continue
        for option in OPTION.findall(rest):
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text):
                yield f"unknown option of loopbot {' '.join(words)}: {option}"


def _help(
    group: click.Group, words: tuple[str, ...], helps: dict[tuple[str, ...], str | None]
) -> str | None:
    """``loopbot WORDS --help``, run in-process; None when it fails (no such command)."""
    if words not in helps:
        result = CliRunner().invoke(group, [*words, "--help"])
        helps[words] = result.output if result.exit_code == 0 else None
    return helps[words]


def _keys_in(code: str, keys: frozenset[str]) -> Iterator[str]:
    m = KEY.match(code)
    if m is None:
        return
    key = m.group(1)
    first, *_, last = key.split(".")
    top = {k for k in keys if "." not in k and "[" not in k}
    if first.split("[")[0] not in top or last in FILE_SUFFIXES or key in NOT_LOOP_YML:
        return
    if key.endswith(".*"):  # ``spend.*``: the keys of a section
        if not any(k.startswith(key[:-1]) for k in keys):
            yield f"unknown loop.yml section: {key}"
    elif key not in keys:
        yield f"unknown loop.yml key: {key}"


def _paths_in(code: str) -> Iterator[str]:
    m = PATH.fullmatch(code)
    if m is None:
        return
    path, test = ROOT / m.group(1), m.group(2)
    if not path.exists():
        yield f"no such file: {m.group(1)}"
    elif test and not re.search(rf"^(?:async )?def {test}\(", path.read_text(), re.M):
        yield f"no such test: {m.group(0)}"


def _setting_known(name: str, prefix: bool, settings: frozenset[str]) -> bool:
    if prefix:  # ``LOOPBOT_SPEND_*``
        return any(s.startswith(name + "_") for s in settings)
    return name in settings


def _links(text: str) -> Iterator[tuple[int, str]]:
    for line, prose in _prose(text):
        for m in LINK.finditer(prose):
            target = m.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # not https:, mailto:
                yield line, target


def broken(page: Path, target: str, pages: Mapping[Path, str] | None = None) -> str | None:
    """Why the link to ``target`` from ``page`` is broken, or None. A target among
    ``pages`` is read from there (a page being checked need not be on disk)."""
    pages = pages or {}
    file, _, anchor = target.partition("#")
    dest = (page.parent / file).resolve() if file else page
    if file and dest not in pages and not dest.exists():
        return f"broken link: {target} ({_name(dest)} does not exist)"
    if anchor:
        if dest.suffix != ".md":
            return f"broken link: {target} (an anchor in a file that is not Markdown)"
        text = pages[dest] if dest in pages else dest.read_text()
        if anchor not in anchors(text):
            return f"broken anchor: {target} (no such heading in {dest.name})"
    return None


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: the text lower-cased, everything but
    letters, digits, spaces, ``-`` and ``_`` dropped, spaces made ``-``; a repeated one
    gets ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    for fenced, _, chunk in _segments(text):
        if fenced:
            continue
        for line in chunk.split("\n"):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m is None:
                continue
            slug = slug_of(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def slug_of(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's words stay
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N"))
    return kept.replace(" ", "-")
