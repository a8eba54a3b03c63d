"""Reasoning items' ``encrypted_content``: issued for one item and model, verified when a
client sends it back."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any

# One secret for every server, as the real API's encrypted content outlives any one
# server: a conversation stored before a restart of the stand-in still verifies.
SECRET = b"loopbot-local-openai-encrypted-reasoning"
_SEALED = "gAAAAAB"  # how the API's encrypted content opens (a Fernet token)


def encrypted_reasoning(item_id: str, model: str, secret: bytes = SECRET) -> str:
    """The ``encrypted_content`` of reasoning item ``item_id``: the id and an HMAC-SHA256
    of the id and the model, so it verifies for that model only, with or without the
    item's ``id`` sent alongside."""
    mac = hmac.new(secret, f"reasoning\0{model}\0{item_id}".encode(), hashlib.sha256).hexdigest()
    return _SEALED + base64.urlsafe_b64encode(f"{item_id}.{mac}".encode()).decode()


def reasoning_item_id(content: Any, model: str, secret: bytes = SECRET) -> str | None:
    """The id of the reasoning item whose ``encrypted_content`` is ``content``, if this
    server issued it for ``model``; None for a forged or other model's one."""
    if not isinstance(content, str) or not content.startswith(_SEALED):
        return None
    try:
        raw = base64.urlsafe_b64decode(content[len(_SEALED) :].encode()).decode()
        item_id, mac = raw.rsplit(".", 1)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    want = hmac.new(secret, f"reasoning\0{model}\0{item_id}".encode(), hashlib.sha256).hexdigest()
    return item_id if hmac.compare_digest(mac, want) else None
