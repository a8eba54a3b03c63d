"""Image and document blocks, checked as the Messages API checks them before any model
reads them (https://docs.claude.com/en/docs/build-with-claude/vision,
…/pdf-support): base64 that decodes, a ``media_type`` the API takes and that the bytes
really are, at most 5 MB of base64 per image, at most 8000 pixels a side (2000 when a
request holds more than 20 images), at most 100 images, and PDFs of at most 100 pages.
A harness that labels a file by its name, or sends a big screenshot as it came, gets the
API's 400 here too."""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Iterator
from typing import Any

from PIL import Image, UnidentifiedImageError

from bot.standins.anthropic.wire import Json

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE_BASE64 = 5 * 1024 * 1024
MAX_SIDE = 8000
MAX_SIDE_MANY = 2000  # when a request holds more than MANY images
MANY = 20
MAX_IMAGES = 100
MAX_PDF_PAGES = 100

# What the bytes are, from their first bytes (the API decodes them; so does this).
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniffed(data: bytes) -> str | None:
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _media(node: Any, path: str) -> Iterator[tuple[str, Json]]:
    """Every image and document block at any depth (a tool result holds blocks too)."""
    if isinstance(node, dict):
        if node.get("type") in ("image", "document"):
            yield path, node
            return
        for k, v in node.items():
            yield from _media(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _media(v, f"{path}.{i}")


def _decoded(data: Any) -> bytes | None:
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def media_invalid(body: Json) -> str | None:
    """Why the API would refuse ``body``'s images or documents with a 400; or None."""
    found = list(_media(body.get("messages"), "messages"))
    images = [(p, b) for p, b in found if b.get("type") == "image"]
    if len(images) > MAX_IMAGES:
        return f"messages: too many images: {len(images)} > {MAX_IMAGES}"
    side = MAX_SIDE_MANY if len(images) > MANY else MAX_SIDE
    for path, block in found:
        source = block.get("source")
        if not isinstance(source, dict):
            return f"{path}.source: Field required"
        if block["type"] == "image":
            why = _image_invalid(f"{path}.source", source, side)
        else:
            why = _document_invalid(f"{path}.source", source)
        if why is not None:
            return why
    return None


def _image_invalid(path: str, source: Json, side: int) -> str | None:
    if source.get("type") != "base64":
        return None  # url and file sources are fetched by the API; loopbot sends none
    kind = source.get("media_type")
    if kind not in IMAGE_TYPES:
        return f"{path}.media_type: Input should be {', '.join(repr(t) for t in IMAGE_TYPES)}"
    data = source.get("data")
    if isinstance(data, str) and len(data) > MAX_IMAGE_BASE64:
        return (
            f"{path}.base64: image exceeds 5 MB maximum: {len(data)} bytes > "
            f"{MAX_IMAGE_BASE64} bytes"
        )
    raw = _decoded(data)
    if raw is None:
        return f"{path}.base64.data: The image data is not valid base64"
    if sniffed(raw) != kind:
        return f"{path}.base64.data: Image does not match the provided media type {kind}"
    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
    except (UnidentifiedImageError, OSError):
        return f"{path}.base64.data: Could not process image"
    if max(width, height) > side:
        return f"{path}: image dimensions exceed max allowed size: {side} pixels"
    return None


def _document_invalid(path: str, source: Json) -> str | None:
    match source.get("type"):
        case "base64":
            if source.get("media_type") != "application/pdf":
                return f"{path}.media_type: Input should be 'application/pdf'"
            raw = _decoded(source.get("data"))
            if raw is None:
                return f"{path}.data: The PDF data is not valid base64"
            if not raw.startswith(b"%PDF-"):
                return f"{path}: The PDF specified was not valid."
            pages = len(re.findall(rb"/Type\s*/Page(?!s)", raw))
            if pages > MAX_PDF_PAGES:
                return f"{path}: A maximum of {MAX_PDF_PAGES} PDF pages may be provided."
            return None
        case "text":
            if source.get("media_type") != "text/plain" or not isinstance(source.get("data"), str):
                return f"{path}: a text source takes media_type 'text/plain' and string data"
            return None
        case _:
            return None
