"""How big one event may be, and how much of the agent's events one loop may keep.

Events are kept in Redis (``bot/io/store.py``: the loop's stream and the global one) and
read by people (the session log, the dashboard, ``loopbot events``). Many of their fields
come from the agent: its text, a tool call's input and title, a tool's output, the paths
it wrote. For a CLI backend those are lines on the CLI's stdout, a pipe any process in
the sandbox can write into (``/proc/<cli>/fd/1``); a Codex code-mode script builds
megabyte command strings at no token cost. So nothing an event stores may be as large as
what it was given, and the events the agent's activity produces have a budget per loop.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any

# A string field of an event kept in the loop's stream, in characters. The largest thing a
# person reads from one is an edit's or a new file's text in the session log (a tool's
# output is cut to 2,000 at the source, jobs/agents/cli.py OUTPUT_SHOWN): 4,000 characters
# is a screenful or two of it; the rest is in the commit.
FIELD_CHARS = 4000
# One event's encoded data in the loop's stream. JSON escapes a non-ASCII character as
# six bytes, and an edit has two texts: 16 KiB holds an edit's two 4,000-character texts
# of plain text, and caps one of any shape (many fields, long lists, escapes).
EVENT_BYTES = 16 << 10
# The global stream is a tail of every loop's events for ``loopbot events`` (one line
# each), 50,000 long: its copy is short, so the whole stream stays under ~60 MiB.
GLOBAL_FIELD_CHARS = 200
GLOBAL_EVENT_BYTES = 1 << 10
ITEMS = 100  # items of a list, or keys of an object, kept in a field
KEY_CHARS = 100  # characters of an object's key
DEPTH = 6  # levels of nesting kept (a tool's input is an object of strings and lists)
FLOOR_CHARS = 16  # the string limit shrinks (by quarters) no lower than this to fit a size

# The agent's events: one per line the CLI prints (or per step of the built-in agent), so
# their number is the sandbox's to choose. Other kinds are the harness's own, a few a turn.
BUDGETED = frozenset({"agent_text", "agent_tool", "agent_result", "step"})
# What the agent's events of one loop may hold in its stream, for the loop's whole life
# (encoded data plus ENTRY_BYTES each). A loop's stream keeps its last 5,000 events
# (bot/io/store.py LOOP_EVENTS_MAXLEN); an ordinary loop's agent events are well under
# 1 KiB on average, so it reaches that length before this budget. Past it, the agent's
# events are dropped and one ``events_capped`` event says so; the harness's are kept.
LOOP_BUDGET_BYTES = 4 << 20
# Redis's own cost of a stream entry beyond its data (the entry id, the field names, the
# loop's key, the kind, the time), charged with each event so tiny events count too.
ENTRY_BYTES = 128
# A loop's stream (and its budget) expire this long after its last event: a finished
# loop's events stay readable (dashboard, session log, status) for three months.
EVENTS_TTL_SECONDS = 90 * 86400


def clip(text: str, chars: int) -> str:
    """``text`` cut to ``chars`` characters, with a marker saying how many were cut."""
    if len(text) <= chars:
        return text
    return f"{text[:chars]}… [{len(text) - chars} more characters cut]"


def _shape(value: Any, chars: int, depth: int) -> Any:
    """``value`` with every string at most ``chars`` characters, at most ``ITEMS`` items
    per list or object and ``DEPTH`` levels; what is cut is replaced by a marker."""
    if isinstance(value, str):
        return clip(value, chars)
    if value is None or isinstance(value, bool | int | float):
        return value
    if depth >= DEPTH:
        return "… [nested deeper than this, cut]"
    if isinstance(value, Mapping):
        out = {
            clip(str(k), KEY_CHARS): _shape(v, chars, depth + 1)
            for k, v in itertools.islice(value.items(), ITEMS)
        }
        if len(value) > ITEMS:
            out["…"] = f"{len(value) - ITEMS} more keys cut"
        return out
    if isinstance(value, list | tuple):
        items = [_shape(v, chars, depth + 1) for v in value[:ITEMS]]
        if len(value) > ITEMS:
            items.append(f"… {len(value) - ITEMS} more items cut")
        return items
    return clip(str(value), chars)  # what json.dumps(default=str) would have written


def bound(fields: Mapping[str, Any], chars: int, size: int) -> str:
    """``fields`` as an event's JSON data of at most ``size`` bytes: strings cut to
    ``chars`` characters (less, by quarters, when the whole is still too big); at the
    floor, only a note of how many fields there were."""
    limit = chars
    while True:
        text = json.dumps(_shape(fields, limit, 0))
        if len(text) <= size:
            return text
        if limit <= FLOOR_CHARS:
            return json.dumps({"cut": f"{len(fields)} fields, too large to keep even cut"})
        limit = max(FLOOR_CHARS, limit // 4)


def cost(data: str) -> int:
    """What one stored event counts against the loop's budget."""
    return len(data) + ENTRY_BYTES
