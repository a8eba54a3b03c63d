"""An issue's screenshot with opencode as the backend (issue 39): the real opencode, in
loopbot's sandbox, opens the file in the read-only folder outside the worktree with its
own read tool, and its next request to the model holds the image."""

from __future__ import annotations

from typing import Any

import pytest
from redis import Redis

from bot.core.ids import LoopId
from bot.core.record import Status
from bot.io.store import Store
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from bot.standins.github import GitHubServer
from jobs.agents.opencode import cli_path
from tests.conftest import Web
from tests.e2e.agents.test_claude_code_attachments import _prompt_path
from tests.e2e.loop.test_attachments import APPROVE, EXPECTED, FILES, KNOWN, images, picture
from tests.e2e.loop.test_attachments import _pixels as pixels
from tests.e2e.loop.test_attachments import open_issue as open_titled
from tests.helpers import REPO, label, sample_repo

ENV = {"LOOPBOT_AGENT_BACKENDS": "builtin,opencode", "LOOPBOT_MODEL": "claude-sonnet-4-6"}
pytestmark = pytest.mark.skipif(cli_path() is None, reason="opencode is not installed")
YML = (
    "verify: python3 -m unittest -q test_banner\nmax_turns: 3\ntriage:\n  enabled: false\n"
    "agent:\n  backend: opencode\n"
)


@pytest.fixture
def env_extra() -> dict[str, str]:
    return dict(ENV)


def test_opencode_reads_the_screenshot_with_its_own_read_tool(
    github: GitHubServer, model: AnthropicServer, web: Web, redis: Redis, drain: Any
) -> None:
    sample_repo(github, loop_yml=YML, extra=FILES)
    png = picture(EXPECTED)
    shown = github.upload("want.png", png, image=True)
    n = open_titled(github, "The banner should read:\n\n" + shown)

    def write_what_it_saw(body: dict[str, Any]) -> m.Reply:
        seen = [KNOWN[p] for p in map(pixels, images(body)) if p in KNOWN]
        return m.oc_write("banner.py", f"TEXT = {(seen or ['a guess'])[0]!r}\n")

    model.play(
        m.Reading(lambda body: m.tool("read", {"filePath": _prompt_path(body)})),
        m.Reading(write_what_it_saw),
        m.text("The banner reads as the screenshot."),
        APPROVE,
    )
    label(github, "writer", n)
    drain()

    r = Store(redis).get(LoopId(REPO, n).key)
    assert r is not None and r.status == Status.COMPLETED, r
    assert github.file_at(REPO, "main", "banner.py") == f"TEXT = {EXPECTED!r}\n"
    cli = [b for b in model.requests if "format" not in (b.get("output_config") or {})]
    assert not images(cli[0])
    assert [pixels(i) for i in images(cli[1])] == [pixels(png)]
