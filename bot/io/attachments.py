"""Downloading an approved issue's attachments and keeping what the models get.

The signed URLs in ``body_html`` expire in minutes, so they are read as soon as the loop
has the approved text (``fetch``). Each file is downloaded with a byte cap (the body is
never read past ``MAX_FILE_BYTES``), redirects only to GitHub's own attachment hosts, and no
credential is sent. What the models get is stored on the worker under
``LOOPBOT_DATA_DIR/attachments/<loop>/``, named by the downloaded bytes' hash; another
worker that resumes the loop downloads again and compares (``again``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import warnings
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, UnidentifiedImageError

from bot.core import attachments as rules
from bot.core.attachments import Attachment, Fetched, Link, Skipped
from bot.core.record import LoopRecord
from bot.core.text import attachments as words
from bot.io.logs import get_logger

log = get_logger("loopbot.attachments")

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
MAX_REDIRECTS = 3
THUMBNAIL_SIDE = 120
THUMBNAIL_CHARS = 3_900  # an event's string field keeps 4,000 (bot/core/rules/event_size.py)
_SUFFIX = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/webp": ".webp"}


class _TooBig(Exception):
    pass


class _TooManyPixels(Exception):
    pass


class Attachments:
    """One worker's attachment store; ``api_url`` says which hosts are GitHub's."""

    def __init__(self, data_dir: Path, api_url: str) -> None:
        self.root = data_dir / "attachments"
        self.api_url = api_url

    def folder(self, key: str) -> Path:
        return self.root / re.sub(r"[^A-Za-z0-9._-]", "_", key)

    # -- downloading -----------------------------------------------------------------------

    def _download(self, client: httpx.Client, url: str, cap: int) -> bytes:
        """The body at ``url``, at most ``cap`` bytes (else ``_TooBig``). Raises
        ``httpx.HTTPError`` for a refusal, a failed connection or a redirect off GitHub."""
        for _ in range(MAX_REDIRECTS + 1):
            with client.stream("GET", url) as resp:
                if resp.is_redirect:
                    url = str(resp.next_request.url) if resp.next_request else ""
                    if not rules.redirect_allowed(url, self.api_url):
                        raise httpx.HTTPError("redirected off GitHub's attachment hosts")
                    continue
                resp.raise_for_status()
                length = resp.headers.get("content-length")
                if length and length.isdigit() and int(length) > cap:
                    raise _TooBig(int(length), True)
                data = bytearray()
                for chunk in resp.iter_bytes():
                    data += chunk
                    if len(data) > cap:  # the server said less, or nothing: stop reading
                        raise _TooBig(len(data), False)
                return bytes(data)
        raise httpx.HTTPError("too many redirects")

    def fetch(self, key: str, approved: str, body_html: str) -> Fetched:
        """Download what ``body_html`` attaches, within the limits; keep what the models
        get. ``approved``: the approved text's hash these belong to."""
        found, skipped = rules.links(body_html, self.api_url)
        return self._fetch(key, Fetched(approved, [], list(skipped)), found)[0]

    def _fetch(self, key: str, out: Fetched, found: list[Link]) -> tuple[Fetched, bool]:
        """``out`` with ``found`` downloaded into it; and whether a download failed (a
        refusal, the network), as opposed to a file refused for what it is."""
        total, failed = 0, False
        with _client() as client:
            for n, link in enumerate(found):
                if (why := self._one(key, client, link, n, total, out)) is None:
                    total += out.files[-1].size
                failed = failed or why == "failed"
        log.info(
            "attachments.fetched",
            loop=key,
            files=[a.name for a in out.files],
            skipped=[s.name for s in out.skipped],
        )
        return out, failed

    def _one(
        self, key: str, client: httpx.Client, link: Link, n: int, total: int, out: Fetched
    ) -> str | None:
        """Download and keep one link into ``out``. None: kept; ``"skipped"``: refused
        for what it is or a limit; ``"failed"``: its download failed (a refusal, the
        network)."""
        if n >= rules.MAX_FILES:
            out.skipped.append(Skipped(link.name, f"past the first {rules.MAX_FILES} attachments"))
            return "skipped"
        cap = min(rules.MAX_FILE_BYTES, rules.MAX_TOTAL_BYTES - total)
        try:
            data = self._download(client, link.url, cap)
        except _TooBig as exc:
            size, known = exc.args
            why = rules.too_big(link.name, size if known else None, total)
            out.skipped.append(why or Skipped(link.name, _cut_reason(cap)))
            return "skipped"
        except httpx.HTTPStatusError as exc:
            out.skipped.append(Skipped(link.name, _status_reason(exc.response.status_code)))
            return "failed"
        except httpx.HTTPError as exc:
            out.skipped.append(Skipped(link.name, f"not downloaded: {str(exc)[:120]}"))
            return "failed"
        kept = self._keep(key, link, data)
        if isinstance(kept, Skipped):
            out.skipped.append(kept)
            return "skipped"
        out.files.append(kept)
        return None

    def again(self, key: str, fetched: Fetched, body_html: str) -> list[str]:
        """On a worker that resumes the loop: the recorded files not stored here are
        downloaded again from the issue as it reads now (its attachments, in their
        order). Returns the names of those whose bytes are not among what it serves now:
        a change of what the writer approved. When a download failed (a refusal, the
        network), that cannot be told: those files are left out (``blocks`` sends only
        what is stored), and nothing is called changed."""
        wanted = [a for a in fetched.files if not self.path(key, a).is_file()]
        if not wanted:
            return []
        found, _ = rules.links(body_html, self.api_url)
        now, failed = self._fetch(key, Fetched(fetched.approved), found)
        have = {a.sha256 for a in now.files}
        changed = [a.name for a in wanted if a.sha256 not in have]
        if changed and failed:
            log.warning("attachments.unverified", loop=key, files=changed)
            return []
        return changed

    # -- what the models get -----------------------------------------------------------------

    def _keep(self, key: str, link: Link, data: bytes) -> Attachment | Skipped:
        sha = hashlib.sha256(data).hexdigest()
        sorted_ = rules.sort(link, data)
        if isinstance(sorted_, Skipped):
            return sorted_
        kind, media_type = sorted_
        folder = self.folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        width = height = 0
        cut = False
        match kind:
            case "image":
                try:
                    sent, media_type, width, height, cut = _scaled(data, media_type)
                except _TooManyPixels as exc:
                    return Skipped(link.name, str(exc))
                except (
                    UnidentifiedImageError,
                    OSError,
                    Image.DecompressionBombError,
                    # Past Pillow's pixel limit (under twice it): ``_scaled`` makes the
                    # warning an error, and it is no OSError.
                    Image.DecompressionBombWarning,
                ) as exc:
                    return Skipped(link.name, f"an image that does not decode ({str(exc)[:80]})")
                stored = sha + _SUFFIX[media_type]
            case "pdf":
                if len(data) > rules.MAX_PDF_BYTES:
                    return Skipped(link.name, "a PDF over the size limit for documents")
                sent, stored = data, sha + ".pdf"
            case "text":
                text, cut = rules.text_of(data)
                sent, stored = text.encode(), sha + ".txt"
        (folder / stored).write_bytes(sent)
        return Attachment(
            link.name, kind, media_type, sha, len(data), stored, len(sent), width, height, cut
        )

    def path(self, key: str, a: Attachment) -> Path:
        return self.folder(key) / a.stored

    def approved(self, record: LoopRecord) -> Fetched | None:
        """The attachments recorded for the record's approved text (None: none, or they
        belong to an earlier approval)."""
        stored = Fetched.of(record.attachments)
        if stored is None or stored.approved != record.approved_sha256:
            return None
        return stored

    def for_prompt(self, key: str, fetched: Fetched | None) -> tuple[list[dict[str, Any]], str]:
        """A one-shot prompt's part: the blocks before its words, and the words on them."""
        return self.blocks(key, fetched), words.section(fetched, self.texts(key, fetched))

    def thumbnail(self, key: str, a: Attachment) -> str:
        """A small JPEG of an image as a data URI, for the session log: short enough for
        one event field (``THUMBNAIL_CHARS``)."""
        with Image.open(self.path(key, a)) as img:
            frame = img.convert("RGB")
        side = THUMBNAIL_SIDE
        while True:
            small = frame.copy()
            small.thumbnail((side, side))
            buf = io.BytesIO()
            small.save(buf, "JPEG", quality=60)
            uri = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
            if len(uri) <= THUMBNAIL_CHARS or side <= 16:
                return uri
            side = side * 3 // 4

    def blocks(self, key: str, fetched: Fetched | None) -> list[dict[str, Any]]:
        """The images and PDFs as Messages API content blocks, in the issue's order (text
        files are in the prompt's own words: ``bot.core.text.attachments``)."""
        out: list[dict[str, Any]] = []
        for a in fetched.files if fetched else []:
            path = self.path(key, a)
            if a.kind == "text" or not path.is_file():
                continue
            data = base64.b64encode(path.read_bytes()).decode()
            source = {"type": "base64", "media_type": a.media_type, "data": data}
            if a.kind == "image":
                out.append({"type": "image", "source": source})
            else:
                out.append({"type": "document", "source": source, "title": a.name[:100]})
        return out

    def texts(self, key: str, fetched: Fetched | None) -> dict[str, str]:
        """The text files' contents, by the attachment's stored name."""
        return {
            a.stored: self.path(key, a).read_text()
            for a in (fetched.files if fetched else [])
            if a.kind == "text" and self.path(key, a).is_file()
        }


def _client() -> httpx.Client:
    """A client of its own, without the GitHub client's token: a download carries no
    credential (httpx reads no ``.netrc`` unless asked, and keeps no cookie across
    fetches here); the environment's proxy and CA settings apply."""
    return httpx.Client(timeout=TIMEOUT, follow_redirects=False)


def _cut_reason(cap: int) -> str:
    if cap < rules.MAX_FILE_BYTES:
        return f"the issue's attachments would pass {rules.MAX_TOTAL_BYTES:,} bytes in all"
    return f"over the {rules.MAX_FILE_BYTES:,}-byte limit per file (the download was stopped)"


def _status_reason(status: int) -> str:
    if status in (403, 404):
        return (
            f"GitHub answered {status}: its signed link had expired before loopbot read it, "
            "or the file is gone; re-approve the issue to read it again"
        )
    return f"GitHub answered {status}"


def _scaled(data: bytes, media_type: str) -> tuple[bytes, str, int, int, bool]:
    """The image as the APIs take it: at most ``MAX_SIDE`` pixels on its long edge and
    ``MAX_IMAGE_BYTES``; as it came when it already fits (its bytes, its format)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > rules.MAX_PIXELS:  # refused before a pixel is decoded
                raise _TooManyPixels(
                    f"an image of {width:,} x {height:,} pixels, over the "
                    f"{rules.MAX_PIXELS:,}-pixel limit (decoding it takes that much memory)"
                )
            if max(width, height) <= rules.MAX_SIDE and len(data) <= rules.MAX_IMAGE_BYTES:
                img.verify()  # a truncated or corrupt file is refused here, not by the API
                return data, media_type, width, height, False
            img.load()
            frame = img.convert("RGBA" if img.mode in ("RGBA", "LA", "P") else "RGB")
    frame.thumbnail((rules.MAX_SIDE, rules.MAX_SIDE), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    frame.save(buf, "PNG", optimize=True)
    kind = "image/png"
    if buf.tell() > rules.MAX_IMAGE_BYTES:  # a photo: JPEG is what fits
        buf = io.BytesIO()
        frame.convert("RGB").save(buf, "JPEG", quality=85)
        kind = "image/jpeg"
    return buf.getvalue(), kind, frame.width, frame.height, True
