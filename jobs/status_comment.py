"""The issue's one status comment: the loop's state on top, then the timeline of what
happened, kept event by event (``bot.core.text.sessionlog.Timeline``) so an update reads
and redacts only what happened since the last one."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable

from bot.core.record import LoopRecord
from bot.core.text import messages, sessionlog
from bot.io.github.client import Installation
from bot.io.store import FencedStore, LoopKey, Store


def post_status(store: Store, gh: Installation, record: LoopRecord, tail: str = "") -> LoopRecord:
    """Edit the issue's one status comment to show ``record`` and the timeline of its
    events. The only writer of that comment: every status change and turn comes here.

    ``tail``: the last verify output, shown while the last verify failed.
    """
    _fence(store)
    timeline = _timeline(store, record.key, gh.redact).render(messages.TIMELINE_LIMIT)
    body = messages.status_comment(
        record, "" if record.last_verify.get("passed") else tail, timeline_lines=timeline
    )
    comment = gh.upsert_comment(
        record.repo, record.issue, "status", body, known_id=record.status_comment_id
    )
    if comment.id != record.status_comment_id:
        return store.set_fields(record.key, status_comment_id=comment.id)
    return record


EVENTS_PAGE = 1000


# The timelines this process built last, by loop, with their token: an update then reads
# only the token and the events written since. Any process's saved state is consistent
# (its lines with the event they reach), so a copy held here stays right when another
# process updated the comment meanwhile: the events it added are read again, after ours.
# A token that differs (Redis lost the state, or it was built again) drops the copy.
_TIMELINES: OrderedDict[LoopKey, tuple[str, sessionlog.Timeline]] = OrderedDict()
_TIMELINES_HELD = 64
_TIMELINES_LOCK = threading.Lock()


def _timeline(store: Store, key: LoopKey, redact: Callable[[str], str]) -> sessionlog.Timeline:
    """The loop's timeline brought up to date with the events written since it was last
    built (read page by page, redacted as they are added) and saved: the work of a status
    update is what happened since the last one, however long the loop has run."""
    with _TIMELINES_LOCK:
        held = _TIMELINES.pop(key, None)
    built: sessionlog.Timeline | None = None
    if held is not None and store.timeline_token(key) == held[0]:
        token, built = held
    else:
        saved = store.timeline_state(key)
        if saved is not None:
            token, built = saved[0], sessionlog.Timeline.from_json(saved[1])
    if built is None:
        token, built = uuid.uuid4().hex, sessionlog.Timeline()
    while True:
        page = store.events(key, after=built.last_id, count=EVENTS_PAGE)
        built.add(page, redact)
        if len(page) < EVENTS_PAGE:
            break
    store.save_timeline_state(key, token, built.to_json())
    with _TIMELINES_LOCK:
        _TIMELINES[key] = (token, built)
        while len(_TIMELINES) > _TIMELINES_HELD:
            _TIMELINES.popitem(last=False)
    return built


def _fence(store: Store) -> None:
    """A lease holder checks its lease before every write, GitHub and RQ included."""
    if isinstance(store, FencedStore):
        store.guard()
