"""What a test runner says it ran, read from verify's output, and what fewer of it means.

An agent can make verify pass without fixing anything by making it test less: delete the
failing test, mark it skipped or expected to fail, deselect it, or leave verify running no
test at all. The runners say what they ran in a summary line; read on the base and on the
head, the two say whether the head runs less than the base did.

Read: unittest (``Ran N tests`` and ``OK (skipped=1)`` / ``FAILED (failures=1, ...)``),
pytest (``1 failed, 2 passed, 1 skipped in 0.1s``, ``no tests ran``), jest (``Tests: 1
skipped, 2 passed, 3 total``), vitest (``Tests  2 passed | 1 skipped (3)``), go test
(``--- PASS:`` lines with ``-v``; ``[no tests to run]`` / ``[no test files]`` without),
cargo test (``test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 2 filtered
out``). Several runs of one runner in one output (a monorepo's packages) add up.

Pure: verify's output in, counts and findings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class Counts:
    """One runner's tests in one verify run. ``collected``: every test it saw (ran,
    skipped or expected to fail; not deselected); None when the runner does not say
    (go test without ``-v``). ``executed``: those that ran and could fail."""

    collected: int | None = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    deselected: int = 0

    @property
    def executed(self) -> int | None:
        if self.collected is None:
            return None
        return max(self.collected - self.skipped - self.xfailed, 0)

    def __add__(self, other: Counts) -> Counts:
        collected = (
            None
            if self.collected is None or other.collected is None
            else self.collected + other.collected
        )
        return Counts(
            collected,
            self.failed + other.failed,
            self.skipped + other.skipped,
            self.xfailed + other.xfailed,
            self.deselected + other.deselected,
        )


def parse(output: str) -> dict[str, Counts]:
    """Each runner whose summary ``output`` holds, with its counts."""
    lines = _ANSI.sub("", output).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    found: dict[str, Counts] = {}
    for runner, read in _READERS:
        counts = read(lines)
        if counts is not None:
            found[runner] = counts
    return found


def to_json(counts: Mapping[str, Counts]) -> dict[str, dict[str, Any]]:
    return {runner: asdict(c) for runner, c in counts.items()}


def from_json(raw: Any) -> dict[str, Counts]:
    """What ``to_json`` wrote; anything else (an older record, a bad value) is nothing."""
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Counts] = {}
    for runner, value in raw.items():
        if not isinstance(value, Mapping):
            continue
        try:
            out[str(runner)] = Counts(
                collected=None if value.get("collected") is None else int(value["collected"]),
                failed=int(value.get("failed", 0)),
                skipped=int(value.get("skipped", 0)),
                xfailed=int(value.get("xfailed", 0)),
                deselected=int(value.get("deselected", 0)),
            )
        except (TypeError, ValueError):
            continue
    return out


def ran_less(
    base: Mapping[str, Counts], head: Mapping[str, Counts], *, head_passed: bool = False
) -> list[str]:
    """What the head's verify ran less of than the base's, one sentence each; [] when
    nothing. A runner the base reported and the head does not is a verify that no longer
    runs it; a head that ran no test at all is said whatever the base did; and a verify
    that passed (``head_passed``) while its runner reported failing tests did not run
    them as a check (``make`` told to ignore the error, ``|| true``)."""
    out: list[str] = []
    if head_passed:
        out.extend(
            f"{runner} reported {c.failed} failing test(s) on the head, yet verify passed"
            for runner, c in sorted(head.items())
            if c.failed
        )
    for runner, b in sorted(base.items()):
        h = head.get(runner)
        if h is None:
            if b.collected:
                out.append(
                    f"{runner} reported {b.collected} test(s) on the base and no test run "
                    "on the head"
                )
            continue
        if b.collected is not None and h.collected is not None and h.collected < b.collected:
            out.append(f"{runner} ran {h.collected} test(s) on the head, {b.collected} on the base")
        if h.skipped > b.skipped:
            out.append(
                f"{runner} skipped {h.skipped - b.skipped} more test(s) on the head "
                f"({h.skipped}, {b.skipped} on the base)"
            )
        if h.xfailed > b.xfailed:
            out.append(
                f"{runner} marked {h.xfailed - b.xfailed} more test(s) as expected to fail "
                f"on the head ({h.xfailed}, {b.xfailed} on the base)"
            )
        if h.deselected > b.deselected:
            out.append(
                f"{runner} deselected {h.deselected - b.deselected} more test(s) on the head"
            )
    if head and all(c.executed == 0 for c in head.values()):
        out.append("verify ran no test at all on the head")
    return _unique(out)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


# -- the readers: lines in, the runner's counts (summed over its runs) or None -------------


def _sum(items: list[Counts]) -> Counts | None:
    if not items:
        return None
    total = items[0]
    for c in items[1:]:
        total = total + c
    return total


_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in [\d.]+s\s*$")
_UNITTEST_END = re.compile(r"^(OK|FAILED|NO TESTS RAN)(?: \((.*)\))?\s*$")


def _unittest(lines: list[str]) -> Counts | None:
    runs: list[Counts] = []
    for i, line in enumerate(lines):
        ran = _UNITTEST_RAN.match(line.strip())
        if not ran:
            continue
        parts: dict[str, int] = {}
        # The verdict follows a blank line: ``OK``, ``OK (skipped=1)``, ``FAILED (...)``.
        for later in lines[i + 1 : i + 4]:
            end = _UNITTEST_END.match(later.strip())
            if end:
                for item in (end.group(2) or "").split(","):
                    name, _, value = item.strip().partition("=")
                    if value.strip().isdigit():
                        parts[name.strip()] = int(value)
                break
        runs.append(
            Counts(
                collected=int(ran.group(1)),
                failed=parts.get("failures", 0)
                + parts.get("errors", 0)
                + parts.get("unexpected successes", 0),
                skipped=parts.get("skipped", 0),
                xfailed=parts.get("expected failures", 0),
            )
        )
    if not runs and any(line.strip() == "NO TESTS RAN" for line in lines):
        return Counts()  # Python 3.12+: no test found
    return _sum(runs)


_PYTEST_WORDS = {
    "passed": "passed",
    "failed": "failed",
    "error": "errors",
    "errors": "errors",
    "skipped": "skipped",
    "xfailed": "xfailed",
    "xpassed": "xpassed",
    "deselected": "deselected",
    "warning": "warnings",
    "warnings": "warnings",
    "rerun": "rerun",
    "reruns": "rerun",
    "subtests passed": "ignored",
}
_PYTEST_LINE = re.compile(
    r"^=*\s*(?P<parts>(?:\d+ [a-z ]+?)(?:, \d+ [a-z ]+?)*|no tests ran)"
    r"(?: in [\d.]+s(?: \([\d:.]+\))?)\s*=*$"
)


def _pytest(lines: list[str]) -> Counts | None:
    runs: list[Counts] = []
    for line in lines:
        m = _PYTEST_LINE.match(line.strip())
        if not m:
            continue
        parts: dict[str, int] = {}
        known = True
        if m.group("parts") != "no tests ran":
            for item in m.group("parts").split(", "):
                number, _, word = item.partition(" ")
                name = _PYTEST_WORDS.get(word.strip())
                if name is None:
                    known = False
                    break
                parts[name] = parts.get(name, 0) + int(number)
        if not known:
            continue
        runs.append(
            Counts(
                collected=sum(
                    parts.get(k, 0) for k in ("passed", "failed", "errors", "skipped", "xfailed")
                )
                + parts.get("xpassed", 0),
                failed=parts.get("failed", 0) + parts.get("errors", 0),
                skipped=parts.get("skipped", 0),
                xfailed=parts.get("xfailed", 0),
                deselected=parts.get("deselected", 0),
            )
        )
    return _sum(runs)


_JEST_LINE = re.compile(r"^Tests:\s+(?P<parts>.*\d+ total)\s*$")


def _jest(lines: list[str]) -> Counts | None:
    runs: list[Counts] = []
    for line in lines:
        m = _JEST_LINE.match(line.strip())
        if not m:
            continue
        parts = {word: int(n) for n, word in re.findall(r"(\d+) ([a-z]+)", m.group("parts"))}
        runs.append(
            Counts(
                collected=parts.get("total", 0),
                failed=parts.get("failed", 0),
                skipped=parts.get("skipped", 0) + parts.get("todo", 0),
            )
        )
    return _sum(runs)


_VITEST_LINE = re.compile(r"^Tests\s+(?P<parts>(?:\d+ [a-z]+(?: \| )?)+)\s+\((?P<total>\d+)\)")


def _vitest(lines: list[str]) -> Counts | None:
    runs: list[Counts] = []
    for line in lines:
        m = _VITEST_LINE.match(line.strip())
        if not m:
            continue
        parts = {word: int(n) for n, word in re.findall(r"(\d+) ([a-z]+)", m.group("parts"))}
        runs.append(
            Counts(
                collected=int(m.group("total")),
                failed=parts.get("failed", 0),
                skipped=parts.get("skipped", 0) + parts.get("todo", 0),
            )
        )
    return _sum(runs)


_GO_VERBOSE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): \S+")
_GO_PACKAGE = re.compile(r"^(ok|FAIL|\?)\s+\S+\t(.*)$")  # go test writes tabs


def _go(lines: list[str]) -> Counts | None:
    verbose = [m.group(1) for line in lines if (m := _GO_VERBOSE.match(line))]
    if verbose:
        return Counts(
            collected=len(verbose),
            failed=verbose.count("FAIL"),
            skipped=verbose.count("SKIP"),
        )
    packages = [m for line in lines if (m := _GO_PACKAGE.match(line.rstrip()))]
    if not packages:
        return None
    if all("[no tests to run]" in m.group(2) or "[no test files]" in m.group(2) for m in packages):
        return Counts()
    # Without -v go test says only that packages passed or failed, not how many tests.
    return Counts(collected=None, failed=sum(1 for m in packages if m.group(1) == "FAIL"))


_CARGO_LINE = re.compile(r"^test result: (?:ok|FAILED)\. (?P<parts>.*?)(?:; finished in .*)?$")


def _cargo(lines: list[str]) -> Counts | None:
    runs: list[Counts] = []
    for line in lines:
        m = _CARGO_LINE.match(line.strip())
        if not m:
            continue
        parts = {
            word: int(n) for n, word in re.findall(r"(\d+) ([a-z ]+?)(?:;|$)", m.group("parts"))
        }
        runs.append(
            Counts(
                collected=parts.get("passed", 0) + parts.get("failed", 0) + parts.get("ignored", 0),
                failed=parts.get("failed", 0),
                skipped=parts.get("ignored", 0),
                deselected=parts.get("filtered out", 0),
            )
        )
    return _sum(runs)


_READERS = (
    ("unittest", _unittest),
    ("pytest", _pytest),
    ("jest", _jest),
    ("vitest", _vitest),
    ("go test", _go),
    ("cargo test", _cargo),
)
