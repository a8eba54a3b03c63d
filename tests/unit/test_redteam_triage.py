"""Red team of readiness triage: the texts a hostile issue can steer the model into writing.

The issue author (no write access) controls the text triage reads; whatever the model
then proposes reaches GitHub in the triage comment, in the issue body (``/loop-accept-spec``)
and in new issues (``/loop-split``). Besides mentions and references (``safe_text``), it
must not break out of loopbot's markup, plant loopbot's hidden markers, or turn accepted
criteria into milestones.
"""

from __future__ import annotations

from bot.core.rules.loop import sections
from bot.core.text import messages

MARKER = "<!-- loopbot:split -->"
BREAKOUT = "done</details>\n\n<!-- hide the rest"


def test_accepted_criteria_never_become_milestones() -> None:
    # A criterion that starts like a task-list box would make the appended section a
    # task list: two of them are milestones, and "[x]" ones are pre-ticked (skipped).
    spec = messages.spec_section(["[x] everything is done", "[ ] nothing", "[X] x"], "writer")
    body = "Make it nicer.\n\n" + spec
    assert sections.parse(body) == []
    assert "everything is done" in spec  # the text is kept, only its box is inert


def test_triage_comment_cannot_break_out_of_its_markup_or_plant_markers() -> None:
    text = messages.triage_comment(
        "too_large",
        [f"reason {MARKER}"],
        [],
        [(f"title {MARKER}", BREAKOUT), ("second", "<details><summary>x")],
        cost_usd=0.001,
        ready_label="loop:ready",
        needs_spec_label="loop:needs-spec",
    )
    assert text.count("</details>") == 2  # loopbot's own, one per sub-issue
    assert text.count("<details>") == 2
    assert "<!--" not in text  # no hidden text, no loopbot marker from the model
    assert "What you can do" in text and "one model call" in text
    spec = messages.triage_comment(
        "needs_spec",
        [BREAKOUT],
        [f"criterion {MARKER}"],
        [],
        cost_usd=0.001,
        ready_label="loop:ready",
        needs_spec_label="loop:needs-spec",
    )
    assert "<!--" not in spec and "</details>" not in spec


def test_texts_loopbot_writes_into_issues_carry_no_model_markup() -> None:
    section = messages.spec_section([f"a {MARKER}", "b </details>"], "writer")
    assert "<!--" not in section and "</details>" not in section
    body = messages.sub_issue_body(f"do it {MARKER}", "https://x/1", "writer")
    assert "<!--" not in body
    done = messages.split_done("writer", [(f"t {MARKER}", "https://x/2")], again=False)
    assert "<!--" not in done


def test_an_unclosed_fence_in_a_proposed_body_cannot_swallow_the_comment() -> None:
    text = messages.triage_comment(
        "too_large",
        [],
        [],
        [("one", "```\nunclosed"), ("two", "b")],
        cost_usd=0.0,
        ready_label="loop:ready",
        needs_spec_label="loop:needs-spec",
    )
    # The body sits in a fence longer than any run of backticks inside it.
    assert "  ````\n  ```\n  unclosed\n  ````\n\n  </details>" in text
