"""Keeping an agent's conversation inside the model's context window: pure decisions.

A loop runs up to 20 turns of up to 200 steps on one conversation, and a tool result can
be 64 KB: left alone, the conversation outgrows any window and every call after that is
``prompt is too long``. Before each call the agent estimates the request's input tokens
(``Gauge``: the last size the API counted, scaled by the characters added since) and,
past a threshold of the window, shrinks the conversation:

1. **clear**: old tool results (all but the latest ``KEEP_RESULTS`` tool-result messages)
   and large inputs of old tool calls (a whole file written) are replaced by a note of what
   was there; the model can run the tool again;
2. **brief**: if that is not enough, the older messages are replaced by one compact brief
   that keeps the issue statement (the first prompt, which holds the approved text and its
   acceptance criteria), the decisions the model wrote down, the files it touched, the
   latest instructions (a verify failure, findings) and what was left out;
3. **clip**: if the tail kept after the brief is still too big (one huge tool result),
   the large results in it are clipped.

Each level keeps the conversation valid for the Messages API: every ``tool_use`` keeps
its ``tool_result`` in the next message, the brief is a user message followed by an
assistant one, and the assistant messages kept are kept whole (thinking blocks and their
signatures must go back exactly as the API sent them). Shrinking goes well below the
threshold (``TARGET``), so it happens rarely: every shrink rewrites the prefix the prompt
cache holds, and the next call pays to write it again.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.core import attachments
from bot.core.text.prompts import COMMENT_FENCE, FENCE, GUIDANCE_FENCE

Message = dict[str, Any]
Fits = Callable[[list[Message]], bool]

THRESHOLD = 0.7  # of the window: past this estimate, shrink before the call
TARGET = 0.4  # of the window: what a shrink aims for, so the next one is far away
KEEP_RESULTS = 3  # the latest tool-result messages kept whole when clearing
CLEAR_MIN_CHARS = 400  # results shorter than this are not worth a note
INPUT_MIN_CHARS = 1_000  # a tool call's string input longer than this is cleared
CLIP_CHARS = 8_000  # what is left of one tool result in the tail after "clip"
ISSUE_CHARS = 70_000  # the issue as approved (GitHub allows 65,536 characters in a body)
TASK_CHARS = 4_000  # the first prompt's own words
COMMENT_CHARS = 4_500  # one maintainer's comment (each is already capped at 4,000)
COMMENTS_CHARS = 16_000  # all of them, the newest kept
GUIDANCE_CHARS = 16_000  # nested AGENTS.md sections
LATEST_CHARS = 6_000  # one of loopbot's prompts (verify output, findings, feedback)
INSTRUCTIONS_CHARS = 16_000  # all of them, the newest kept
DECISION_CHARS = 400  # one decision (a paragraph the model wrote) in the brief
MAX_DECISIONS = 30
MAX_FILES = 200
# Before the API has counted anything: about 3 characters per token, on the safe side of
# what code and English tokenise to (3.5 to 4), so the first estimate is not too small.
FIRST_RATIO = 1 / 3
MARGIN = 1.05  # an estimate from a measured ratio still rounds up

BRIEF_MARK = "[loopbot: conversation brief]"
CLEARED = (
    "[loopbot cleared this tool result to keep the conversation in the context window: "
    "{what}, {n} characters. Run the tool again if you need it.]"
)
CLEARED_INPUT = "[cleared by loopbot: {n} characters]"
CLIPPED = "\n[loopbot clipped this tool result here: {n} more characters]"
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_EDIT_COMMANDS = ("create", "str_replace", "insert", "undo_edit")


def chars(payload: Any) -> int:
    """The size the gauge scales: characters of the JSON the request carries, an image
    counted as the text of its tokens (the API bills its pixels, width * height / 750, not
    its base64: a 1 MB screenshot is ~1,600 tokens, not the 450,000 its characters say)."""
    n = len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
    for data in _image_data(payload):
        # The header is enough for the size: decode the start only.
        size = attachments.image_size(base64.b64decode(data[:IMAGE_HEAD], validate=False))
        if size is not None:
            n += CHARS_PER_TOKEN * attachments.image_tokens(*size) - len(data)
    return n


IMAGE_HEAD = 64 * 1024  # base64 characters of an image read for its size (a multiple of 4)
CHARS_PER_TOKEN = 4


def _image_data(node: Any) -> Iterator[str]:
    """The base64 data of every image block at any depth (a tool result holds blocks)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            source = item.get("source")
            if item.get("type") == "image" and isinstance(source, dict):
                if source.get("type") == "base64" and isinstance(source.get("data"), str):
                    yield source["data"]
                continue
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


@dataclass(frozen=True)
class Gauge:
    """What is known of the tokenizer: the last request's input tokens as the API counted
    them, and its size in characters. Scaling that ratio estimates the next request."""

    tokens: int = 0
    size: int = 0

    @property
    def ratio(self) -> float:
        if self.tokens <= 0 or self.size <= 0:
            return FIRST_RATIO
        return self.tokens / self.size

    def estimate(self, size: int) -> int:
        return int(size * self.ratio * MARGIN) + 1

    def measured(self, tokens: int, size: int) -> Gauge:
        return Gauge(tokens, size) if tokens > 0 and size > 0 else self


def over(estimate: int, window: int, threshold: float = THRESHOLD) -> bool:
    """Shrink before the call: the estimate passes the threshold of the window."""
    return estimate > window * threshold


def too_long(message: str) -> tuple[int, int] | None:
    """``(tokens, maximum)`` from the API's ``prompt is too long: N tokens > M maximum``."""
    found = _TOO_LONG.search(message)
    return (int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True)
class Shrunk:
    """A shrink's result: the new conversation and what was done, for the event."""

    messages: list[Message]
    level: str  # "clear", "brief" or "clip"; "none" when nothing could be removed
    cleared: int = 0  # tool results and inputs replaced by a note
    summarised: int = 0  # messages folded into the brief
    clipped: int = 0  # tool results clipped in the tail


def shrink(messages: Sequence[Message], fits: Fits, keep_results: int = KEEP_RESULTS) -> Shrunk:
    """The conversation made small enough that ``fits(messages)`` holds, level by level.

    ``fits`` is the caller's test (its estimate against the target). The input is not
    changed. When no level gets there, the smallest conversation made is returned: the
    caller sends it and, if the API still says too long, ends the turn.
    """
    cleared, n = clear(messages, keep_results)
    if fits(cleared):
        return Shrunk(cleared, "clear", cleared=n)
    briefed, folded = brief(cleared, fits)
    if folded and fits(briefed):
        return Shrunk(briefed, "brief", cleared=n, summarised=folded)
    clipped, c = clip(briefed)
    level = "clip" if c else ("brief" if folded else ("clear" if n else "none"))
    return Shrunk(clipped, level, cleared=n, summarised=folded, clipped=c)


# -- level 1: clear old tool results -----------------------------------------------------------


def _is_results(msg: Message) -> bool:
    content = msg.get("content")
    return (
        msg.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


def _result_text(block: Message) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _calls_by_id(messages: Sequence[Message]) -> dict[str, Message]:
    out: dict[str, Message] = {}
    for msg in messages:
        if msg.get("role") != "assistant" or not isinstance(msg.get("content"), list):
            continue
        for block in msg["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out[str(block.get("id"))] = block
    return out


def describe(call: Message | None) -> str:
    """A short name for a tool call: ``bash: pytest -q`` or ``view src/app.py``."""
    if call is None:
        return "a tool call"
    args = call.get("input") or {}
    if call.get("name") == "bash":
        command = " ".join(str(args.get("command", "")).split())
        return "bash: " + (command[:120] + "…" if len(command) > 120 else command)
    what = str(args.get("command", call.get("name", "tool")))
    path = args.get("path")
    return f"{what} {path}" if path else what


def clear(
    messages: Sequence[Message], keep_results: int = KEEP_RESULTS
) -> tuple[list[Message], int]:
    """Old tool results and large old tool inputs replaced by notes; the latest
    ``keep_results`` tool-result messages (and the calls they answer) kept whole."""
    out = copy.deepcopy(list(messages))
    result_msgs = [i for i, m in enumerate(out) if _is_results(m)]
    keep_from = result_msgs[-keep_results] if len(result_msgs) >= keep_results else 0
    if keep_results <= 0:
        keep_from = len(out)
    calls = _calls_by_id(out)
    n = 0
    for i in result_msgs:
        if i >= keep_from:
            break
        for block in out[i]["content"]:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            text = _result_text(block)
            if len(text) < CLEAR_MIN_CHARS or text.startswith("[loopbot cleared"):
                continue
            what = describe(calls.get(str(block.get("tool_use_id"))))
            block["content"] = CLEARED.format(what=what, n=len(text))
            n += 1
    # The calls' own inputs: a file written whole is as big as the file. The calls the
    # kept results answer sit just before them, and are kept too.
    for msg in out[: max(keep_from - 1, 0)]:
        if msg.get("role") != "assistant" or not isinstance(msg.get("content"), list):
            continue
        for block in msg["content"]:
            if not isinstance(block, dict) or block.get("type") != "tool_use":
                continue
            args = block.get("input")
            if not isinstance(args, dict):
                continue
            for key, value in list(args.items()):
                if isinstance(value, str) and len(value) > INPUT_MIN_CHARS:
                    args[key] = CLEARED_INPUT.format(n=len(value))
                    n += 1
    return out, n


# -- level 2: the brief ------------------------------------------------------------------------


def _texts(msg: Message) -> list[str]:
    content = msg.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        str(b.get("text", ""))
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and b.get("text")
    ]


def _clip_middle(text: str, limit: int) -> str:
    """``text`` within ``limit``: its start and its end (where acceptance criteria and the
    latest output usually are), with a note of what was cut between."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return text[:head] + f"\n[… {len(text) - limit} characters cut here …]\n" + text[-tail:]


def _clip(text: str, limit: int) -> str:
    return (
        text if len(text) <= limit else text[:limit] + f"\n[… {len(text) - limit} more characters]"
    )


# The fenced sections loopbot's prompts carry (bot/core/text/prompts.py). Text from outside
# is fence-safe there, so a tag found in a prompt is loopbot's own.
# A fence opens at the start of a line and its content starts on the next (the prose that
# names a tag, "between the <untrusted-issue> tags", is not one).
_SECTION = re.compile(
    r"^<(" + "|".join((FENCE, COMMENT_FENCE, GUIDANCE_FENCE)) + r")(?:\s[^>\n]*)?>\n.*?\n</\1>",
    re.DOTALL | re.MULTILINE,
)


@dataclass
class _Notes:
    task: str = ""  # the first prompt's own words: which issue, which verify command
    issue: str = ""  # the issue as last approved (its fenced section)
    comments: list[str] = field(default_factory=list)  # maintainers' comments, fenced
    guidance: list[str] = field(default_factory=list)  # nested AGENTS.md, fenced
    instructions: list[str] = field(default_factory=list)  # later prompts, oldest first
    decisions: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    earlier: int = 0  # messages summarised before (a brief already in the conversation)


def _strs(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    return [str(v) for v in value] if isinstance(value, list) else []


def _parse_brief(text: str) -> _Notes:
    """What an earlier brief kept (it is JSON after its mark), so briefs nest."""
    try:
        data = json.loads(text[len(BRIEF_MARK) :].split("\n\n", 1)[0])
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except (ValueError, IndexError):
        return _Notes(task=text[len(BRIEF_MARK) :])
    return _Notes(
        task=str(data.get("task", "")),
        issue=str(data.get("issue", "")),
        comments=_strs(data, "comments"),
        guidance=_strs(data, "guidance"),
        instructions=_strs(data, "instructions"),
        decisions=_strs(data, "decisions"),
        files=_strs(data, "files"),
        earlier=int(data.get("summarised", 0) or 0),
    )


def _take_sections(notes: _Notes, text: str) -> str:
    """File the fenced sections of a prompt under the brief's headings; the rest of the
    prompt (loopbot's own words) is returned."""
    for found in _SECTION.finditer(text):
        kind, section = found.group(1), found.group(0)
        if kind == FENCE:
            notes.issue = section  # the latest approved text wins (an approved edit)
        elif kind == COMMENT_FENCE:
            notes.comments.append(section)
        else:
            notes.guidance.append(section)
    return _SECTION.sub("[quoted in its own section of this brief]", text).strip()


def _failed_calls(messages: Sequence[Message]) -> set[str]:
    """Ids of tool calls whose result was an error: an edit that failed changed nothing."""
    return {
        str(b.get("tool_use_id"))
        for msg in messages
        if _is_results(msg)
        for b in msg["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("is_error")
    }


def notes_of(dropped: Sequence[Message], following: Sequence[Message] = ()) -> _Notes:
    """The brief's content from the messages it replaces (``following``: the messages kept
    after them, where the results of the last folded calls may be)."""
    notes = _Notes()
    failed = _failed_calls([*dropped, *following[:1]])
    for i, msg in enumerate(dropped):
        texts = _texts(msg)
        if msg.get("role") == "user":
            if i == 0 and texts and texts[0].startswith(BRIEF_MARK):
                notes = _parse_brief(texts[0])
                texts = texts[1:]
            for text in texts:
                rest = _take_sections(notes, text)
                if i == 0 and not notes.task:
                    notes.task = rest  # the first prompt: which issue, which verify
                elif rest:
                    notes.instructions.append(rest)  # verify output, findings, feedback
            continue
        for text in texts:
            notes.decisions.append(_clip(" ".join(text.split()), DECISION_CHARS))
        content = msg.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict) or block.get("type") != "tool_use":
                continue
            args = block.get("input") or {}
            if (
                block.get("name") == "str_replace_based_edit_tool"
                and args.get("command") in _EDIT_COMMANDS
                and isinstance(args.get("path"), str)
                and str(block.get("id")) not in failed
            ):
                notes.files.append(args["path"])
    notes.earlier += len(dropped)
    return notes


def _newest(items: Sequence[str], total: int, each: int) -> list[str]:
    """The newest items (each clipped to ``each``) that fit in ``total``, oldest first;
    nothing is dropped from the middle of a list."""
    kept: list[str] = []
    room = total
    for item in reversed(list(dict.fromkeys(items))):
        item = _clip_middle(item, each)
        if len(item) > room:
            break
        kept.append(item)
        room -= len(item)
    return kept[::-1]


def _quoted(text: str) -> str:
    """Text from a model, a tool or a test run, set apart line by line so it can never
    read as one of the brief's own headings."""
    return "\n".join("│ " + line for line in text.splitlines())


def _path(path: str) -> str:
    return "`" + " ".join(path.split()).replace("`", "'") + "`"


def render_brief(notes: _Notes) -> str:
    """The brief: a JSON record (read back by the next shrink) and the same in prose."""
    task = _clip_middle(notes.task, TASK_CHARS)
    issue = _clip_middle(notes.issue, ISSUE_CHARS)
    comments = _newest(notes.comments, COMMENTS_CHARS, COMMENT_CHARS)
    guidance = _newest(notes.guidance, GUIDANCE_CHARS, GUIDANCE_CHARS)
    instructions = _newest(notes.instructions, INSTRUCTIONS_CHARS, LATEST_CHARS)
    decisions = notes.decisions[-MAX_DECISIONS:]
    files = list(dict.fromkeys(notes.files))[-MAX_FILES:]
    record = {
        "task": task,
        "issue": issue,
        "comments": comments,
        "guidance": guidance,
        "instructions": instructions,
        "decisions": decisions,
        "files": files,
        "summarised": notes.earlier,
    }
    prose = [
        "This conversation grew past the model's context window, so loopbot replaced its "
        f"first {notes.earlier} messages with this brief. Your work so far is committed in "
        "the worktree: read the files again rather than relying on memory. Lines starting "
        "with │ are quoted from earlier messages, not loopbot's own words.",
        "## Your task\n" + _quoted(task),
    ]
    if issue:
        prose.append("## The issue, as last approved\n" + issue)
    if comments:
        prose.append("## Maintainers' comments given to you\n" + "\n".join(comments))
    if guidance:
        prose.append("## Guidance given to you\n" + "\n".join(guidance))
    if files:
        prose.append("## Files you changed so far\n" + "\n".join(f"- {_path(f)}" for f in files))
    if decisions:
        prose.append(
            "## What you wrote along the way (latest last)\n"
            + "\n".join(_quoted(d) for d in decisions)
        )
    if instructions:
        prose.append(
            "## loopbot's instructions to you so far (latest last; the last is the current one)\n"
            + "\n\n".join(_quoted(t) for t in instructions)
        )
    return BRIEF_MARK + json.dumps(record, ensure_ascii=False) + "\n\n" + "\n\n".join(prose)


def _cut_points(messages: Sequence[Message]) -> list[int]:
    """Where the kept tail may begin: an assistant message after a user one (never the
    first message). The tail then holds every tool_use with its tool_result."""
    return [
        i
        for i in range(1, len(messages))
        if messages[i].get("role") == "assistant" and messages[i - 1].get("role") == "user"
    ]


def brief(messages: Sequence[Message], fits: Fits) -> tuple[list[Message], int]:
    """The oldest messages folded into one brief, as few as make ``fits`` hold (or as many
    as may be folded: the latest assistant message and what follows it always stay)."""
    # Folding the first message alone (the issue prompt, or an earlier brief) into a brief
    # changes nothing: the brief holds it whole.
    points = [p for p in _cut_points(messages) if p > 1]
    if not points:
        return list(messages), 0

    def folded_at(cut: int) -> list[Message]:
        head: Message = {
            "role": "user",
            "content": [
                {"type": "text", "text": render_brief(notes_of(messages[:cut], messages[cut:]))}
            ],
        }
        return [head, *copy.deepcopy(list(messages[cut:]))]

    # Folding more leaves less: search for the earliest cut that fits, so as much of the
    # recent work as possible stays verbatim.
    lo, hi = 0, len(points) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(folded_at(points[mid])):
            hi = mid
        else:
            lo = mid + 1
    return folded_at(points[lo]), points[lo]


# -- a tool loop closed for another model ----------------------------------------------------


def in_tool_loop(messages: Sequence[Message]) -> bool:
    """The last message answers tool calls: the model is in the middle of a tool loop,
    where the API holds the calling message to the thinking rules of the model called."""
    return bool(messages) and _is_results(messages[-1])


def close_tool_loop(messages: list[Message]) -> bool:
    """The last exchange's tool calls and results rewritten as plain text, in place, so
    the conversation no longer sits inside a tool loop another model began (whose
    thinking, tied to that model, cannot go to this one). False: nothing to close."""
    if len(messages) < 2 or not in_tool_loop(messages) or messages[-2].get("role") != "assistant":
        return False
    calls = _calls_by_id(messages[-2:-1])
    said: list[Message] = []
    for block in messages[-2].get("content") or []:
        if block.get("type") == "tool_use":
            args = json.dumps(block.get("input") or {}, ensure_ascii=False)
            said.append({"type": "text", "text": f"[I called {block.get('name')} with {args}]"})
        elif block.get("type") == "text" and block.get("text"):
            said.append({"type": "text", "text": block["text"]})
    answered: list[Message] = []
    for block in messages[-1]["content"]:
        if block.get("type") == "tool_result":
            what = describe(calls.get(str(block.get("tool_use_id"))))
            failed = " (an error)" if block.get("is_error") else ""
            text = f"[the result of {what}{failed}]\n{_result_text(block)}"
            answered.append({"type": "text", "text": text})
        elif block.get("type") == "text":
            answered.append(block)
    messages[-2] = {"role": "assistant", "content": said or [{"type": "text", "text": "…"}]}
    messages[-1] = {"role": "user", "content": answered}
    return True


# -- level 3: clip what is left ----------------------------------------------------------------


def clip(messages: Sequence[Message], limit: int = CLIP_CHARS) -> tuple[list[Message], int]:
    """Tool results longer than ``limit`` cut to it, with a note of what is missing."""
    out = copy.deepcopy(list(messages))
    n = 0
    for msg in out:
        if not _is_results(msg):
            continue
        for block in msg["content"]:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            text = _result_text(block)
            if len(text) > limit:
                block["content"] = text[:limit] + CLIPPED.format(n=len(text) - limit)
                n += 1
    return out, n
