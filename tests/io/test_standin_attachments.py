"""The stand-ins' side of attachments (issue 39), as strict as the real services: the
local model server refuses image and document blocks the Messages API refuses; the local
GitHub serves an issue's attachments only at the signed URLs of its ``full`` rendering,
and not once they have expired."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from PIL import Image

from bot.core.attachments import MAX_FILE_BYTES, links
from bot.io.attachments import Attachments
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer, attachments
from tests.helpers import REPO, sample_repo
from tests.io.test_anthropic_window import ask, rejected


@pytest.fixture
def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-local-test", base_url=model.url, max_retries=0)


def encoded(kind: str, size: tuple[int, int] = (40, 20)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, "white").save(buf, kind)
    return base64.b64encode(buf.getvalue()).decode()


def image(media_type: str, data: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def message(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*blocks, {"type": "text", "text": "What is shown?"}]}]


@pytest.mark.parametrize(
    ("block", "words"),
    [
        (image("image/png", "%%%not base64"), "not valid base64"),
        (image("image/jpeg", encoded("PNG")), "does not match the provided media type"),
        (image("image/bmp", encoded("BMP")), "Input should be"),
        (image("image/png", base64.b64encode(b"<html></html>").decode()), "does not match"),
        (image("image/png", encoded("PNG", (8001, 2))), "exceed max allowed size: 8000"),
        (image("image/png", "A" * (5 * 1024 * 1024 + 4)), "image exceeds 5 MB maximum"),
        (
            {
                "type": "document",
                "source": {
                    "type": "base64",
                    "media_type": "application/pdf",
                    "data": base64.b64encode(b"<html>").decode(),
                },
            },
            "The PDF specified was not valid",
        ),
    ],
)
def test_the_model_refuses_media_the_api_refuses(
    client: anthropic.Anthropic, model: AnthropicServer, block: dict[str, Any], words: str
) -> None:
    model.play(m.text("never used"))
    assert words in rejected(client, messages=message(block))
    assert len(model.script) == 1  # refused before the script was read


def test_many_images_must_each_be_2000_pixels_at_most(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    small = image("image/png", encoded("PNG"))
    wide = image("image/png", encoded("PNG", (2001, 2)))
    assert "2000 pixels" in rejected(client, messages=message(*[small] * 20, wide))
    model.play(m.text("A white box."))
    assert ask(client, messages=message(*[small] * 20, image("image/webp", encoded("WEBP"))))


def test_github_serves_attachments_only_at_live_signed_urls(github: GitHubServer) -> None:
    sample_repo(github, loop_yml=None)
    github.attachment_ttl = 2.0
    png = base64.b64decode(encoded("PNG"))
    markdown = github.upload("shot.png", png, image=True)
    log = github.upload("run.log", b"ERROR\n", image=False)
    with github.as_user("writer") as u:
        n = u.post(f"/repos/{REPO}/issues", json={"title": "t", "body": f"{markdown}\n\n{log}"})
        number = n.json()["number"]
        plain = u.get(f"/repos/{REPO}/issues/{number}").json()
        full = u.get(
            f"/repos/{REPO}/issues/{number}",
            headers={"Accept": "application/vnd.github.full+json"},
        ).json()
    assert "body_html" not in plain
    found, _ = links(full["body_html"], github.url)
    assert [f.name for f in found] == ["shot.png", "run.log"]
    with httpx.Client() as web:
        assert web.get(found[0].url).content == png
        assert web.get(found[1].url).content == b"ERROR\n"
        # The Markdown's own links, and a URL with its signature changed: 404.
        assert web.get(markdown.split("(")[1].rstrip(")")).status_code == 404
        assert web.get(log.split("(")[1].rstrip(")")).status_code == 404
        assert web.get(found[0].url[:-3] + "abc").status_code == 404
        time.sleep(3.1)  # past the signature's life
        assert web.get(found[0].url).status_code == 404


def test_a_big_screenshot_is_scaled_to_what_the_api_takes(
    github: GitHubServer, model: AnthropicServer, client: anthropic.Anthropic, tmp_path: Path
) -> None:
    """A 2000 x 1500 photo-like PNG of 9 MB: downloaded within the limit, scaled to 1,568
    pixels on its long edge, and sent as JPEG once PNG would pass 5 MB of base64; the
    local model (as strict as the API) takes the block, and counts it by its pixels."""
    sample_repo(github, loop_yml=None)
    noise = Image.frombytes("RGB", (2000, 1500), os.urandom(2000 * 1500 * 3))
    buf = io.BytesIO()
    noise.save(buf, "PNG")
    raw = buf.getvalue()
    assert 5 * 1024 * 1024 < len(raw) < MAX_FILE_BYTES
    html = attachments.body_html(github, github.upload("big.png", raw, image=True))
    files = Attachments(tmp_path, github.url)
    fetched = files.fetch("acme/widgets#1", "approved", html)
    (a,) = fetched.files
    assert (a.width, a.height, a.media_type, a.cut) == (1568, 1176, "image/jpeg", True)
    assert a.sha256 == hashlib.sha256(raw).hexdigest() and a.size == len(raw)
    (block,) = files.blocks("acme/widgets#1", fetched)
    model.play(m.text("Static."))
    ask(client, messages=message(block))
    assert model.input_tokens[-1] < 3_000  # 1568 * 1176 / 750 = 2,459, plus the words
