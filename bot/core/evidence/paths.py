"""What a test file looks like: one rule, so the loop, the critic and held-out verify agree
on what "a test changed" means."""

from __future__ import annotations

import fnmatch

# What a test file looks like, by directory or by name, across the usual ecosystems.
# One rule, so the loop and the critic agree on what "a test changed" means.
_TEST_DIRS = frozenset({"test", "tests", "spec", "specs", "__tests__", "testing", "testdata"})
_TEST_NAMES = (
    "test_*.py",
    "*_test.py",
    "tests.py",
    "conftest.py",
    "*_test.go",
    "*.test.js",
    "*.test.jsx",
    "*.test.ts",
    "*.test.tsx",
    "*.test.mjs",
    "*.test.cjs",
    "*.spec.*",
    "*_spec.rb",
    "*_test.rb",
    "*Test.java",
    "*Tests.java",
    "*Test.kt",
    "*Tests.cs",
    "*_test.exs",
    "*_test.rs",
    "test_*.c",
    "*_test.c",
    "*_test.cc",
    "*_test.cpp",
    "*.bats",
)


def is_test_path(path: str) -> bool:
    """Whether ``path`` (relative, ``/``-separated) looks like a test file."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts:
        return False
    if any(d.lower() in _TEST_DIRS for d in parts[:-1]):
        return True
    name = parts[-1]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _TEST_NAMES)
