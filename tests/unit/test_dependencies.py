"""pyproject.toml says what the product uses: every third-party module that bot/ and
jobs/ import comes from a declared distribution, and every declared distribution is
imported or named here with the reason it is declared without an import."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.helpers import ROOT

# Declared, not imported by name, on purpose.
NOT_IMPORTED = {
    "gevent": "gunicorn's worker class (bot/web/serving.py names it)",
    "hishel": "pinned below 2: githubkit 0.16 does not import with hishel 2",
    "anyio": "pinned below 4.16: its import is not thread-safe on CPython 3.11 (httpx's)",
    "hiredis": "redis-py parses replies with it when it is installed",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """The runtime dependencies and the agent backends' extras (imported only when the
    extra is installed; the test extra is not the product's)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [*project["dependencies"], *project["optional-dependencies"].get("claude-code", [])]
    return {_norm(re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0]) for dep in deps}


def _imported_modules() -> dict[str, str]:
    """Top-level third-party module -> the first file:line that imports it."""
    found: dict[str, str] = {}
    for path in sorted([*ROOT.glob("bot/**/*.py"), *ROOT.glob("jobs/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("bot", "jobs", "__future__"):
                    continue
                found.setdefault(top, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_imported_module_is_declared() -> None:
    declared = _declared()
    dists = packages_distributions()
    missing = []
    for module, where in _imported_modules().items():
        providers = {_norm(d) for d in dists.get(module, [])}
        assert providers, f"{module} ({where}) is not installed from any distribution"
        if not providers & declared:
            missing.append(f"{module} ({where}) from {sorted(providers)}")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_every_declared_dependency_is_imported_or_explained() -> None:
    dists = packages_distributions()
    used = {_norm(d) for module in _imported_modules() for d in dists.get(module, [])}
    unused = _declared() - used - set(NOT_IMPORTED)
    assert not unused, f"declared in pyproject.toml but never imported: {sorted(unused)}"
    for name in NOT_IMPORTED:
        assert name in _declared(), f"{name} is explained here but no longer declared"
