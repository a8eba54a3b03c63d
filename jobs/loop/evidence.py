"""Evidence from the base: what verify said before any change, and which tests changed.

A pull request is evidence of a fix only next to what verify said on the commit it
started from: failed on the base and passes on the head is a fix shown; passed on the
base says the existing tests do not capture the issue, so the change must bring a test
that does. The loop (``jobs.loop.job``) runs verify on the base once per base commit, keeps
the result here (Redis, per repository, base sha and commands), and puts the pair in
the prompts, the record and the pull request body.

Everything but ``BaseVerifyCache`` is pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from bot.core.evidence import runs
from bot.core.evidence.paths import is_test_path
from jobs.sandbox.bwrap import Result

TAIL_CHARS = 2000  # of the base verify output kept in the record and the first prompt
CACHE_TTL = 3 * 24 * 3600  # a base commit's result outlives a burst of issues, not a week
CACHE_PREFIX = "loopbot:baseverify:"


def tests_changed(paths: Iterable[str]) -> list[str]:
    """The test files among ``paths`` (files added or changed vs the base), sorted."""
    return sorted({p for p in paths if is_test_path(p)})


def outcome(result: Result, sha: str) -> dict[str, Any]:
    """The record's ``base_verify`` for a verify run on ``sha``."""
    return {
        "sha": sha,
        "passed": result.passed,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "tail": result.output[-TAIL_CHARS:],
        "seconds": round(result.seconds, 3),
        "cached": False,
        # What the test runners said they ran (bot/core/evidence/runs.py), read from the
        # whole output: the head's verify is compared with it.
        "tests": runs.to_json(runs.parse(result.output)),
    }


def describe(v: dict[str, Any]) -> str:
    """``passed (exit 0)``, ``failed (exit 1)``, ``failed (timed out)``."""
    if v.get("timed_out"):
        return "failed (timed out)"
    return f"{'passed' if v.get('passed') else 'failed'} (exit {v.get('exit_code')})"


def evidence_line(base: dict[str, Any], head: dict[str, Any]) -> str:
    """``verify on base abc1234: failed (exit 1) → on head def5678: passed``."""
    on_base = (
        f"verify on base {str(base.get('sha', ''))[:7]}: {describe(base)}"
        if base
        else "verify on base: not run (this loop started before base runs were recorded)"
    )
    on_head = "passed" if head.get("passed") else describe(head)
    on_head = f"on head {str(head.get('sha', ''))[:7]}: {on_head}"
    return f"{on_base} → {on_head}"


def needs_test(base: dict[str, Any]) -> bool:
    """Verify passed before any change: it cannot tell a fix from no fix."""
    return bool(base.get("passed"))


def cache_key(repo: str, sha: str, verify: str, setup: str | None, environment: Any = None) -> str:
    """Per repository, base commit and what produces the result: the commands (setup
    shapes what verify sees) and the sandbox's ``environment`` (network, timeout), so a
    ``loop.yml`` that changes either never reuses an old answer."""
    commands = hashlib.sha256(
        # "tests": results from before the runners' counts were kept are not reused.
        json.dumps([verify, setup or "", environment, "tests"], default=str).encode()
    ).hexdigest()[:16]
    return f"{CACHE_PREFIX}{repo}:{sha}:{commands}"


def cacheable(v: dict[str, Any]) -> bool:
    """A timeout says more about the machine's load at the time than about the commit:
    run it again next time rather than keep it for days."""
    return not v.get("timed_out")


class BaseVerifyCache:
    """Base verify results in Redis, with a TTL. ``redis`` is a synchronous client."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self.redis.get(key)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.redis.set(key, json.dumps(value), ex=CACHE_TTL)
