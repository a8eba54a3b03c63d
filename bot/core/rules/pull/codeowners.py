"""CODEOWNERS, as GitHub reads it: which owners a changed path asks a review from.

GitHub looks for the file in ``.github/``, the root, then ``docs/`` (the first found
counts); each line is a gitignore-style pattern and owners, and the LAST matching line
wins (a line with no owners means "nobody owns this"). Pure: the caller reads the file.
https://docs.github.com/en/repositories/managing-your-repositorys-settings-and-features/customizing-your-repository/about-code-owners
"""

from __future__ import annotations

import re

LOCATIONS = (".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")


def parse(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(pattern, owners) per rule line, in file order; comments and blanks dropped."""
    rules = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        pattern, *owners = line.split()
        rules.append((pattern, tuple(o for o in owners if o.startswith("@") or "@" in o)))
    return rules


def _regex(pattern: str) -> re.Pattern[str]:
    anchored = pattern.startswith("/") or "/" in pattern.rstrip("/")
    body = pattern.strip("/")
    out = ""
    i = 0
    while i < len(body):
        if body.startswith("**", i):
            out += ".*"
            i += 2
        elif body[i] == "*":
            out += "[^/]*"
            i += 1
        elif body[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(body[i])
            i += 1
    prefix = "^" if anchored else "^(?:.*/)?"
    # A pattern names a file or a directory: a directory covers everything under it,
    # except "dir/*", which GitHub documents as the directory's own files, not nested ones.
    under = "" if body.endswith("/*") else "(?:/.*)?"
    return re.compile(prefix + out + under + "$")


def owners_of(rules: list[tuple[str, tuple[str, ...]]], path: str) -> tuple[str, ...]:
    """The owners of ``path``: the last matching rule's (none when no rule matches)."""
    found: tuple[str, ...] = ()
    for pattern, owners in rules:
        if pattern == "*" or _regex(pattern).match(path):
            found = owners
    return found


def required_owners(text: str, paths: list[str]) -> list[tuple[str, ...]]:
    """Per changed path that has owners, its owners (one of each group must approve),
    deduplicated and in a stable order."""
    rules = parse(text)
    groups: list[tuple[str, ...]] = []
    for path in paths:
        owners = owners_of(rules, path)
        if owners and owners not in groups:
            groups.append(owners)
    return groups
