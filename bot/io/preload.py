"""What a worker loads once, before RQ forks a work horse for each job.

RQ runs every job in a fresh fork of its worker: what the worker has not loaded, each
job loads again and throws away. githubkit imports an endpoint's namespace and its
models on first use (a pydantic model class is built at import: milliseconds each),
httpx and httpx2 import their transports when the first client opens, and every HTTP
client builds its own TLS context (reading the CA bundle). In a fleet of loops that was
a large share of a job's CPU, some of it inside the first turn (bench/fleet.py).
``preload()`` does it in the worker, so every horse starts with it done; ``tls()`` is the
one TLS context the process's GitHub clients share.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import ssl
from typing import Any

from bot.io.logs import get_logger

log = get_logger("loopbot.preload")

# Every githubkit REST endpoint bot/io/github calls, as (namespace, method): their
# modules and models are imported here. tests/unit/test_preload.py keeps it complete.
ENDPOINTS: tuple[tuple[str, str], ...] = (
    ("apps", "create_from_manifest"),
    ("apps", "create_installation_access_token"),
    ("apps", "get_authenticated"),
    ("apps", "get_webhook_config_for_app"),
    ("apps", "list_installations"),
    ("apps", "list_repos_accessible_to_installation"),
    ("apps", "list_webhook_deliveries"),
    ("checks", "create"),
    ("checks", "list_for_ref"),
    ("checks", "update"),
    ("git", "delete_ref"),
    ("issues", "add_labels"),
    ("issues", "create"),
    ("issues", "create_comment"),
    ("issues", "get"),
    ("issues", "get_comment"),
    ("issues", "list_comments"),
    ("issues", "list_events"),
    ("issues", "list_for_repo"),
    ("issues", "remove_label"),
    ("issues", "update"),
    ("issues", "update_comment"),
    ("pulls", "create"),
    ("pulls", "create_review"),
    ("pulls", "get"),
    ("pulls", "list"),
    ("pulls", "list_files"),
    ("pulls", "list_reviews"),
    ("pulls", "merge"),
    ("pulls", "request_reviewers"),
    ("pulls", "update"),
    ("reactions", "create_for_issue_comment"),
    ("repos", "compare_commits"),
    ("repos", "get"),
    ("repos", "get_branch"),
    ("repos", "get_branch_rules"),
    ("repos", "get_collaborator_permission_level"),
    ("repos", "get_combined_status_for_ref"),
    ("repos", "get_content"),
)

# Imported on first use by the HTTP clients and the anthropic SDK.
MODULES = ("httpcore", "httpcore2", "opentelemetry.propagate")


@functools.cache
def tls() -> ssl.SSLContext | bool:
    """The TLS context of this process's GitHub clients, built once (as httpx builds its
    own: the CA bundle, or ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when set). Made in the
    worker by ``preload()``, it is shared by every horse it forks. When it cannot be
    built (an ``SSL_CERT_FILE`` that is missing or holds no certificate): True, and each
    client builds its own and fails as it did before, at its first request, with
    httpx's error, rather than the process at its start."""
    import httpx

    try:
        return httpx.create_ssl_context(trust_env=True)
    except (OSError, ssl.SSLError) as exc:
        log.warning("tls.context_failed", error=str(exc)[:300])
        return True


def preload() -> list[str]:
    """Import what jobs would import on first use, and build ``tls()``. Returns what
    could not be loaded (a githubkit that renamed an endpoint): the caller logs it; a job
    still loads what it needs, later. Never raises: a worker starts without it."""
    for name in MODULES:
        # Not installed (httpcore2 comes with anthropic's transport, opentelemetry is
        # optional) or, for the propagators, misconfigured: the SDK copes alone.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    tls()
    try:
        return _githubkit()
    except Exception as exc:  # noqa: BLE001 - only speed is at stake
        return [f"githubkit: {exc}"[:300]]


def _githubkit() -> list[str]:
    from githubkit import GitHub

    gh: GitHub[Any] = GitHub("preload")  # makes no request: only its namespaces are read
    missing = []
    for namespace, method in ENDPOINTS:
        fn = getattr(getattr(gh.rest, namespace, None), method, None)
        if fn is None:
            missing.append(f"{namespace}.{method}")
            continue
        # The endpoint imports its models in its body (``from ..models import X``):
        # they are the names its code loads, found in the version's models package.
        package = type(fn.__self__).__module__.rsplit(".", 2)[0]
        models = importlib.import_module(f"{package}.models")
        for name in fn.__code__.co_names:
            if name[:1].isupper():
                getattr(models, name, None)
    return missing
