"""What loopbot writes on GitHub: text the agent produced is made safe to publish."""

from __future__ import annotations

from jobs.messages import code_block, defuse_references, safe_text


def test_closing_keywords_in_agent_text_close_nothing() -> None:
    text = "Fixed add(). Also fixes #12, Closes: acme/other#3 and resolved #4; see #5."
    assert defuse_references(text) == (
        "Fixed add(). Also fixes `#12`, Closes: `acme/other#3` and resolved `#4`; see #5."
    )
    assert defuse_references("prefix #7 stays a link") == "prefix #7 stays a link"


def test_code_block_fence_outlasts_backticks_inside() -> None:
    assert code_block("plain") == "```\nplain\n```"
    tricky = "FAILED\n```\n</details> injected\n````"
    block = code_block(tricky)
    assert block.startswith("`````\n") and block.endswith("\n`````")


def test_model_text_pings_nobody() -> None:
    text = "Thanks @alice and @acme/security-team; mail bob@example.com; `@quoted` stays."
    assert safe_text(text) == (
        "Thanks `@alice` and `@acme/security-team`; mail bob@example.com; `@quoted` stays."
    )
    assert safe_text("fixes #3 for @carol") == "fixes `#3` for `@carol`"
