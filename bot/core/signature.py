"""Webhook signature check: pure, no I/O (the gidgethub sansio idea)."""

from __future__ import annotations

import hashlib
import hmac


def sign(secret: str | bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(secret: str | bytes, body: bytes, header: str | None) -> bool:
    """True when ``header`` is the right signature for ``body``; compared in constant time."""
    if not header or not header.startswith("sha256="):
        return False
    expected = sign(secret, body)
    # compare_digest on bytes: a str with non-ASCII characters would raise TypeError.
    return hmac.compare_digest(expected.encode(), header.encode("utf-8", "replace"))
