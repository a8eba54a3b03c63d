"""The session log shows the attachments a loop used (issue 39): names, sizes, what was
skipped and why, and a thumbnail of each image, in the API and on the page in a real
browser. The events are the ones the loop writes (jobs/loop/attachments.py); the
thumbnail is made by the worker's code from a real PNG."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw
from redis import Redis

from bot.core.attachments import Attachment
from bot.io.attachments import THUMBNAIL_CHARS, Attachments
from bot.io.store import Store
from tests.io.test_session_log import AUTH, KEY, browser_on, dash, plant_finished_loop

__all__ = ["dash"]  # the fixture, used by name


def plant_attachments(redis: Redis, tmp_path: Path) -> None:
    plant_finished_loop(redis)
    img = Image.new("RGB", (1200, 800), "white")
    ImageDraw.Draw(img).rectangle((100, 100, 1100, 700), fill="navy")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    files = Attachments(tmp_path, "http://127.0.0.1:1")
    stored = files.folder(KEY) / "shot.png"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(buf.getvalue())
    a = Attachment("screen shot.png", "image", "image/png", "ab" * 32, 5000, "shot.png", 5000)
    thumb = files.thumbnail(KEY, a)
    assert thumb.startswith("data:image/jpeg;base64,") and len(thumb) <= THUMBNAIL_CHARS
    store = Store(redis)
    store.event(
        KEY,
        "attachments",
        files=[
            {
                "name": "screen shot.png",
                "kind": "image",
                "bytes": 5000,
                "sha256": "ab" * 32,
                "width": 1200,
                "height": 800,
                "tokens": 1280,
            },
            {"name": "run.log", "kind": "text", "bytes": 120, "sha256": "cd" * 32},
        ],
        skipped=[{"name": "huge.zip", "reason": "60,000,000 bytes, over the limit"}],
    )
    store.event(KEY, "attachment_thumbnail", name="screen shot.png", src=thumb)
    store.event(KEY, "attachment_thumbnail", name="evil", src="javascript:alert(1)")


def test_the_log_api_names_the_attachments_and_carries_thumbnails(
    dash: Any, redis: Redis, tmp_path: Path
) -> None:
    plant_attachments(redis, tmp_path)
    entries = dash.get("/api/loops/acme/widgets/7/log", headers=AUTH).json["entries"]
    shown = [e for e in entries if e["kind"] == "attachments"]
    listing, thumb, evil = shown
    assert listing["title"] == "attachments: 2 read, 1 skipped" and listing["ok"] is False
    assert "screen shot.png: image, 5,000 bytes, 1200 x 800 px, ~1280 tokens" in listing["body"]
    assert "run.log: text, 120 bytes" in listing["body"]
    assert "huge.zip: skipped: 60,000,000 bytes, over the limit" in listing["body"]
    assert thumb["title"] == "screen shot.png" and thumb["image"].startswith("data:image/jpeg")
    assert "image" not in evil  # only a PNG or JPEG data URI is ever an image


def test_the_log_page_shows_the_thumbnail(
    env: dict[str, str], redis: Redis, tmp_path: Path
) -> None:
    plant_attachments(redis, tmp_path)
    with browser_on(env, redis, tmp_path) as (page, base):
        page.goto(f"{base}/dashboard/loops/acme/widgets/7/log")
        page.wait_for_selector("text=attachments: 2 read, 1 skipped")
        page.wait_for_selector("img.thumb")
        thumbs = page.locator("img.thumb")
        assert thumbs.count() == 1
        assert thumbs.first.evaluate("i => i.complete && i.naturalWidth") == 120
        assert "huge.zip: skipped" in page.inner_text("#log")
