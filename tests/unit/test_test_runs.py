"""What the test runners say they ran (bot/core/evidence/runs.py) and which changed files
held-out verify puts back (bot/core/evidence/held_out.py): tables of the runners' summary
lines, and unittest and pytest run for real on a small project."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bot.core.evidence import held_out, runs
from bot.core.evidence.runs import Counts
from bot.core.rules.pull import review
from bot.core.rules.pull.merge import Refuse, decide
from tests.e2e.review.test_receipt import FACTS

# (runner output, runner, counts): the summary lines as each runner prints them.
SUMMARIES = [
    (
        "..\n----------------------------------------------------------------------\n"
        "Ran 2 tests in 0.000s\n\nOK\n",
        "unittest",
        Counts(collected=2),
    ),
    (
        "Ran 4 tests in 0.001s\n\nFAILED (failures=1, errors=1, skipped=1)\n",
        "unittest",
        Counts(collected=4, failed=2, skipped=1),
    ),
    (
        "Ran 3 tests in 0.001s\n\nOK (skipped=1, expected failures=1)\n",
        "unittest",
        Counts(collected=3, skipped=1, xfailed=1),
    ),
    ("Ran 0 tests in 0.000s\n\nOK\n", "unittest", Counts()),  # Python 3.11
    ("Ran 0 tests in 0.000s\n\nNO TESTS RAN\n", "unittest", Counts()),  # 3.12+
    (
        "===== 1 failed, 2 passed, 1 skipped, 1 xfailed, 2 warnings in 0.12s =====",
        "pytest",
        Counts(collected=5, failed=1, skipped=1, xfailed=1),
    ),
    ("3 passed, 1 deselected in 0.01s", "pytest", Counts(collected=3, deselected=1)),
    ("1 passed, 1 error in 0.30s", "pytest", Counts(collected=2, failed=1)),
    ("==== no tests ran in 0.01s ====", "pytest", Counts()),
    ("=== 2 passed in 61.2s (0:01:01) ===", "pytest", Counts(collected=2)),
    (
        "Tests:       1 failed, 1 skipped, 1 todo, 2 passed, 5 total\nTime: 1 s",
        "jest",
        Counts(collected=5, failed=1, skipped=2),
    ),
    (
        " \x1b[2m Test Files \x1b[22m 1 passed (1)\n\x1b[2m      Tests \x1b[22m "
        "2 passed | 1 skipped (3)\n",
        "vitest",
        Counts(collected=3, skipped=1),
    ),
    ("      Tests  1 failed | 2 passed (3)", "vitest", Counts(collected=3, failed=1)),
    (
        "=== RUN   TestAdd\n--- PASS: TestAdd (0.00s)\n--- SKIP: TestMul (0.00s)\n"
        "--- FAIL: TestDiv (0.00s)\nFAIL\nFAIL\texample.com/calc\t0.002s\n",
        "go test",
        Counts(collected=3, failed=1, skipped=1),
    ),
    (
        "ok  \texample.com/calc\t0.002s [no tests to run]\n"
        "?   \texample.com/cmd\t[no test files]\n",
        "go test",
        Counts(),
    ),
    ("ok  \texample.com/calc\t0.002s\n", "go test", Counts(collected=None)),
    (
        # cargo test as it prints (captured from cargo 1.x): the lib, then doc-tests.
        "running 3 tests\ntest tests::slow ... ignored\ntest tests::zero ... ok\n"
        "test tests::adds ... FAILED\n\ntest result: FAILED. 1 passed; 1 failed; 1 ignored; "
        "0 measured; 0 filtered out; finished in 0.08s\n\n   Doc-tests ct\n\nrunning 0 tests"
        "\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 2 filtered out; "
        "finished in 0.00s\n",
        "cargo test",
        Counts(collected=3, failed=1, skipped=1, deselected=2),
    ),
]


@pytest.mark.parametrize(("output", "runner", "counts"), SUMMARIES)
def test_each_runner_s_summary_is_read(output: str, runner: str, counts: Counts) -> None:
    assert runs.parse(output) == {runner: counts}


@pytest.mark.parametrize(
    "output",
    [
        "",
        "everything is fine\n",
        "ok 1 - add works\nok 2 - zero\n",  # TAP: no tab-separated go package line
        "FAIL: test_add (test_calc.AddTest)\n",  # a unittest failure header, not go
        "Ran out of time\n",
        "2 passed the threshold in 3s",  # words a runner never prints
    ],
)
def test_other_output_is_no_runner(output: str) -> None:
    assert runs.parse(output) == {}


def test_runs_of_one_runner_add_up() -> None:
    out = "Ran 2 tests in 0.1s\n\nOK\n" + "Ran 3 tests in 0.1s\n\nFAILED (failures=1)\n"
    assert runs.parse(out) == {"unittest": Counts(collected=5, failed=1)}


def test_counts_survive_the_record_and_bad_values_are_nothing() -> None:
    counts = {"pytest": Counts(collected=3, skipped=1), "go test": Counts(collected=None)}
    assert runs.from_json(runs.to_json(counts)) == counts
    assert runs.from_json(None) == {} and runs.from_json([1]) == {}
    assert runs.from_json({"pytest": {"collected": "many"}, "x": 3}) == {}


BASE = {"unittest": Counts(collected=3, failed=1, skipped=0)}


@pytest.mark.parametrize(
    ("head", "said"),
    [
        ({"unittest": Counts(collected=3)}, []),
        ({"unittest": Counts(collected=4)}, []),  # a test added
        ({"unittest": Counts(collected=2)}, ["unittest ran 2 test(s) on the head, 3 on the base"]),
        (
            {"unittest": Counts(collected=3, skipped=1)},
            ["unittest skipped 1 more test(s) on the head (1, 0 on the base)"],
        ),
        (
            {"unittest": Counts(collected=3, xfailed=1)},
            ["unittest marked 1 more test(s) as expected to fail on the head (1, 0 on the base)"],
        ),
        (
            {"unittest": Counts()},
            [
                "unittest ran 0 test(s) on the head, 3 on the base",
                "verify ran no test at all on the head",
            ],
        ),
        ({}, ["unittest reported 3 test(s) on the base and no test run on the head"]),
        (
            {"unittest": Counts(collected=3), "pytest": Counts()},
            [],  # another runner that ran nothing, beside one that ran all: not "no test"
        ),
    ],
)
def test_what_the_head_ran_less_of(head: dict[str, Counts], said: list[str]) -> None:
    assert runs.ran_less(BASE, head) == said


def test_a_passing_verify_whose_runner_reported_failures_is_said() -> None:
    head = {"unittest": Counts(collected=3, failed=1)}
    said = runs.ran_less(BASE, head, head_passed=True)
    assert said == ["unittest reported 1 failing test(s) on the head, yet verify passed"]
    assert runs.ran_less(BASE, head) == []  # a failing verify says so itself


def test_a_head_that_runs_nothing_is_said_even_without_a_base() -> None:
    assert runs.ran_less({}, {"pytest": Counts()}) == ["verify ran no test at all on the head"]
    assert runs.ran_less({}, {"go test": Counts(collected=None)}) == []  # unknown, not none


# -- unittest and pytest for real -------------------------------------------------------------

PROJECT = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": (
        "import unittest\n\nimport pytest\n\nfrom calc import add\n\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n\n"
        "    @unittest.skip('later')\n    def test_skipped(self):\n        pass\n\n"
        "    @unittest.expectedFailure\n    def test_known(self):\n        self.assertEqual(1, 2)\n"
    ),
}


def _run(tmp_path: Path, *args: str) -> str:
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(text)
    done = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def test_real_unittest_output(tmp_path: Path) -> None:
    out = _run(tmp_path, "-m", "unittest", "test_calc")
    assert runs.parse(out) == {"unittest": Counts(collected=4, failed=1, skipped=1, xfailed=1)}, out


def test_real_pytest_output(tmp_path: Path) -> None:
    out = _run(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", "test_calc.py")
    assert runs.parse(out) == {"pytest": Counts(collected=4, failed=1, skipped=1, xfailed=1)}, out
    quiet = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "zero")
    assert runs.parse(quiet) == {"pytest": Counts(collected=1, deselected=3)}, quiet


# -- which files are held out ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changed", "verify", "held"),
    [
        (["calc.py", "test_calc.py"], "python3 -m unittest test_calc", ["test_calc.py"]),
        (["calc.py"], "python3 -m unittest", []),
        (["src/x.py", "tests/fixtures/a.json"], "pytest", ["tests/fixtures/a.json"]),
        (["calc.py", "pytest.ini", "setup.cfg"], "pytest", ["pytest.ini", "setup.cfg"]),
        (["run_tests.sh", "calc.py"], "sh ./run_tests.sh", ["run_tests.sh"]),
        (["Makefile", "calc.py"], "make check", ["Makefile"]),
        (["package.json", "src/a.js"], "npm test", ["package.json"]),
        (["package.json", "src/a.js"], "python3 -m pytest", []),  # a dependency, not the runner
        (["checks/calc_check.py"], "python -m checks.calc_check", ["checks/calc_check.py"]),
        (["checks/a.py", "b.py"], "python3 -m pytest checks/", ["checks/a.py"]),
        (["t/x.py", "t/y.py"], "pytest t/x.py::test_one", ["t/x.py"]),
        (["CalcTests/AddTests.swift"], "swift test", ["CalcTests/AddTests.swift"]),
        (["jest.config.js", "src/a.ts"], "npx jest", ["jest.config.js"]),
        (["tools/check.py", "calc.py"], "python3 tools/check.py", ["tools/check.py"]),
        (["ci/unit"], "CI=1 bash ci/unit --fast", ["ci/unit"]),
        (["pkg/a.py", "pkg/b.py"], "python3 -m unittest pkg.a.T.test_x", ["pkg/a.py"]),
        # Behind wrappers and runners of runners.
        (["Makefile"], "timeout 600 make test", ["Makefile"]),
        (["Makefile"], "env CI=1 nice -n 5 make check", ["Makefile"]),
        (["tests/x.py", "t.py"], "uv run --frozen pytest t.py", ["t.py", "tests/x.py"]),
        # What Python runs instead of the tests, or before them.
        (
            ["__pycache__/test_calc.cpython-311.pyc"],
            "pytest",
            ["__pycache__/test_calc.cpython-311.pyc"],
        ),
        (["calc.pyc", "calc.py"], "pytest", ["calc.pyc"]),
        (
            ["test_calc.cpython-311-x86_64-linux-gnu.so"],
            "pytest",
            ["test_calc.cpython-311-x86_64-linux-gnu.so"],
        ),
        (["difflib.py", "calc.py"], "python3 -m unittest", ["difflib.py"]),
        (["json/__init__.py", "json/x.py"], "pytest", ["json/__init__.py"]),
        (["sitecustomize.py", "x.pth"], "pytest", ["sitecustomize.py", "x.pth"]),
        (["pkg/json.py", "pkg/types.py", "site/index.html"], "pytest", []),  # not first on the path
        # Words that name code, not tests: never held out.
        (["calc.py"], "python3 -m py_compile calc.py && python3 -m unittest -q", []),
        (["notes/a.md"], "test -d notes", []),
        (["calc.py", "lint.cfg"], "ruff check calc.py && pytest", []),
    ],
)
def test_held_out_paths(changed: list[str], verify: str, held: list[str]) -> None:
    assert held_out.held_out_paths(changed, verify) == held


@pytest.mark.parametrize(
    ("title", "body", "asked"),
    [
        ("add() subtracts", "add(2, 3) should be 5. Fix calc.add.", False),
        ("x", "Fix the bug so that the failing test passes.", False),
        ("x", "The test expects 6 for add(2, 3): the test is wrong.", True),
        ("Correct test_add", "It asserts the wrong sum.", False),  # a name, no verb + word
        ("x", "Please update the assertion in test_calc.py.", True),
        ("x", "The snapshot tests are outdated since the redesign.", True),
        ("x", "Rewrite the tests for the parser.", True),
        ("x", "Delete the obsolete fixtures.", True),
    ],
)
def test_an_issue_that_asks_for_a_test_change(title: str, body: str, asked: bool) -> None:
    assert held_out.asks_for_test_change(title, body) is asked


def _evidence(**kw: object) -> dict[str, object]:
    ev = held_out.record(
        sha="h" * 40,
        base="b" * 40,
        verify="python3 -m unittest",
        held=["test_calc.py"],
        changed=["test_calc.py"],
        base_counts={},
        head_counts={},
        held_result={"passed": False, "exit_code": 1, "timed_out": False, "tail": "FAIL"},
        not_run="",
        asked=False,
    )
    return ev | kw


def test_evidence_stands_on_its_own_head_only() -> None:
    ev = _evidence()
    assert held_out.stands(ev) and held_out.stands(ev, "h" * 40)
    assert not held_out.stands(ev, "x" * 40)  # another head: says nothing about it
    assert not held_out.stands(_evidence(held_out={"passed": True}))
    assert held_out.stands(_evidence(held_out={}, ran_less=["verify ran no test at all"]))
    assert not held_out.stands({})
    assert "the code under test was not changed" in held_out.summary(ev)
    changed = _evidence(code_changed=True)
    assert "the code changed too" in held_out.summary(changed)
    assert "/loop-dismiss F3" in held_out.person_detail(ev, "F3")
    assert "had a turn to fix the code" in held_out.person_detail(ev, "F3")
    assert "asks for a test to change" in held_out.person_detail(_evidence(asked=True), "F3")


def test_the_gate_refuses_on_the_evidence_whatever_the_critic_said() -> None:
    refused = decide(replace(FACTS, tests_changed_to_pass="the tests were changed to pass: x"))
    assert isinstance(refused, Refuse) and refused.reason == "needs_human"
    assert "the tests were changed to pass" in refused.why
    assert not isinstance(decide(replace(FACTS, tests_dismissed_by="@writer")), Refuse)


def test_a_dismissal_covers_the_evidence_it_judged_only() -> None:
    ev = _evidence(digest="d1")
    log = [
        {
            "id": "F1",
            "fingerprint": review.TESTS_CHANGED_FINGERPRINT,
            "status": "open",
            "severity": "sev1",
        }
    ]
    log[0].update(status="dismissed", dismissed_by="writer", dismissed_sha="h" * 40)
    review.bind_dismissal(log, "F1", ev)
    assert review.dismissal_holds(log[0], ev)
    assert review.lapse_stale_dismissal(log, ev, "h" * 40) == log  # the same evidence
    later = _evidence(sha="k" * 40, digest="d2")  # the tests changed again on a new head
    assert not review.dismissal_holds(log[0], later)
    lapsed = review.lapse_stale_dismissal(log, later, "k" * 40)
    assert lapsed[0]["status"] == "resolved"  # raised again, it reopens for a writer
    assert lapsed[0]["lapsed_dismissals"] == [
        {"dismissed_by": "writer", "dismissed_reason": None, "dismissed_sha": "h" * 40}
    ]
    assert not review.dismissal_holds({**log[0], "evidence_digest": ""}, _evidence(digest=""))
