"""Attachments of an approved issue: which links are GitHub's own uploads, what a file is
(from its bytes), the limits, and what each model gets. Pure: the downloads and the image
scaling are in ``bot.io.attachments``.

GitHub renders an issue for an API reader with the ``full`` media type: ``body_html`` holds
each upload at a signed, short-lived URL. Only GitHub's own attachment hosts are fetched
(``ALLOWED``): a URL an issue names anywhere else is someone's server, and fetching it would
let the issue make the worker request anything.
"""

from __future__ import annotations

import io
import math
import posixpath
from dataclasses import asdict, dataclass, field
from html.parser import HTMLParser
from typing import Any, Literal
from urllib.parse import SplitResult, unquote, urlsplit

from PIL import Image, UnidentifiedImageError

# Limits, per issue. Images are scaled down to what the APIs take (``MAX_SIDE``, the
# long edge past which Anthropic's API scales an image itself, so nothing the model could
# see is lost; and ``MAX_IMAGE_BYTES``, 5 MB of base64 at most per image).
MAX_FILES = 10  # attachments read per issue; the rest are named and skipped
MAX_FILE_BYTES = 10 * 1024 * 1024  # one download
MAX_TOTAL_BYTES = 25 * 1024 * 1024  # all of an issue's downloads together
MAX_SIDE = 1568
MAX_IMAGE_BYTES = 5 * 1024 * 1024 * 3 // 4  # raw bytes whose base64 is 5 MB
MAX_TEXT_BYTES = 64 * 1024  # what of one text file reaches the prompt
MAX_PDF_BYTES = 10 * 1024 * 1024  # the Messages API takes 32 MB a request in all
# Pixels an image may declare: decoding one to scale it holds every pixel in memory (a
# 343 KB PNG of 9,400 x 9,400 blank pixels took 1.1 GB and 3 s, under Pillow's own bomb
# limit of 89 million); an 8K screenshot is 33 million.
MAX_PIXELS = 40_000_000
IMAGE_TOKENS_PER_PIXEL = 1 / 750  # Anthropic's documented estimate: width * height / 750

IMAGE_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}
TEXT_SUFFIXES = frozenset(
    {".txt", ".log", ".json", ".csv", ".md", ".yml", ".yaml", ".xml", ".toml", ".diff", ".patch"}
)
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})

Kind = Literal["image", "pdf", "text"]


@dataclass(frozen=True)
class Link:
    """An upload named in ``body_html``: its signed URL and the name people see."""

    url: str
    name: str
    image: bool  # shown as an image (``<img>``) rather than linked as a file


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


@dataclass(frozen=True)
class Attachment:
    """One file read: ``sha256`` of the bytes GitHub served (what the writer approved),
    ``stored`` the file name of what the models get (a scaled image, the text cut)."""

    name: str
    kind: Kind
    media_type: str
    sha256: str
    size: int  # bytes downloaded
    stored: str
    sent_bytes: int
    width: int = 0  # an image as sent
    height: int = 0
    cut: bool = False  # a text file cut at MAX_TEXT_BYTES, an image scaled down

    @property
    def tokens(self) -> int:
        """An image's input tokens by Anthropic's formula (0 for other kinds)."""
        return image_tokens(self.width, self.height) if self.kind == "image" else 0


@dataclass
class Fetched:
    """What an approval's attachments came to, stored on the loop's record."""

    approved: str  # the approved text's hash these belong to
    files: list[Attachment] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "files": [asdict(a) for a in self.files],
            "skipped": [asdict(s) for s in self.skipped],
        }

    @classmethod
    def of(cls, d: dict[str, Any]) -> Fetched | None:
        if not d:
            return None
        return cls(
            str(d.get("approved", "")),
            [Attachment(**a) for a in d.get("files", [])],
            [Skipped(**s) for s in d.get("skipped", [])],
        )


def image_tokens(width: int, height: int) -> int:
    """Anthropic's estimate of an image's input tokens, ``width * height / 750``, of the
    image as the API reads it: one past ``MAX_SIDE`` on its long edge is scaled down first
    (so this is never less than the API's count)."""
    if (longest := max(width, height)) > MAX_SIDE:
        width, height = (
            math.ceil(width * MAX_SIDE / longest),
            math.ceil(height * MAX_SIDE / longest),
        )
    return math.ceil(width * height * IMAGE_TOKENS_PER_PIXEL)


def image_size(data: bytes) -> tuple[int, int] | None:
    """An image's width and height from its header (nothing decoded past it)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError):
        return None


# -- which hosts -------------------------------------------------------------------------


def _split(url: str) -> SplitResult | None:
    """``url``'s parts, or None for one Python cannot read (a port out of range or not a
    number, a bracket left open, a character NFKC turns into ``#`` or ``@``): an issue's
    text is anyone's, and such a link is no attachment, never a reason to fail the job."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # reading it is what raises for a bad port
    except ValueError:
        return None
    return parts


def _climbs(path: str) -> bool:
    """Whether a path has a ``.`` or ``..`` segment, as written or percent-encoded: the
    HTTP client (or the server) resolves it, so ``/user-attachments/../login`` is a
    request for ``/login``, out of the attachment paths the check read."""
    return any(seg in (".", "..") for seg in unquote(path).replace("\\", "/").split("/"))


def allowed(url: str, api_url: str) -> bool:
    """Whether ``url`` is one of GitHub's own attachment URLs: for github.com,
    ``github.com/user-attachments/…`` and ``private-user-images.githubusercontent.com``;
    with any other API (an Enterprise Server, the local stand-in), that server's host,
    under the same paths. HTTPS only, but where the API itself is plain HTTP."""
    u, api = _split(url), _split(api_url)
    if u is None or api is None or _climbs(u.path):
        return False
    if u.username or u.password or u.scheme not in ("https", api.scheme):
        return False
    host = (u.hostname or "").lower()
    if (api.hostname or "").lower() == "api.github.com":
        if u.scheme != "https" or u.port not in (None, 443):
            return False
        if host == "private-user-images.githubusercontent.com":
            return True
        return host == "github.com" and u.path.startswith("/user-attachments/")
    same = host == (api.hostname or "").lower() and u.port == api.port
    return same and u.path.startswith(("/user-attachments/", "/private-user-images/"))


# Where github.com's attachment URLs redirect a download to (a signed S3 URL that lives
# minutes): followed as a redirect from an allowed URL only, never taken from the text.
USER_ASSET_HOST = "github-production-user-asset-6210df.s3.amazonaws.com"


def redirect_allowed(url: str, api_url: str) -> bool:
    """Whether a download may follow a redirect to ``url``: an attachment host, or for
    github.com the storage its attachment URLs send a reader to."""
    if allowed(url, api_url):
        return True
    u, api = _split(url), _split(api_url)
    if u is None or api is None or _climbs(u.path):
        return False
    return (
        (api.hostname or "").lower() == "api.github.com"
        and u.scheme == "https"
        and u.port in (None, 443)
        and not (u.username or u.password)
        and (u.hostname or "").lower() == USER_ASSET_HOST
    )


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str, bool]] = []  # (url, name, image)
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "img" and a.get("src"):
            self.found.append((a["src"], a.get("alt", ""), True))
        elif tag == "a" and a.get("href"):
            self._href, self._text = a["href"], []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.found.append((self._href, "".join(self._text).strip(), False))
            self._href = None


def _name(url: str, given: str) -> str:
    parts = _split(url)
    base = posixpath.basename(unquote(parts.path if parts else "")) or "attachment"
    name = given.strip() or base
    return name.replace("\n", " ")[:120]


def links(body_html: str, api_url: str) -> tuple[list[Link], list[Skipped]]:
    """The uploads ``body_html`` shows, in order, each once; and the images it shows from
    anywhere else, skipped (a link to another site is a link, not an attachment)."""
    parser = _Links()
    parser.feed(body_html or "")
    seen: set[str] = set()
    found: list[Link] = []
    skipped: list[Skipped] = []
    for url, given, image in parser.found:
        key = url.split("?", 1)[0]
        if key in seen:
            continue  # GitHub wraps an image in a link to itself
        seen.add(key)
        if allowed(url, api_url):
            found.append(Link(url, _name(url, given), image))
        elif image:
            parts = _split(url)
            host = (parts.hostname if parts else None) or "?"
            skipped.append(
                Skipped(
                    _name(url, given),
                    f"an image on another host ({host}), not a GitHub attachment: not fetched",
                )
            )
    return found, skipped


def may_attach(markdown: str) -> bool:
    """Whether a comment's Markdown could show an upload or an image at all (else its
    rendering is not worth a request)."""
    lowered = markdown.lower()
    return "![" in markdown or "<img" in lowered or "/user-attachments/" in lowered


# -- what a file is ----------------------------------------------------------------------


def image_type(data: bytes) -> str | None:
    """An image type the model APIs take, from the bytes; None for anything else."""
    for magic, kind in IMAGE_TYPES.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _suffix(name: str) -> str:
    return posixpath.splitext(name.lower())[1]


def _looks(data: bytes) -> str:
    head = data[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "an HTML page"
    if image_type(data) is None and data[:4] in (b"\x00\x00\x01\x00", b"II*\x00", b"MM\x00*"):
        return "an image in a format the model APIs do not take"
    if data.startswith(b"PK\x03\x04"):
        return "a zip archive"
    return "not an image"


def _text(data: bytes) -> str | None:
    if b"\x00" in data[:MAX_TEXT_BYTES]:
        return None
    try:
        return data[:MAX_TEXT_BYTES].decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the cap is not a reason to refuse the file.
        if exc.start >= MAX_TEXT_BYTES - 4 and len(data) > MAX_TEXT_BYTES:
            return data[: exc.start].decode("utf-8")
        return None


Sorted = tuple[Kind, str] | Skipped


def sort(link: Link, data: bytes) -> Sorted:
    """What a downloaded file is, from its bytes (never its name or the server's header):
    (kind, media type), or why it is skipped."""
    shown = link.name
    if kind := image_type(data):
        return ("image", kind)
    if link.image or _suffix(shown) in IMAGE_SUFFIXES:
        looks = _looks(data)
        return Skipped(
            shown, f"shown as an image, but its bytes are {looks}, not PNG, JPEG, GIF or WebP"
        )
    if data.startswith(b"%PDF-"):
        return ("pdf", "application/pdf")
    if (_suffix(shown) in TEXT_SUFFIXES or not _suffix(shown)) and _text(data) is not None:
        return ("text", "text/plain")
    return Skipped(shown, f"a file loopbot does not read ({_looks(data)}; {len(data):,} bytes)")


def text_of(data: bytes) -> tuple[str, bool]:
    """A text attachment as the prompt holds it, and whether it was cut."""
    return _text(data) or "", len(data) > MAX_TEXT_BYTES


def too_big(name: str, size: int | None, total: int) -> Skipped | None:
    """Why a download of ``size`` bytes (None: not known before reading) is not made or
    kept, with ``total`` bytes downloaded for the issue already."""
    if size is not None and size > MAX_FILE_BYTES:
        return Skipped(name, f"{size:,} bytes, over the {MAX_FILE_BYTES:,}-byte limit per file")
    if size is not None and total + size > MAX_TOTAL_BYTES:
        return Skipped(name, f"the issue's attachments would pass {MAX_TOTAL_BYTES:,} bytes in all")
    return None


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / 1024 / 1024:.1f} MB"
