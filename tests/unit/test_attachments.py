"""Which attachment links are fetched and what a file is taken for (bot/core/attachments.py):
one case per row, named for the rule it pins."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from bot.core.attachments import (
    Link,
    Skipped,
    allowed,
    image_tokens,
    links,
    redirect_allowed,
    sort,
)
from bot.core.rules.loop import context

GH = "https://api.github.com"
LOCAL = "http://127.0.0.1:8080"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20


@pytest.mark.parametrize(
    ("url", "api", "ok"),
    [
        ("https://private-user-images.githubusercontent.com/1/2-a.png?jwt=x", GH, True),
        ("https://github.com/user-attachments/assets/0b0c", GH, True),
        ("https://github.com/user-attachments/files/7/run.log", GH, True),
        # github.com's other pages are not attachments
        ("https://github.com/acme/widgets/raw/main/x.png", GH, False),
        # plain HTTP, another port, credentials in the URL: never
        ("http://private-user-images.githubusercontent.com/1/2.png", GH, False),
        ("https://private-user-images.githubusercontent.com:8443/1/2.png", GH, False),
        ("https://u:p@github.com/user-attachments/assets/0b0c", GH, False),
        # look-alike hosts
        ("https://private-user-images.githubusercontent.com.evil.io/a.png", GH, False),
        ("https://evilgithub.com/user-attachments/assets/0b0c", GH, False),
        ("https://camo.githubusercontent.com/abc", GH, False),
        # another API (an Enterprise Server, the stand-in): that host, the same paths
        ("http://127.0.0.1:8080/private-user-images/ab?jwt=x", LOCAL, True),
        ("http://127.0.0.1:8080/user-attachments/files/3/a.txt", LOCAL, True),
        ("http://127.0.0.1:9090/private-user-images/ab?jwt=x", LOCAL, False),
        ("http://127.0.0.1:8080/repos/acme/widgets", LOCAL, False),
        ("https://github.com/user-attachments/assets/0b0c", LOCAL, False),
    ],
)
def test_only_githubs_attachment_hosts_are_fetched(url: str, api: str, ok: bool) -> None:
    assert allowed(url, api) is ok


@pytest.mark.parametrize(
    ("url", "api", "ok"),
    [
        (
            "https://github-production-user-asset-6210df.s3.amazonaws.com/1/2-a.log?X-Amz=1",
            GH,
            True,
        ),
        ("https://github.com/user-attachments/files/7/run.log", GH, True),
        ("http://github-production-user-asset-6210df.s3.amazonaws.com/1/2-a.log", GH, False),
        ("https://other-bucket.s3.amazonaws.com/1/2-a.log", GH, False),
        # only github.com's storage, not an Enterprise Server's or the stand-in's
        ("https://github-production-user-asset-6210df.s3.amazonaws.com/1/2", LOCAL, False),
    ],
)
def test_a_download_follows_redirects_only_to_githubs_storage(url: str, api: str, ok: bool) -> None:
    assert redirect_allowed(url, api) is ok
    if "s3.amazonaws.com" in url:  # a link in the text is never fetched from storage
        assert not allowed(url, api)


def test_links_come_once_in_order_and_outside_images_are_skipped() -> None:
    signed = "https://private-user-images.githubusercontent.com/1/2-a.png?jwt=abc"
    html = (
        f'<p><a href="{signed}"><img src="{signed}" alt="shot"></a></p>'
        '<p><a href="https://github.com/user-attachments/files/7/run.log">run.log</a></p>'
        '<p><img src="https://images.example.com/x.png" alt="ext"></p>'
        '<p><a href="https://example.com/docs">docs</a></p>'
    )
    found, skipped = links(html, GH)
    assert found == [
        Link(signed, "shot", True),
        Link("https://github.com/user-attachments/files/7/run.log", "run.log", False),
    ]
    assert [s.name for s in skipped] == ["ext"]
    assert "images.example.com" in skipped[0].reason


@pytest.mark.parametrize(
    ("name", "image", "data", "kind"),
    [
        ("a.png", True, PNG, "image"),
        ("a.jpg", True, b"\xff\xd8\xff\xe0" + b"\x00" * 8, "image"),
        ("a.webp", True, b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image"),
        ("weird-name.txt", False, PNG, "image"),  # the bytes say, not the name
        ("report.pdf", False, b"%PDF-1.7\n", "pdf"),
        ("run.log", False, b"ERROR x\n", "text"),
        ("data.json", False, b'{"a": 1}', "text"),
        ("README", False, b"plain words", "text"),
        # shown as an image but not one: skipped, never sent as text
        ("page.png", True, b"<!DOCTYPE html><html></html>", "skip"),
        ("shot.png", False, b"<html><body>", "skip"),
        ("icon.bmp", True, b"BM" + b"\x00" * 20, "skip"),
        ("tool.exe", False, b"MZ\x90\x00", "skip"),
        ("bin.log", False, b"\x00\x01\x02", "skip"),  # NUL bytes are not text
        ("latin.txt", False, "caf\xe9".encode("latin-1"), "skip"),  # not UTF-8
    ],
)
def test_a_files_kind_comes_from_its_bytes(name: str, image: bool, data: bytes, kind: str) -> None:
    got = sort(Link("u", name, image), data)
    if kind == "skip":
        assert isinstance(got, Skipped) and got.name == name
    else:
        assert not isinstance(got, Skipped) and got[0] == kind


@pytest.mark.parametrize(
    ("w", "h", "tokens"),
    [(750, 1, 1), (1000, 1000, 1334), (1568, 1568, 3279), (3136, 1568, 1640)],
)
def test_image_tokens_are_width_times_height_over_750_as_the_api_scales(
    w: int, h: int, tokens: int
) -> None:
    assert image_tokens(w, h) == tokens


def test_the_context_gauge_counts_an_image_by_its_pixels_not_its_base64() -> None:
    """A screenshot's base64 is hundreds of thousands of characters; the API bills its
    pixels. Counted by its characters, one image would look like a full context window."""
    noise = Image.frombytes("RGB", (1500, 900), bytes(range(256)) * 15821)
    buf = io.BytesIO()
    noise.save(buf, "JPEG")
    data = base64.b64encode(buf.getvalue()).decode()
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/jpeg", "data": data},
    }
    text = {"type": "text", "text": "see the picture"}
    with_image = [{"role": "user", "content": [block, text]}]
    without = [{"role": "user", "content": [text]}]
    assert len(data) > 100_000
    added = context.chars(with_image) - context.chars(without)
    assert 4 * image_tokens(1500, 900) <= added <= 4 * image_tokens(1500, 900) + 200
