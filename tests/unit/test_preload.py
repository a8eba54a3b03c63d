"""A worker loads, before it forks a job, what the job would load on first use: every
GitHub endpoint loopbot calls, and the HTTP clients' transports (bot/io/preload.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from bot.io import preload
from tests.helpers import ROOT


def test_every_endpoint_loopbot_calls_is_preloaded() -> None:
    """A new call in bot/io/github without its line in ENDPOINTS would be imported by
    every job again, unseen: this is where it shows."""
    called: set[tuple[str, str]] = set()
    for source in (ROOT / "bot" / "io" / "github").glob("*.py"):
        called |= set(re.findall(r"\brest\.(\w+)\.(\w+)\(", source.read_text()))
    assert called, "no githubkit call found: the pattern no longer matches the client"
    assert sorted(called - set(preload.ENDPOINTS)) == []
    assert sorted(set(preload.ENDPOINTS) - called) == []  # none kept that nothing calls


def test_after_preload_calling_every_endpoint_imports_nothing_more() -> None:
    """In a fresh interpreter (what the worker is before it forks): once ``preload()`` has
    run, calling each endpoint, as a job would, adds no module of githubkit, its models or
    the HTTP transports. Each call reaches a transport that answers 404 at once."""
    script = textwrap.dedent(
        """
        import inspect, sys
        import httpx
        from githubkit import GitHub
        import bot.io.github.client  # what the worker has imported: the job code
        from bot.io.preload import ENDPOINTS, preload

        assert preload() == []
        before = set(sys.modules)
        transport = httpx.MockTransport(lambda request: httpx.Response(404, json={}))
        gh = GitHub("t", transport=transport, auto_retry=False, http_cache=False)
        for namespace, method in ENDPOINTS:
            fn = getattr(getattr(gh.rest, namespace), method)
            args = [
                1 if p.annotation in ("int", int) else "x"
                for p in inspect.signature(fn).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            ]
            try:
                fn(*args)
            except Exception:
                pass  # the 404, or a body this call needs: the imports came first
        new = sorted(
            m for m in set(sys.modules) - before
            if m.split(".")[0] in ("githubkit", "githubkit_schemas", "httpcore", "httpx")
        )
        print("NEW", new)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "NEW []" in out.stdout, out.stdout[-2000:]


def test_without_preload_the_same_calls_import_models() -> None:
    """The test above can fail: without ``preload()``, the same calls import models."""
    script = textwrap.dedent(
        """
        import sys
        import httpx
        from githubkit import GitHub
        import bot.io.github.client

        before = set(sys.modules)
        transport = httpx.MockTransport(lambda request: httpx.Response(404, json={}))
        gh = GitHub("t", transport=transport, auto_retry=False, http_cache=False)
        try:
            gh.rest.issues.get("o", "r", 1)
        except Exception:
            pass
        print("NEW", len([m for m in set(sys.modules) - before if ".models." in m]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "NEW 0" not in out.stdout, out.stdout
