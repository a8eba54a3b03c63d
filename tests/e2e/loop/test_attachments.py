"""Screenshots and files attached to an issue reach the agent and the critic (issue 39).

Real RQ workers, real git, the local GitHub (``body_html`` with signed URLs that expire)
and the local model server (which refuses an image block as the API does: bad base64, a
media type the bytes are not, past the size limits). The scripted model "reads" an image
the only way a script can: it decodes the image block of the request it answers and knows
the picture's pixels (``KNOWN``); without the image in its request it can only guess.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import shutil
from collections import deque
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Reason, Status
from bot.core.rules.loop.context import BRIEF_MARK
from bot.io.attachments import Attachments
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.helpers import REPO, comment, label, sample_repo

EXPECTED = "Hello, loop!"
YML = "verify: python3 -m unittest -q test_banner\nmax_turns: 3\n"
# The expected text is nowhere in the repository's words: its test holds a hash of it.
FILES = {
    "banner.py": 'TEXT = "TODO"\n',
    "test_banner.py": (
        "import hashlib, unittest\nimport banner\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_text(self):\n"
        "        self.assertEqual(hashlib.sha256(banner.TEXT.encode()).hexdigest(), "
        f"{hashlib.sha256(EXPECTED.encode()).hexdigest()!r})\n"
    ),
}
# A one-page PDF, as small as a valid one gets.
PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)
APPROVE = m.structured({"verdict": "approve", "summary": "Matches the screenshot.", "findings": []})


def picture(text: str, size: tuple[int, int] = (220, 40)) -> bytes:
    """A small PNG that shows ``text`` in black on white."""
    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).text((8, 12), text, fill="black")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _pixels(data: bytes) -> str:
    with Image.open(io.BytesIO(data)) as img:
        return hashlib.sha256(img.convert("RGB").tobytes()).hexdigest()


KNOWN = {_pixels(picture(EXPECTED)): EXPECTED}


def images(body: dict[str, Any]) -> list[bytes]:
    """The decoded images of every message of a request (tool results' too)."""
    found: list[bytes] = []
    stack: list[Any] = [body.get("messages")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "image":
                found.append(base64.b64decode(node["source"]["data"]))
            else:
                stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def documents(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        b
        for msg in body.get("messages") or []
        for b in (msg["content"] if isinstance(msg["content"], list) else [])
        if b.get("type") == "document"
    ]


def read_banner(body: dict[str, Any]) -> m.Reply:
    """The agent's first call: it writes the text the screenshot shows, if it sees one."""
    seen = [KNOWN[p] for p in map(_pixels, images(body)) if p in KNOWN]
    text = seen[0] if seen else "a guess"
    return m.write_file("banner.py", f"TEXT = {text!r}\n")


def open_issue(github: GitHubServer, body: str, user: str = "writer") -> int:
    with github.as_user(user) as u:
        r = u.post(f"/repos/{REPO}/issues", json={"title": "Wrong banner", "body": body})
        r.raise_for_status()
        return int(r.json()["number"])


def record(redis: Redis, n: int) -> Any:
    return Store(redis).get(LoopId(REPO, n).key)


def test_a_screenshot_is_the_spec_the_agent_and_the_critic_see(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML, extra=FILES)
    png = picture(EXPECTED)
    n = open_issue(
        github, "The banner should read as shown:\n\n" + github.upload("want.png", png, image=True)
    )
    model.play(m.Reading(read_banner), m.text("The banner reads as the screenshot."), APPROVE)
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert r is not None and r.status == Status.COMPLETED, r
    merged = gitrepo.show(github.repo(REPO).path, "main", "banner.py")
    assert merged == f"TEXT = {EXPECTED!r}\n".encode()
    agent_first, *_, critic = model.requests
    assert images(agent_first) == [png]  # the bytes as uploaded: small enough to send as is
    assert "output_config" in critic and images(critic) == [png]
    assert github.served and not github.served_with_credentials  # no token went with it
    (triage,) = model.triage_requests  # readiness triage judged the issue with it too
    assert images(triage) == [png]
    # The file's hash is part of what the writer approved.
    (a,) = r.attachments["files"]
    assert a["sha256"] == hashlib.sha256(png).hexdigest() and a["name"] == "want.png"
    assert r.attachments["approved"] == r.approved_sha256


def test_a_log_is_text_and_what_cannot_be_read_is_named_on_the_issue(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML, extra=FILES)
    log = b"2026-11-28 ERROR banner shows TODO\n" * 3
    html = b"<!DOCTYPE html><html><body>Sign in</body></html>"
    body = "\n\n".join(
        [
            "The banner is wrong; the log and the screenshot say how.",
            github.upload("run.log", log, image=False, content_type="text/plain"),
            github.upload("huge.log", b"x" * (50 * 1024 * 1024), image=False),
            github.upload("page.png", html, image=True),
            "![elsewhere](https://images.example.com/shot.png)",
            github.upload("late.png", picture("late"), image=True, ttl=-5),
            github.upload("want.png", picture(EXPECTED), image=True),
            github.upload("spec.pdf", PDF, image=False),
        ]
    )
    n = open_issue(github, body)
    model.play(m.Reading(read_banner), m.text("Fixed."), APPROVE)
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert r is not None and r.status == Status.COMPLETED, r  # the loop went on
    first = json.dumps(model.requests[0])
    assert '<untrusted-attachment name=\\"run.log\\">' in first
    assert "2026-11-28 ERROR banner shows TODO" in first
    assert len(images(model.requests[0])) == 1  # only want.png
    (doc,) = documents(model.requests[0])  # the PDF as a document block
    assert doc["title"] == "spec.pdf" and base64.b64decode(doc["source"]["data"]) == PDF
    (said,) = [
        c["body"]
        for c in github.repo(REPO).comments.values()
        if "did not read every attachment" in c["body"]
    ]
    lines = {ln.split(":", 1)[0]: ln for ln in said.splitlines() if ln.startswith("- ")}
    assert set(lines) == {"- `huge.log`", "- `page.png`", "- `elsewhere`", "- `late.png`"}, said
    assert "over the 10,485,760-byte limit" in lines["- `huge.log`"]
    assert "its bytes are an HTML page" in lines["- `page.png`"]
    assert "another host (images.example.com)" in lines["- `elsewhere`"]
    assert "404" in lines["- `late.png`"] and "expired" in lines["- `late.png`"]
    skipped = {s["name"] for s in r.attachments["skipped"]}
    assert skipped == {"huge.log", "page.png", "elsewhere", "late.png"}


def test_a_non_writer_swapping_the_screenshot_stops_the_loop_unseen(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML, extra=FILES)
    first_png = picture("first")
    n = open_issue(
        github, "Like this:\n\n" + github.upload("a.png", first_png, image=True), "reader"
    )
    swapped = picture("SWAPPED")
    new_body = "Like this:\n\n" + github.upload("a.png", swapped, image=True)

    def swap_then_answer(body: dict[str, Any]) -> m.Item:
        # The author points the issue at a new upload while turn 1 runs.
        with github.as_user("reader") as u:
            u.patch(f"/repos/{REPO}/issues/{n}", json={"body": new_body}).raise_for_status()
        return m.text("Looking at it.")

    model.responder = swap_then_answer
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert r is not None and r.status == Status.CANCELLED and r.reason == Reason.ISSUE_EDITED, r
    sent = [img for body in model.requests for img in images(body)]
    assert sent and all(img == first_png for img in sent)
    assert swapped not in sent


def test_a_resumed_loop_compares_the_files_and_a_changed_one_is_an_edit(
    github: GitHubServer,
    model: AnthropicServer,
    web: Web,
    redis: Redis,
    drain: Any,
    tmp_path: Path,
) -> None:
    """Another worker (here: this one, its copy gone) resumes the loop: it downloads the
    files again and compares them with the hashes the writer approved. The same Markdown
    now serving other bytes is an edit: the loop stops, and the new bytes reach no model."""
    sample_repo(github, loop_yml=YML.replace("max_turns: 3", "max_turns: 1"), extra=FILES)
    png = picture(EXPECTED)
    shown = github.upload("want.png", png, image=True)
    n = open_issue(github, "The banner should read as shown:\n\n" + shown)
    model.play(m.write_file("banner.py", "TEXT = 'wrong'\n"), m.text("Done."))
    label(github, "writer", n)
    drain()
    r = record(redis, n)
    assert r is not None and r.status == Status.FAILED and r.reason == Reason.MAX_TURNS, r
    sent_before = len(model.requests)

    key = LoopId(REPO, n).key
    shutil.rmtree(Attachments(tmp_path / "data", github.url).folder(key))
    uuid = shown.rsplit("/", 1)[1].rstrip(")")
    other = picture("something else")
    github.uploads[uuid] = dataclasses.replace(github.uploads[uuid], data=other)
    comment(github, "writer", n, "/loop-restart")
    drain()

    r = record(redis, n)
    assert r.status == Status.CANCELLED and r.reason == Reason.ISSUE_EDITED, r
    assert "want.png" in r.detail
    assert all(other not in images(body) for body in model.requests[sent_before:])
    assert len(model.requests) == sent_before  # no model call at all


def test_the_screenshot_stays_in_the_first_message_after_the_conversation_is_briefed(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Many small steps outgrow a small window: the older ones, the first message with the
    issue among them, fold into a brief of text, and the image goes back in front of it."""
    model.window_override = 12_000
    say = "I looked at this part of the code and decided to keep going. " * 12
    steps: list[m.Item] = [m.bash(f"echo step {i}", say=say) for i in range(60)]
    script = deque([*steps, m.Reading(read_banner), m.text("Done.")])
    model.responder = _playing(
        lambda body: APPROVE if "format" in (body.get("output_config") or {}) else script.popleft()
    )
    sample_repo(github, loop_yml=YML.replace("max_turns: 3", "max_turns: 4"), extra=FILES)
    png = picture(EXPECTED)
    n = open_issue(github, "The banner should read:\n\n" + github.upload("w.png", png, image=True))
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert r is not None and r.status == Status.COMPLETED, r
    shrinks = [e["data"] for e in Store(redis).events(LoopId(REPO, n).key)]
    assert any(d.get("level") == "brief" for d in shrinks)
    stored = Store(redis).conversation(LoopId(REPO, n).key)
    first = stored[0]["content"]
    assert first[0]["type"] == "image" and first[1]["text"].startswith(BRIEF_MARK)
    agent = [b for b in model.requests if "format" not in (b.get("output_config") or {})]
    assert all(images(b) == [png] for b in agent)  # every call of the agent saw it, once


def _playing(responder: Any) -> Any:
    """A responder whose items may read the request (``m.Reading``) as scripted ones do."""

    def answer(body: dict[str, Any]) -> Any:
        item = responder(body)
        return item.reply(body) if isinstance(item, m.Reading) else item

    return answer


def test_a_writers_comment_brings_its_screenshot_and_a_readers_does_not(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    """Writers' comments reach the agent, their files with them; a comment by someone
    without write access reaches no prompt, and its files are never downloaded."""
    sample_repo(github, loop_yml=YML, extra=FILES)
    png, theirs = picture(EXPECTED), picture("from a reader")
    n = open_issue(github, "The banner is wrong; see the comments.")
    comment(github, "writer", n, "It should read:\n\n" + github.upload("w.png", png, image=True))
    comment(github, "reader", n, "No, like " + github.upload("r.png", theirs, image=True))
    model.play(m.Reading(read_banner), m.text("Done."), APPROVE)
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert r is not None and r.status == Status.COMPLETED, r
    first = model.requests[0]
    assert images(first) == [png]
    assert "Files attached to the comment by @writer (write access)" in json.dumps(first)
    assert all(theirs not in images(body) for body in model.requests)
    (ours,) = [k for k, u in github.uploads.items() if u.name == "w.png"]
    assert github.served == [ours]  # the writer's image only, once
