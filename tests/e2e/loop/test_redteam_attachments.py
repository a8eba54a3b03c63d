"""Red team on attachments (issue 39), end to end: an issue carrying a decompression-bomb
PNG and a link with a malformed port goes on to a merge with the screenshot it also
carries; both are named as skipped, and neither ends the loop's job in an exception."""

from __future__ import annotations

from typing import Any

from redis import Redis

from bot.core.record import Status
from bot.standins import anthropic as m
from bot.standins import gitrepo
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from tests.conftest import Web
from tests.e2e.loop.test_attachments import (
    APPROVE,
    EXPECTED,
    FILES,
    YML,
    open_issue,
    picture,
    read_banner,
    record,
)
from tests.helpers import REPO, label, sample_repo
from tests.io.test_redteam_attachments import bomb_png


def test_a_bomb_png_and_a_malformed_link_are_skipped_and_the_loop_goes_on(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML, extra=FILES)
    host = github.url.split("://", 1)[1].split(":", 1)[0]
    body = "\n\n".join(
        [
            "The banner should read as shown.",
            github.upload("bomb.png", bomb_png(), image=True),
            f"[odd](http://{host}:99999/user-attachments/files/1/odd.log)",
            github.upload("want.png", picture(EXPECTED), image=True),
        ]
    )
    n = open_issue(github, body)
    model.play(m.Reading(read_banner), m.text("Fixed."), APPROVE)
    label(github, "writer", n)
    drain()

    r = record(redis, n)
    assert r is not None and r.status == Status.COMPLETED, r
    assert gitrepo.show(github.repo(REPO).path, "main", "banner.py") == (
        f"TEXT = {EXPECTED!r}\n".encode()
    )
    assert [f["name"] for f in r.attachments["files"]] == ["want.png"]
    assert {s["name"] for s in r.attachments["skipped"]} == {"bomb.png"}
