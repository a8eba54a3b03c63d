"""What loopbot writes on GitHub: text the agent produced is made safe to publish."""

from __future__ import annotations

from bot.core.text.defuse import JOINER as J
from bot.core.text.messages import code_block, safe_text
from bot.io.github.plumbing import marker


def test_closing_keywords_in_agent_text_close_nothing() -> None:
    text = "Fixed add(). Also fixes #12, Closes: acme/other#3 and resolved #4; see #5."
    assert safe_text(text) == (
        f"Fixed add(). Also fixes #{J}12, Closes: acme/other#{J}3 and resolved #{J}4; see #{J}5."
    )
    url = "https://github.com/o/r/issues/7"
    assert safe_text(f"Resolves {url}") == f"R{J}esolves {url}"
    assert safe_text(f"Fixed it.\n\nSee {url}") == f"F{J}ixed it.\n\nSee {url}"
    assert safe_text(f"{url} was fixed") == f"{url} was fixed"  # no URL after the keyword
    assert safe_text("https://x.org/a#top and issue 8") == "https://x.org/a#top and issue 8"


def test_code_block_fence_outlasts_backticks_inside() -> None:
    assert code_block("plain") == "```\nplain\n```"
    tricky = "FAILED\n```\n</details> injected\n````"
    block = code_block(tricky)
    assert block.startswith("`````\n") and block.endswith("\n`````")


def test_model_text_pings_nobody() -> None:
    text = "Thanks @alice and @acme/security-team; `@quoted` too; &#64;bob; &amp; stays."
    assert safe_text(text) == (
        f"Thanks @{J}alice and @{J}acme/security-team; `@{J}quoted` too; "
        f"&{J}#{J}64;bob; &amp; stays."
    )
    assert safe_text(safe_text(text)) == safe_text(text)


def test_quoted_text_cannot_carry_loopbots_hidden_marker() -> None:
    # loopbot edits the comment that carries <!-- loopbot:KEY --> (find_comment): a section
    # title, a proposed criterion or a planner's text quoting one must not become it.
    for forged in ("<!-- loopbot:status -->", "<!--loopbot:plan-->", "<!--  LOOPBOT : triage -->"):
        out = safe_text(f"see {forged} here")
        assert marker("status") not in out and "<!-- loopbot:" not in out.lower()
        assert out.replace("\u2060", "") == f"see {forged} here"  # looks the same
        assert safe_text(out) == out  # idempotent
    assert safe_text("<!-- a comment -->") == "<!-- a comment -->"
