"""The gate's decisions where the base branch requires a merge queue: enqueue the head
the critic reviewed once every other condition holds, wait while it is queued, and act on
why the queue let go of it; and how a removal is told from an older one."""

from __future__ import annotations

from dataclasses import replace

from bot.core.record import Reason
from bot.core.rules.pull.merge import (
    QUEUE_CHECKS,
    AwaitPeople,
    Enqueue,
    FixChecks,
    FixConflicts,
    InQueue,
    Merge,
    Refuse,
    Wait,
    decide,
    needs_slot,
    queue_removal,
)
from bot.core.text import receipt
from tests.helpers import merge_facts

Q = {"merge_queue": True}


def test_a_queue_enqueues_the_reviewed_head_instead_of_merging() -> None:
    f = replace(merge_facts(), **Q)
    assert decide(f) == Enqueue(f.head_sha)
    assert isinstance(decide(merge_facts()), Merge)  # no queue: loopbot merges
    assert not needs_slot(Enqueue(f.head_sha))  # the queue orders merges, not the slot


def test_the_queue_waits_for_every_other_condition_first() -> None:
    pending = replace(merge_facts(), checks="pending", failing_checks=(), **Q)
    assert isinstance(decide(pending), Wait)
    people = replace(merge_facts(), review_decision="REVIEW_REQUIRED", **Q)
    assert isinstance(decide(people), AwaitPeople)
    moved = replace(merge_facts(), head_sha="f" * 40, **Q)  # not the reviewed head
    assert not isinstance(decide(moved), Enqueue | Merge)
    conflicting = replace(merge_facts(), mergeable=False, **Q)
    assert isinstance(decide(conflicting), FixConflicts)


def test_a_moved_base_is_the_queues_to_test_not_a_merge_down() -> None:
    # Without a queue a base that moved since verify means merging it in; with one, the
    # queue runs the required checks on the head merged with the base as it is then.
    behind = replace(merge_facts(), base_included=False)
    assert isinstance(decide(behind), FixConflicts)
    assert isinstance(decide(replace(behind, **Q)), Enqueue)
    table = receipt.rows(replace(behind, **Q), ready_label="loop:ready")
    assert receipt.unmet(table) == []
    unknown = replace(merge_facts(), base_included=None)
    assert isinstance(decide(unknown), Refuse)
    assert isinstance(decide(replace(unknown, **Q)), Enqueue)


def test_the_queues_merge_method_is_not_loopbots_to_refuse() -> None:
    f = replace(merge_facts(), method_allowed=False)
    assert isinstance(decide(f), Refuse)
    assert isinstance(decide(replace(f, **Q)), Enqueue)


def test_in_the_queue_it_waits_and_says_where() -> None:
    f = replace(merge_facts(), queue_in=True, queue_position=2, **Q)
    got = decide(f)
    assert isinstance(got, InQueue) and "position 2" in got.why


def test_failing_queue_checks_get_a_fix_turn_then_a_refusal() -> None:
    f = replace(merge_facts(), queue_removed="CI_FAILURE", queue_failing=("ci/test",), **Q)
    assert decide(f) == FixChecks(("ci/test",), queue=True)
    spent = replace(f, fix_turns_used=f.max_fix_turns)
    got = decide(spent)
    assert isinstance(got, Refuse) and got.reason is Reason.CHECKS_FAILED and got.to_person
    assert "ci/test" in got.why and "merge queue" in got.why
    unnamed = replace(f, queue_removed="CI_TIMEOUT", queue_failing=())
    assert decide(unnamed) == FixChecks((QUEUE_CHECKS,), queue=True)


def test_a_person_removing_it_or_any_other_reason_goes_to_a_person() -> None:
    f = replace(merge_facts(), queue_removed="MANUAL", queue_removed_by="bob", **Q)
    got = decide(f)
    assert isinstance(got, Refuse) and got.reason is Reason.NEEDS_HUMAN
    assert got.why.startswith("@bob removed the pull request from the merge queue")
    other = decide(replace(f, queue_removed="MERGE_CONFLICT", queue_removed_by=""))
    assert isinstance(other, Refuse) and other.reason is Reason.NEEDS_HUMAN
    assert "MERGE_CONFLICT" in other.why


def test_merged_by_the_queue_is_already_merged() -> None:
    f = replace(merge_facts(), pr_merged=True, pr_open=False, **Q)
    assert type(decide(f)).__name__ == "AlreadyMerged"
    # The queue's removal for a merge is recorded a moment before the merge lands: wait.
    landing = replace(merge_facts(), queue_removed="MERGE", **Q)
    assert decide(landing) == InQueue("the merge queue is merging it")


def test_a_removal_counts_only_if_it_came_after_loopbot_enqueued_that_head() -> None:
    def removal(**kw: object) -> str:
        args = {
            "enqueued_head": "a" * 40,
            "removals_then": 1,
            "removals_now": 2,
            "removed_head": "a" * 40,
            "reason": "CI_FAILURE",
        } | kw
        return queue_removal(**args)  # type: ignore[arg-type]

    assert removal() == "CI_FAILURE"
    assert removal(removals_now=1) == ""  # the removal GitHub counted before the enqueue
    assert removal(enqueued_head="") == ""  # this head was never enqueued
    assert removal(removed_head="b" * 40) == ""  # another head's removal
    assert removal(removed_head="") == "CI_FAILURE"  # GitHub did not say which head
    assert removal(reason="") == "UNKNOWN_REMOVAL_REASON"
    assert removal(reason="manual") == "MANUAL"  # the timeline's spelling
