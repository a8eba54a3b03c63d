"""Red team of the metric loop's pure rules: what the scope must never allow, what the
number must never be read from, when a label must not switch a loop's kind."""

from __future__ import annotations

from typing import Any

import pytest

from bot.core.record import LoopRecord
from bot.core.rules.command_paths import named_paths
from bot.core.rules.loop import metric as rules
from bot.core.text import metric as text

TRACKED = [
    "metric.py",
    "bench/run.py",
    "bench/data.json",
    "size.sh",
    "src/a.py",
    "src/work.txt",
    "tests/__init__.py",
    "tests/test_a.py",
    "spec/a_spec.rb",
]


@pytest.mark.parametrize(
    ("command", "named"),
    [
        ("python3 metric.py", ["metric.py"]),
        ("python3 metric.py --file src/work.txt", ["metric.py"]),  # data stays in scope
        ("python3 -X dev -W ignore bench/run.py", ["bench/run.py"]),
        ("python -m bench.run", ["bench/run.py"]),
        ("./size.sh | tail -1", ["size.sh"]),
        ("bash size.sh", ["size.sh"]),
        ("FOO=1 python3 ./metric.py && echo done", ["metric.py"]),
        ("pytest -q tests/", ["tests"]),
        ("python -m pytest tests/test_a.py::test_x -q", ["tests/test_a.py"]),
        ("python3 -m unittest -q tests.test_a", ["tests/test_a.py"]),
        ("rspec spec/a_spec.rb", ["spec/a_spec.rb"]),
        ("cloc src", []),  # what is measured, not what measures
        ("wc -l src/a.py", []),
        ("python3 -c 'import metric'", []),
        ("python -m unittest -q", []),
        ("python3 'unbalanced", []),
    ],
)
def test_named_paths_are_what_the_commands_run(command: str, named: list[str]) -> None:
    assert named_paths([command], TRACKED) == named


def test_what_the_commands_run_is_outside_even_a_scope_that_covers_everything() -> None:
    named = named_paths(["python3 metric.py", "pytest tests/"], TRACKED)
    touched = ["metric.py", "tests/test_a.py", "src/a.py", "tests"]
    assert rules.outside_scope(touched, ("**",), named) == ["metric.py", "tests", "tests/test_a.py"]
    assert rules.matching(TRACKED, ("**/*.py",), named) == ["bench/run.py", "src/a.py"]
    # A prefix that is not a directory boundary is not protected.
    assert rules.in_scope("metric.pyx", ("**",), named)
    assert rules.in_scope("tests2/x.py", ("**",), named)
    # Nor may a change make the results file a directory (the harness writes it at the end).
    assert not rules.in_scope(f"{rules.TSV_NAME}/x", ("**",))


def test_the_sandboxs_omitted_mark_is_never_the_metric() -> None:
    output = "score: 12\n" + "\n[... 98765 bytes of output omitted ...]\n" + "done, no digits\n"
    assert rules.last_number(output).value == 12.0
    assert rules.last_number("\n[... 5 bytes of output omitted ...]\n").value is None


@pytest.mark.parametrize(
    ("fields", "switch"),
    [
        ({}, False),  # never worked (triage refused it, or phase 0 failed): may switch
        ({"total_turns": 1}, True),
        ({"head_sha": "a" * 40}, True),
        ({"pr_number": 3}, True),
        ({"metric_results": [{"iteration": 0, "status": "baseline", "metric": 1.0}]}, True),
    ],
)
def test_a_worked_loop_never_switches_kind(fields: dict[str, object], switch: bool) -> None:
    record = LoopRecord(repo="a/b", issue=1, installation_id=1, branch="loop/issue-1", **fields)
    assert text.switch_refused(record, "metric") is switch
    assert text.switch_refused(record, "code") is False  # its own kind restarts as always


# -- guards followed statically: cd, sh -c, make, npm; and guards that name no test ---------

FILES = {
    "Makefile": (
        "PY ?= python3\n"
        ".PHONY: check lint\n"
        "check: lint unit ; @echo done\n"
        "lint:\n\t@ruff check src\n"
        "unit:\n\t-cd tests && $(PY) -m pytest test_a.py\n"
        "\tpython3 bench/run.py\n"
        "other:\n\t./size.sh\n"
    ),
    "ci/Makefile": "all:\n\tsh -c 'python3 ../metric.py'\n",
    "package.json": '{"scripts": {"test": "bash size.sh && jest", "lint": "eslint ."}}',
}
FOLLOWED = [*TRACKED, *FILES]


def read(path: str) -> str | None:
    return FILES.get(path)


@pytest.mark.parametrize(
    ("command", "named"),
    [
        ("cd tests && python3 -m pytest test_a.py", ["tests/test_a.py"]),
        ("cd bench; cd ..; python3 metric.py", ["metric.py"]),
        ("cd .. && python3 metric.py", []),  # leaves the repository: nothing there
        ("sh -c 'python3 bench/run.py --fast'", ["bench/run.py"]),
        ('bash -lc "cd tests && pytest test_a.py"', ["tests/test_a.py"]),
        # The default target's recipe and prerequisites; its own makefile.
        ("make", ["Makefile", "bench/run.py", "tests/test_a.py"]),
        ("make other", ["Makefile", "size.sh"]),
        ("make -C ci", ["ci/Makefile", "metric.py"]),
        ("make -f ci/Makefile all", ["ci/Makefile"]),  # -f: paths stay relative to here
        ("npm test", ["package.json", "size.sh"]),
        ("npm run lint", ["package.json"]),
        ("tox -e py311", []),  # no tox.ini here
    ],
)
def test_guards_are_followed_as_far_as_they_can_be_read(command: str, named: list[str]) -> None:
    assert named_paths([command], FOLLOWED, read) == named


def test_a_recursive_makefile_stops() -> None:
    loop = {"Makefile": "a:\n\tmake b\nb:\n\tmake a\n\tpython3 metric.py\n"}
    assert named_paths(["make a"], [*TRACKED, "Makefile"], loop.get) == [
        "Makefile",
        "metric.py",
    ]


def protected(command: str, guard: str, tracked: list[str], files: dict[str, str]) -> Any:
    """Which of ``probe`` paths the scope ``**`` leaves to the agent."""
    named = rules.protected_paths(command, guard, tracked, files.get)
    return lambda *probe: [p for p in probe if rules.in_scope(p, ("**",), named)]


TREE = [
    *TRACKED,
    "Makefile",
    "conftest.py",
    "pytest.ini",
    "pyproject.toml",
    "src/a_test.go",
    "web/app.test.ts",
    "web/app.ts",
    "src/conftest.py",
    "docs/testing.md",
    "latest/notes.md",
]


def test_without_a_test_of_its_own_the_guard_protects_tests_and_runner_config() -> None:
    # `make lint` runs `ruff check src`: no test of its own, so every test is the guard's,
    # new ones included, and the config a runner reads.
    editable = protected("python3 metric.py", "make lint", TREE, FILES)
    assert (
        editable(
            "spec/a_spec.rb",
            "src/a_test.go",
            "web/app.test.ts",
            "tests/new_test_b.py",
            "Tests/FooTests/FooTests.swift",
            "Lib.Tests/FooTests.cs",
            "app/tests.py",
            "conftest.py",
            "pkg/conftest.py",  # a new one
            "pyproject.toml",
            "metric.py",
        )
        == []
    )
    assert editable("web/app.ts", "docs/testing.md", "latest/notes.md", "src/a.py") == [
        "web/app.ts",
        "docs/testing.md",
        "latest/notes.md",
        "src/a.py",
    ]


def test_a_guard_that_names_its_tests_protects_those_and_what_configures_any_run() -> None:
    # `make check` reaches tests/test_a.py through its recipe and runs pytest.
    editable = protected("python3 metric.py", "make check", TREE, FILES)
    assert editable("tests/test_a.py", "bench/run.py", "conftest.py", "pyproject.toml") == []
    assert editable("spec/a_spec.rb", "web/app.test.ts") == ["spec/a_spec.rb", "web/app.test.ts"]
    # A guard that runs its test with no test runner leaves the shared config to the scope.
    editable = protected("python3 metric.py", "python3 tests/test_a.py", TREE, FILES)
    assert editable("pyproject.toml") == ["pyproject.toml"]
    # A script that names no test (what it runs is not known): every test is the guard's.
    editable = protected("python3 metric.py", "python3 bench/run.py --check", TREE, FILES)
    assert editable("pyproject.toml", "spec/a_spec.rb") == []
    assert editable("conftest.py", "pkg/pytest.ini") == []  # runner config: always the guard's


SCRIPTS = {
    "run_tests.sh": "#!/bin/sh\nset -e\npytest tests/\n",
    "bench/Makefile": "run:\n\tpython3 run.py\n",
    "Makefile": "bench:\n\t$(MAKE) -C bench run\n",
    "web/package.json": '{"scripts": {"bench": "node bench.js"}}',
    "tox.ini": "[tox]\nenvlist = bench\n\n[testenv:bench]\ncommands =\n    python bench/run.py\n",
}
REPO = [
    "bench/run.py",
    "bench/Makefile",
    "Makefile",
    "run_tests.sh",
    "tests/test_a.py",
    "web/package.json",
    "web/bench.js",
    "tox.ini",
    "bench/run.ts",
    "manage.py",
    "app/tests.py",
]


@pytest.mark.parametrize(
    ("command", "guard", "kept"),  # kept from the agent
    [
        ("make bench", "pytest tests/", "bench/run.py"),  # $(MAKE) -C in a recipe
        ("make --directory=bench run", "pytest tests/", "bench/run.py"),
        ("npm --prefix web run bench", "pytest tests/", "web/bench.js"),
        ("deno run -A bench/run.ts", "pytest tests/", "bench/run.ts"),
        ("node -r ts-node/register bench/run.ts", "pytest tests/", "bench/run.ts"),
        ("hyperfine --runs 3 'python3 bench/run.py'", "pytest tests/", "bench/run.py"),
        ("tox -e bench", "pytest tests/", "bench/run.py"),
        ("pushd bench && python3 run.py", "pytest tests/", "bench/run.py"),
        ("time nice -n 5 timeout 60 python3 bench/run.py", "pytest tests/", "bench/run.py"),
        # A script guard that runs the tests: the tests stay the guard's.
        ("python3 bench/run.py", "./run_tests.sh", "tests/test_a.py"),
        ("python3 bench/run.py", "python manage.py test", "app/tests.py"),
    ],
)
def test_the_red_teams_escapes_are_closed(command: str, guard: str, kept: str) -> None:
    assert protected(command, guard, REPO, SCRIPTS)(kept) == []
