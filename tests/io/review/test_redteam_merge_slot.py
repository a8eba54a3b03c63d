"""Red team on the merge slot's line (issue 43: one waiter woken at a time). A woken
waiter's gate runs later than the wake (its job waits in the queue): a gate that came
after it may find the slot free meanwhile and take it. The woken waiter, finding the slot
taken again, must keep its place at the front of the line, not go to the back: else each
newcomer pushes it behind the loops that came after it, and it can starve."""

from __future__ import annotations

from redis import Redis

from bot.core.ids import LoopId
from bot.io.store import Store
from jobs import lifecycle, merge_slot
from tests.io.review.test_merge_slot import A, B, C, gates_queued

D = LoopId("acme/widgets", 4)


def test_a_woken_waiter_that_finds_the_slot_taken_keeps_its_place_in_line(
    redis: Redis,
) -> None:
    store = Store(redis)
    assert merge_slot.take(redis, A) is None
    assert merge_slot.take(redis, B) == A.key  # B first in line
    assert merge_slot.take(redis, C) == A.key  # then C
    lifecycle.release(store, A.key)  # A merged: B woken
    assert gates_queued(redis) == [f"merge gate {B.key}"]
    assert merge_slot.take(redis, D) is None  # D's gate ran before B's: the slot was free
    assert merge_slot.take(redis, B) == D.key  # B's gate: taken again, B waits
    lifecycle.release(store, D.key)  # D merged: the first in line is still B
    assert gates_queued(redis) == [f"merge gate {B.key}", f"merge gate {B.key}"]
    assert merge_slot.take(redis, B) is None
    lifecycle.release(store, B.key)  # and C after it
    assert gates_queued(redis)[-1] == f"merge gate {C.key}"


def test_a_woken_waiter_that_ends_before_it_takes_the_slot_wakes_the_next(
    redis: Redis,
) -> None:
    """B is woken, and its loop ends before its gate takes the slot (the gate failed for
    good, a cancel): the next in line is woken then, not after its own timer's minutes."""
    store = Store(redis)
    assert merge_slot.take(redis, A) is None
    assert merge_slot.take(redis, B) == A.key
    assert merge_slot.take(redis, C) == A.key
    lifecycle.release(store, A.key)  # B woken
    assert gates_queued(redis) == [f"merge gate {B.key}"]
    lifecycle.release(store, B.key)  # B's loop ended (gate_error) without the slot
    assert gates_queued(redis) == [f"merge gate {B.key}", f"merge gate {C.key}"]
