"""Milestones: parsing sections from the approved issue, and the sectioned loop's rules."""

from __future__ import annotations

import dataclasses

import pytest

from bot.core.record import Reason, Status
from bot.core.rules.loop import sections as s
from bot.core.rules.pull.merge import Merge, Review, decide, post_action_head
from tests.helpers import HEAD, merge_facts

TASKS = """\
Intro text.

- [ ] Parse the config
  with details
  - a sub-item
- [x] Already done by hand
* [ ] Write the docs

Trailing paragraph.
"""


def test_task_list_items_are_sections_and_ticked_ones_are_done() -> None:
    found = s.parse(TASKS)
    assert [x.title for x in found] == [
        "Parse the config",
        "Already done by hand",
        "Write the docs",
    ]
    assert [x.done for x in found] == [False, True, False]
    assert "with details" in found[0].text and "- a sub-item" in found[0].text
    assert "Trailing paragraph" not in found[2].text


def test_one_task_or_none_is_not_sectioned() -> None:
    assert s.parse("- [ ] only one thing\n\nand text") == []
    assert s.parse("just text") == []
    assert s.parse("") == []


def test_indented_task_lists_and_fenced_ones_are_ignored() -> None:
    body = "```\n- [ ] not a plan\n- [ ] example\n```\n  - [ ] nested a\n  - [ ] nested b\n"
    assert s.parse(body) == []
    body = "~~~md\n## Milestone x\n## Milestone y\n~~~\n- [ ] real one\n- [ ] real two\n"
    assert [x.title for x in s.parse(body)] == ["real one", "real two"]


def test_milestone_headings_win_and_end_at_same_or_higher_heading() -> None:
    body = (
        "- [ ] a task\n- [ ] another\n\n"
        "## Milestone 1: parser\nParse it.\n### details\nmore\n"
        "## Milestone 2: printer\nPrint it.\n# Appendix\nnot part of it\n"
    )
    found = s.parse(body)
    assert [x.title for x in found] == ["Milestone 1: parser", "Milestone 2: printer"]
    assert "### details" in found[0].text and "more" in found[0].text
    assert "Appendix" not in found[1].text
    assert not any(x.done for x in found)


def test_bounded_count_and_text() -> None:
    body = "\n".join(f"- [ ] task {i}" for i in range(20))
    found = s.parse(body)
    assert len(found) == s.MAX_SECTIONS
    assert "task 19" in found[-1].text and "(and 8 more)" in found[-1].title
    long = "- [ ] a\n  " + "x" * 10_000 + "\n- [ ] b\n"
    assert len(s.parse(long)[0].text) < s.MAX_SECTION_CHARS + 100


def test_markdown_round_trip_of_a_plan() -> None:
    plan = s.from_plan([{"title": "Parser", "text": "Parse."}, {"title": "CLI", "text": "Run."}])
    assert [x.title for x in s.parse(s.as_markdown(plan))] == [
        "Milestone 1: Parser",
        "Milestone 2: CLI",
    ]
    assert s.from_plan([{"title": "one", "text": "x"}]) == []


def _state(*done: bool) -> list[dict[str, object]]:
    return [s.Section(f"t{i}", f"x{i}", d).as_record() for i, d in enumerate(done)]


def test_after_verified_audits_the_current_section_or_opens_the_pull() -> None:
    assert s.after_verified(_state(True, False, False)) == s.Audit(1)
    assert s.after_verified(_state(True, True)) == s.OpenPull()
    assert s.after_verified([]) == s.OpenPull()


def test_after_audit_dirty_goes_back_clean_goes_on_and_rounds_are_capped() -> None:
    state = _state(False, True, False)
    assert s.after_audit(state, 0, verdict="request_changes", sev1=1, max_rounds=3) == s.Recode(
        0, 1
    )
    assert s.after_audit(state, 0, verdict="approve", sev1=0, max_rounds=3) == s.NextSection(0, 2)
    assert s.after_audit(state, 2, verdict="approve", sev1=0, max_rounds=3) == s.AllSections(2)
    state = s.count_round(s.count_round(state, 0), 0)
    stop = s.after_audit(state, 0, verdict="request_changes", sev1=2, max_rounds=3)
    assert isinstance(stop, s.StopLoop)
    assert (stop.status, stop.reason) == (Status.REFUSED, Reason.NEEDS_HUMAN)
    assert "section 1 of 3" in stop.detail and "3 audit(s)" in stop.detail
    err = s.after_audit(_state(False, False), 0, verdict="error", sev1=0, max_rounds=3)
    assert isinstance(err, s.StopLoop) and err.reason is Reason.CRITIC_ERROR


def test_restart_resumes_at_the_persisted_section_and_keeps_its_start() -> None:
    state = s.started(_state(False, False, False), 0, "a" * 40)
    state = s.started(s.tick(state, 0), 1, "b" * 40)
    assert s.current(state) == 1 and state[1]["start_sha"] == "b" * 40
    assert s.started(state, 1, "c" * 40)[1]["start_sha"] == "b" * 40  # kept on resume
    assert s.final(s.tick(state, 1)) is False and s.final(s.tick(s.tick(state, 1), 2))


def test_an_edit_keeps_the_done_prefix_only() -> None:
    old = s.tick(_state(False, False, False), 0)
    same = [s.Section("t0", "x0"), s.Section("t1", "x1"), s.Section("t2", "x2 edited")]
    assert [e["done"] for e in s.carry_over(old, same)] == [True, False, False]
    changed = [s.Section("t0", "x0 edited"), s.Section("t1", "x1")]
    assert [e["done"] for e in s.carry_over(old, changed)] == [False, False]


# -- post_action: the gate accepts exactly loopbot's one commit on top of the approved sha --------

REVIEWED = "a" * 40
KEPT: dict[str, object] = {"status": "kept", "base": REVIEWED, "sha": HEAD}


def _accepts(recorded: dict[str, object], **kw: object) -> bool:
    args: dict[str, object] = {
        "reviewed_sha": REVIEWED,
        "verdict": "approve",
        "head_sha": HEAD,
        "compare": ("ahead", 1, 0),
    } | kw
    return post_action_head(recorded, **args)  # type: ignore[arg-type]


def test_post_action_head_accepted_only_as_recorded_and_one_commit_on_top() -> None:
    assert _accepts(KEPT)
    assert not _accepts(KEPT | {"status": "dropped"})
    assert not _accepts(KEPT | {"base": "c" * 40})  # made on another sha
    assert not _accepts(KEPT | {"sha": "e" * 40})  # the head is not loopbot's commit
    assert not _accepts(KEPT, compare=("ahead", 2, 0))  # something more on top
    assert not _accepts(KEPT, compare=("diverged", 1, 1))  # a rebase
    assert not _accepts(KEPT, compare=None)
    assert not _accepts(KEPT, verdict="request_changes")  # only after an approval
    assert not _accepts(KEPT, reviewed_sha="")
    assert not _accepts(KEPT | {"base": HEAD}, reviewed_sha=HEAD)  # not a commit on top


def test_gate_merges_the_post_action_head_only_when_established() -> None:
    f = dataclasses.replace(merge_facts(), reviewed_sha=REVIEWED, post_action_sha=HEAD)
    assert decide(f) == Merge(HEAD)
    # Not established (the gate found the head is not that commit): review it again.
    assert isinstance(decide(dataclasses.replace(f, post_action_sha="")), Review)
    # A head that moved past the post-action commit: reviewed again, never merged.
    moved = dataclasses.replace(f, head_sha="f" * 40, verify_sha="f" * 40)
    assert isinstance(decide(moved), Review)
    # Verify must have passed on the post-action commit itself.
    refused = decide(dataclasses.replace(f, verify_sha=REVIEWED))
    assert not isinstance(refused, Merge)


def test_an_edit_keeps_where_the_changed_sections_work_began() -> None:
    # A writer ticks the first box (or fixes a typo in it) after the loop finished it:
    # the changed section's audit must still see its work from where it began.
    old = s.started(s.tick(s.started(_state(False, False), 0, "A0"), 0), 1, "B0")
    ticked = [s.Section("t0", "x0 typo fixed"), s.Section("t1", "x1")]
    out = s.carry_over(old, ticked)
    assert [e["done"] for e in out] == [False, False]
    assert out[0]["start_sha"] == "A0" and out[1]["start_sha"] == ""


def test_milestone_titles_keep_their_own_digits() -> None:
    found = [s.Section("2FA login", "a"), s.Section("Milestone 3: CLI", "b")]
    text = s.as_markdown(found)
    assert "## Milestone 1: 2FA login" in text and "## Milestone 2: CLI" in text
    assert [x.title for x in s.parse(text)] == ["Milestone 1: 2FA login", "Milestone 2: CLI"]


def test_a_long_finding_does_not_push_the_heading_or_the_others_out_of_the_prompt() -> None:
    from bot.core.text import prompts

    found = [
        {"severity": "sev1", "path": "a.py", "line": i, "title": f"T{i}", "body": "x" * 5000}
        for i in range(3)
    ]
    note = prompts.section_findings(0, 2, found)
    kept = note[-prompts.TAIL_CHARS :]  # what the continuation prompt keeps of a note
    assert kept.startswith("The audit of section 1 of 2")
    assert all(f"T{i}" in kept for i in range(3))


def test_after_audit_follows_the_critics_rules_on_a_request_and_a_repeat() -> None:
    state = _state(False, False)
    asked = s.after_audit(state, 0, verdict="request_changes", sev1=0, max_rounds=3)
    assert isinstance(asked, s.StopLoop) and asked.reason is Reason.NEEDS_HUMAN
    assert "requested changes without a blocking finding" in asked.detail
    repeat = s.after_audit(
        state, 0, verdict="request_changes", sev1=1, max_rounds=5, repeated=("x", "a.py", 3)
    )
    assert isinstance(repeat, s.StopLoop) and "raised in 3 audits" in repeat.detail
    # A repeat with nothing standing (dismissed) is no repeat.
    assert s.after_audit(
        state, 0, verdict="approve", sev1=0, max_rounds=5, repeated=("x", "a.py", 3)
    ) == s.NextSection(0, 1)


H, START = "h" * 40, "s" * 40


def _section(**fields: object) -> list[dict[str, object]]:
    state = s.started(_state(False, False), 0, START)
    state[0].update(fields)
    return state


@pytest.mark.parametrize(
    ("fields", "verified", "sev1_open", "then"),
    [
        ({}, True, 0, s.Audit(0)),  # verified, never audited: audit before coding
        ({"audited_sha": "old"}, True, 0, s.Audit(0)),  # audited an older head
        ({}, False, 0, None),  # verify did not pass on this head: code
        ({"audited_sha": H}, True, 0, None),  # judged clean-less, nothing dismissed: code
        ({"audited_sha": H, "dirty_sha": H, "dirty_sev1": True}, True, 1, None),  # stands
        # Writers dismissed every sev1 that held this very head: through, no new audit.
        ({"audited_sha": H, "dirty_sha": H, "dirty_sev1": True}, True, 0, s.NextSection(0, 1)),
        # The audit only requested changes (no sev1): nothing was dismissed to pass it.
        ({"audited_sha": H, "dirty_sha": H, "dirty_sev1": False}, True, 0, None),
        ({"start_sha": H}, True, 0, None),  # no work on the section yet
    ],
)
def test_a_resumed_loop_audits_the_verified_head_first_or_passes_an_overridden_one(
    fields: dict[str, object], verified: bool, sev1_open: int, then: object
) -> None:
    assert s.resume(_section(**fields), head=H, verified=verified, sev1_open=sev1_open) == then
    every = s.tick(s.tick(_section(), 0), 1)  # no section left: the pull request's turn
    assert s.resume(every, head=H, verified=True, sev1_open=0) is None
