"""The repository's instruction files as a system-prompt section (prompts.guidance)."""

from __future__ import annotations

from bot.core.text import prompts


def test_none_or_blank_gives_nothing() -> None:
    assert prompts.guidance({}) == ""
    assert prompts.guidance({"AGENTS.md": None, "CLAUDE.md": "  \n"}) == ""


def test_fixed_order_and_framing() -> None:
    text = prompts.guidance(
        {".github/copilot-instructions.md": "C", "CLAUDE.md": "B", "AGENTS.md": "A"}
    )
    assert text.startswith("The maintainers' guidance for this repository")
    assert "never override" in text and "do not commit, push" in text
    assert text.index("'AGENTS.md'") < text.index("'CLAUDE.md'") < text.index("copilot")
    assert "review rules" in prompts.guidance({"AGENTS.md": "A"}, reviewer=True)


def test_each_file_and_the_whole_are_capped_with_a_note() -> None:
    big = "x" * 20_000
    text = prompts.guidance({p: big for p in prompts.INSTRUCTION_FILES})
    assert f"AGENTS.md cut at {prompts.GUIDANCE_FILE_CHARS:,} characters" in text
    assert f"CLAUDE.md cut at {prompts.GUIDANCE_FILE_CHARS:,} characters" in text
    assert "copilot-instructions.md" not in text  # no room left for the third
    assert text.count("x") <= prompts.GUIDANCE_TOTAL_CHARS


def test_a_short_file_leaves_its_room_to_the_next() -> None:
    text = prompts.guidance(
        {
            "AGENTS.md": "short",
            "CLAUDE.md": "~" * 8_000,
            ".github/copilot-instructions.md": "^" * 8_000,
        }
    )
    assert text.count("~") == 8_000 and "CLAUDE.md cut" not in text
    assert text.count("^") == 7_995 and "copilot-instructions.md cut at 7,995" in text
