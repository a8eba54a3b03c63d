"""Metric loops (label ``labels.optimize``, ``metric:`` in loop.yml): pure decisions.

One atomic change per iteration; the harness commits it, measures it with the metric
command, runs the guard, and keeps it only if the number improved by at least
``min_delta`` against the best kept so far and the guard passed. Otherwise it is
discarded (``git revert``: the history keeps it). ``jobs/loop/metric.py`` does the I/O
and asks these functions what every result means.

What the metric and guard commands run, which the agent may never change, is read from
the commands by bot/core/rules/command_paths.py; ``protected_paths`` here decides with it.

Nothing here reads a clock, a file or the network: each function is a table of cases.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, Literal

from bot.core.rules.command_paths import Reader, followed, named_paths

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


# The sandbox's mark where it cut a long output (jobs/sandbox/process.py ``HeadTail``): its
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
