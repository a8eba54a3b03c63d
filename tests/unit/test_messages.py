"""What loopbot writes on GitHub: text the agent produced is made safe to publish."""

from __future__ import annotations

from bot.core.text.defuse import JOINER as J
from bot.core.text.messages import code_block, safe_text


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
