"""A critic that can look: a bounded, read-only tool loop over the PR head's checkout.

The critic gets four tools on a throwaway worktree of the reviewed sha, so it can check
the agent's claims against the code instead of guessing from the diff:

- ``read_file`` and ``list_files`` read in the worker through :mod:`jobs.sandbox.safefs`
  (confined to the checkout, no symlink out of it or into ``.git``, bounded reads);
- ``search`` runs ``grep`` in the sandbox: the checkout is hostile input and so is a
  pattern the model may have been talked into, and there grep sees nothing else and
  is killed on a timeout;
- ``run_tests`` runs the repository's verify command, and only that (a command chosen
  by the model would make the critic an agent), in the sandbox; its result is kept, and
  the checkout is reset after it, so what the tests write is never read as the PR's.

Nothing here writes the checkout: the tools only read, and the sandbox's writes die
with the throwaway worktree. The loop is bounded by steps, tool calls, characters per
tool result, dollars and wall-clock time. Costs are estimated high (all input priced as
cache writes, a full ``max_tokens`` of output): a tool step is taken only while it and
the report after it could both be paid for, and no call is made that could cross the
cap. When a bound is hit, the model is asked once more, with tools refused
(``tool_choice: none``), for its report; so there is an answer, or a clear error saying
why not (the report alone could cross the cap, or the model gave none).

``output_config`` (the report's JSON schema) is sent on every call: the Messages API
combines it with tools, constraining the text answer while tool calls stay free. With a
model ``spec``, the call also asks for adaptive thinking at the review's effort
(``bot.core.models.thinking_params``); thinking blocks go back to the model exactly as it
wrote them. A reply cut at ``max_tokens`` inside a tool call is dropped, never run or
kept, and asked for once more with twice the limit (``bot.core.rules.loop.agent_stop``, as for
the agent; within the model's output limit); cut again, the tool rounds end.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anthropic

from bot.core.models import ModelSpec, merged, thinking_params
from bot.core.pricing import usage_from
from bot.core.record import Usage
from bot.core.rules.loop import agent_stop, budget
from bot.io.logs import get_logger
from jobs.agents.agent import add_user_text, with_cache_points
from jobs.review.checkout import ReviewCheckout, review_checkout
from jobs.sandbox import safefs
from jobs.sandbox.bwrap import Sandbox

log = get_logger("loopbot.critic_tools")

MAX_READ_BYTES = 1024 * 1024  # of one file read_file looks at
MAX_LIST = 500  # entries of a list_files answer
MAX_LINE = 300  # characters of one search hit
MAX_PATTERN = 1000
SEARCH_TIMEOUT = 30.0
MIN_CALL_TIMEOUT = 30.0  # seconds a model call is given even when the clock is nearly out
ANSWER_TIMEOUT = 300.0  # the last call, for the report, comes after the time cap
NOTE_ROOM = 200  # characters kept free in a tool result for the note saying it was cut

Stop = Literal["answered", "step_cap", "tool_cap", "cost_cap", "time_cap", "output_limit"]


@dataclass(frozen=True)
class ReviewLimits:
    max_steps: int = 12  # model calls that may use tools
    max_tool_calls: int = 40  # a step may ask for several
    max_output_chars: int = 12_000  # of one tool result
    max_cost_usd: float = 2.0  # every call of the review, the last answer included
    max_seconds: float = 600.0  # wall clock for the tool rounds
    max_tokens: int = 8192  # per model call


@dataclass
class ToolReview:
    text: str  # the model's last answer: the JSON report, unless ``error``
    stopped: Stop  # "answered" (the model finished) or the bound that ended the tools
    detail: str = ""
    steps: int = 0  # model calls, the last answer included
    tool_calls: int = 0
    usage: list[tuple[str, Usage]] = field(default_factory=list)  # (model, usage) per call
    error: str = ""  # set when there is no answer to use, and why

    @property
    def cost(self) -> float:
        return sum(u.cost_usd for _, u in self.usage)


# -- pure decisions --------------------------------------------------------------------


def worst_next(
    model: str, request: dict[str, Any], last: Usage | None, added: list[dict[str, Any]]
) -> float:
    """The most the next call could cost, by the issue budget's own bounds
    (:mod:`bot.core.rules.loop.budget`): no token shorter than a byte, every input token a cache
    write, a full ``max_tokens`` written. After a call, its tokens as the API counted them plus
    the ``added`` messages; before the first, the whole ``request``."""
    if last is None:
        bound = budget.input_bound(request)
    else:
        counted = (
            last.input_tokens
            + last.cache_read_tokens
            + last.cache_write_tokens
            + last.output_tokens
        )
        bound = budget.grown_bound(counted, added)
    return budget.worst_call(model, bound, int(request["max_tokens"])).usd


def bound_hit(
    limits: ReviewLimits,
    *,
    steps: int,
    tool_calls: int,
    spent: float,
    next_cost: float,
    elapsed: float,
) -> tuple[Stop, str] | None:
    """Which bound stops the tool rounds before the next call, if any. The cost bound
    keeps one more call in reserve: the report is always asked for within the cap."""
    if elapsed >= limits.max_seconds:
        return "time_cap", f"{elapsed:.0f}s of {limits.max_seconds:.0f}s used"
    if steps >= limits.max_steps:
        return "step_cap", f"{limits.max_steps} steps"
    if tool_calls >= limits.max_tool_calls:
        return "tool_cap", f"{limits.max_tool_calls} tool calls"
    if spent + 2 * next_cost > limits.max_cost_usd:
        return "cost_cap", (
            f"${spent:.4f} spent of ${limits.max_cost_usd:.2f}; a step could cost "
            f"${next_cost:.4f} and the report as much again"
        )
    return None


def clip(text: str, limit: int, hint: str) -> str:
    """``text`` cut to ``limit`` characters at a line end, saying so."""
    if len(text) <= limit:
        return text
    room = max(limit - NOTE_ROOM, 0)
    cut = text.rfind("\n", 0, room)
    kept = text[: cut if cut > 0 else room]
    return f"{kept}\n[cut: {len(text) - len(kept)} more characters not shown; {hint}]"


def tools_note(limits: ReviewLimits, verify: str) -> str:
    """A paragraph for the critic's system prompt about what it can do and for how long."""
    return (
        "You can look at the code at the pull request's head with read-only tools: "
        "read_file, list_files, search (grep) and run_tests, which runs the repository's "
        f"verify command `{verify}` in a sandbox. Use them to check what the diff and "
        f"the agent claim. You have at most {limits.max_steps} tool steps; when they run "
        "out you are asked for your report without tools, so do not spend them all."
    )


# -- the tools -------------------------------------------------------------------------

_NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
TOOL_DEFS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Lines of a file at the pull request's head, numbered. Paths are "
        "relative to the repository root.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["path"],
        },
    },
    {
        "name": "list_files",
        "description": "Files and directories under a directory (two levels deep), "
        "the repository root by default.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
    {
        "name": "search",
        "description": "Lines matching a pattern (grep -n), as path:line:text. A fixed "
        "string unless regex is true (extended regular expression). Optionally only "
        "under a directory `path`, and only files whose name matches `glob` (e.g. *.py).",
        "input_schema": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "regex": {"type": "boolean"},
                "path": {"type": "string"},
                "glob": {"type": "string"},
            },
            "required": ["pattern"],
        },
    },
    {
        "name": "run_tests",
        "description": "Run the repository's verify command on the pull request's head "
        "in a sandbox; returns its exit code and the end of its output.",
        "input_schema": _NO_ARGS,
    },
]


class ToolError(Exception):
    pass


class CriticTools:
    """The critic's read-only tools on one checkout."""

    def __init__(
        self,
        root: Path,
        sandbox: Sandbox,
        verify: str,
        *,
        max_chars: int,
        seconds_left: Callable[[], float] = lambda: float("inf"),
        after_tests: Callable[[], None] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.sandbox = sandbox
        self.verify = verify
        self.max_chars = max_chars
        self.seconds_left = seconds_left
        self.after_tests = after_tests
        self._tests: str | None = None

    def run(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        """One tool call: (text for the model, is_error), never longer than max_chars."""
        try:
            if name == "read_file":
                text = self._read(args)
            elif name == "list_files":
                text = self._list(args)
            elif name == "search":
                text = self._search(args)
            elif name == "run_tests":
                return self._run_tests()
            else:
                return f"unknown tool {name!r}", True
        except (ToolError, safefs.AccessError) as exc:
            return clip(str(exc), self.max_chars, "the error was long"), True
        except OSError as exc:  # the checkout is the agent's work: anything can fail
            return f"{name} failed: {exc.strerror or exc}", True
        return text, False

    def _path(self, raw: Any, default: str | None = None) -> Path:
        if raw is None and default is not None:
            raw = default
        if not isinstance(raw, str) or not raw:
            raise ToolError("a `path` (a string) is required")
        return safefs.resolve(self.root, raw)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def _read(self, args: dict[str, Any]) -> str:
        path = self._path(args.get("path"))
        start, end = args.get("start_line", 1), args.get("end_line")
        if not _is_int(start) or start < 1 or not (end is None or (_is_int(end) and end >= 1)):
            raise ToolError("start_line and end_line must be whole numbers from 1")
        if end is not None and end < start:
            raise ToolError(f"end_line {end} is before start_line {start}")
        text, got = safefs.read_text(path, MAX_READ_BYTES, root=self.root)
        if got.truncated and 0 <= text.rfind("\n") < len(text) - 1:
            text = text[: text.rfind("\n") + 1]  # cut mid-line: whole lines only
        rel = self._rel(path)
        if not text:
            return f"{rel} is empty"
        out: list[str] = []
        size, n, pos = 0, 0, 0
        while pos < len(text):
            nl = text.find("\n", pos)
            stop = len(text) if nl < 0 else nl
            n += 1
            if n >= start:
                line = f"{n:6}\t{text[pos:stop]}"
                if len(line) > self.max_chars - NOTE_ROOM:
                    line = line[: self.max_chars - NOTE_ROOM] + " [line cut here]"
                if size + len(line) + 1 > self.max_chars - NOTE_ROOM and out:
                    out.append(f"[cut at line {n - 1}; read on with start_line={n}]")
                    break
                out.append(line)
                size += len(line) + 1
            if end is not None and n >= end:
                break
            pos = stop + 1
        if n < start:
            raise ToolError(f"{rel} has {n} line(s); start_line {start} is past its end")
        if got.truncated:
            out.append(f"[only the first {len(got.data)} of {got.size} bytes were read]")
        return "\n".join(out)

    def _list(self, args: dict[str, Any]) -> str:
        path = self._path(args.get("path"), ".")
        listing = safefs.list_dir(path, root=self.root, depth=2, limit=MAX_LIST)
        rel = self._rel(path)
        prefix = "" if rel == "." else rel + "/"
        shown = "\n".join(prefix + e for e in listing.entries) or "(empty directory)"
        if listing.omitted or listing.incomplete:
            more = "more than " if listing.incomplete else ""
            shown += f"\n[{more}{listing.omitted} more entries not shown: list a subdirectory]"
        return clip(shown, self.max_chars, "list a subdirectory")

    def _search(self, args: dict[str, Any]) -> str:
        pattern, glob = args.get("pattern"), args.get("glob")
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
            raise ToolError(f"`pattern` must be a string of 1 to {MAX_PATTERN} characters")
        if glob is not None and (not isinstance(glob, str) or not glob or "/" in glob):
            raise ToolError("`glob` is a file name pattern such as *.py (no directories)")
        where = self._rel(self._path(args.get("path"), "."))
        seconds = min(SEARCH_TIMEOUT, self.seconds_left())
        if seconds < 1:
            raise ToolError("not run: the review's time is up")
        argv = ["grep", "-rnHI", "--color=never", "--exclude-dir=.git"]
        argv.append("-E" if args.get("regex") else "-F")
        if glob:
            argv.append(f"--include={glob}")
        argv += ["-e", pattern, "--", where]
        r = self.sandbox.run(shlex.join(argv), timeout=seconds)
        if r.exit_code == 1 and not r.output.strip():
            return f"no match for {pattern!r} under {where}"
        if r.exit_code not in (0, 1):
            raise ToolError(f"search failed (exit code {r.exit_code}): {r.output[-500:]}")
        lines = [ln.removeprefix("./")[:MAX_LINE] for ln in r.output.splitlines()]
        out, size = [], 0
        for i, line in enumerate(lines):
            if size + len(line) + 1 > self.max_chars - NOTE_ROOM:
                out.append(f"[{len(lines) - i} more matching lines not shown; narrow the search]")
                break
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)

    def _run_tests(self) -> tuple[str, bool]:
        # The checkout never changes during a review: one run answers every later call.
        # A failing run is a result, not a tool error: is_error is only for "not run".
        if self._tests is not None:
            return "(the same result as the earlier run: the code has not changed)\n" + (
                self._tests
            ), False
        seconds = min(self.sandbox.timeout, self.seconds_left())
        if seconds < 1:
            return "not run: the review's time is up", True
        r = self.sandbox.run(self.verify, timeout=seconds)
        if self.after_tests is not None:
            self.after_tests()  # what the tests wrote must not be read as the PR's code
        head = (
            f"`{self.verify}` {'passed' if r.passed else 'failed'}: exit code {r.exit_code}, "
            f"{r.seconds:.1f}s\n"
        )
        room = max(self.max_chars - len(head) - NOTE_ROOM, 0)
        tail = r.output[-room:] if room else ""
        if len(r.output) > len(tail):
            tail = f"[... {len(r.output) - len(tail)} characters before this cut ...]\n" + tail
        self._tests = head + tail
        return self._tests, False


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- the loop --------------------------------------------------------------------------

FINAL_PROMPT = (
    "Your tools are spent ({why}). Do not call any more tools: give your report now, "
    "as JSON in the schema, from what you have seen."
)


def review_with_tools(
    client: anthropic.Anthropic,
    *,
    model: str,
    system: str,
    prompt: str | list[dict[str, Any]],  # the first message: text, or blocks (images)
    schema: dict[str, Any],
    checkout: Path,
    sandbox: Sandbox,
    verify_command: str,
    limits: ReviewLimits | None = None,
    after_tests: Callable[[], None] | None = None,
    on_usage: Callable[[str, Usage], None] | None = None,
    before_call: Callable[[dict[str, Any]], None] | None = None,
    spec: ModelSpec | None = None,
    effort: str | None = None,
    send: Callable[[dict[str, Any], float], tuple[Any, Usage]] | None = None,
) -> ToolReview:
    """Review with tools until the model answers or a bound is hit, then ask for the
    report without tools. ``on_usage`` hears of every call's usage as soon as it is
    known (so it is recorded even when a later call raises); ``ToolReview.usage`` holds
    the same. ``before_call`` sees each request before it is sent and may raise to stop
    the review (the issue's budget guard, ``jobs.precall.guard``). ``send``, when given,
    makes each call instead (request, timeout) and charges it (``jobs.precall.call``: the
    guard, refusals retried, a lost call charged): ``before_call`` and ``on_usage`` are
    then not used. ``spec``: the model's
    limits and what it accepts (None: no thinking, no effort); ``effort``: the level to
    ask for, dropped when the model does not take it. Model errors propagate, as the SDK
    raises them."""
    limits = limits or ReviewLimits()
    usual = min(limits.max_tokens, spec.max_output) if spec else limits.max_tokens
    # A retry's limit: the agent's (under the SDK's non-streaming cap), within the model's.
    ceiling = (
        min(agent_stop.MAX_OUTPUT_TOKENS, spec.max_output) if spec else agent_stop.MAX_OUTPUT_TOKENS
    )
    params = thinking_params(spec, effort) if spec else {}
    started = time.monotonic()

    def seconds_left() -> float:
        return limits.max_seconds - (time.monotonic() - started)

    tools = CriticTools(
        checkout,
        sandbox,
        verify_command,
        max_chars=limits.max_output_chars,
        seconds_left=seconds_left,
        after_tests=after_tests,
    )
    defs = [*TOOL_DEFS[:-1], {**TOOL_DEFS[-1], "cache_control": {"type": "ephemeral"}}]
    base: dict[str, Any] = {
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "tools": defs,
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    review = ToolReview(text="", stopped="answered")
    priced_as = model
    last: Usage | None = None
    seen = 0  # messages the last call was sent and answered with: the rest is new
    max_tokens = usual  # raised once to ask again for a reply cut mid-tool-call

    def request(tool_choice: str) -> dict[str, Any]:
        req = {
            **base,
            "max_tokens": max_tokens,
            "model": model,
            "messages": with_cache_points(messages),
            "tool_choice": {"type": tool_choice},
        }
        return merged(req, params)  # output_config keeps the format beside the effort

    def worst(req: dict[str, Any]) -> float:
        return worst_next(priced_as, req, last, messages[seen:])

    def call(req: dict[str, Any], timeout: float) -> tuple[Any, list[dict[str, Any]]]:
        """One call, charged; its reply's blocks exactly as the model wrote them (thinking
        blocks and their signatures included), not yet in the conversation."""
        nonlocal priced_as, last, seen
        if send is not None:
            resp, last = send(req, timeout)
            priced_as = resp.model or model
        else:
            if before_call is not None:
                before_call(req)
            resp = client.with_options(timeout=timeout).messages.create(**req)
            priced_as = resp.model or model
            last = usage_from(priced_as, resp.usage)
            if on_usage is not None:
                on_usage(priced_as, last)
        review.steps += 1
        review.usage.append((priced_as, last))
        # Kept or dropped, the next call's input is at most this one's input and output
        # plus what is added after it: the bound for ``worst`` starts here.
        seen = len(messages)
        return resp, [b.model_dump(exclude_none=True) for b in resp.content]

    def keep(blocks: list[dict[str, Any]]) -> None:
        nonlocal seen
        messages.append({"role": "assistant", "content": blocks})
        seen = len(messages)

    while True:
        req = request("auto")
        hit = bound_hit(
            limits,
            steps=review.steps,
            tool_calls=review.tool_calls,
            spent=review.cost,
            next_cost=worst(req),
            elapsed=time.monotonic() - started,
        )
        if hit is not None:
            review.stopped, review.detail = hit
            break
        resp, blocks = call(req, max(seconds_left(), MIN_CALL_TIMEOUT))
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        decision = agent_stop.after_response(
            step_cap=limits.max_steps,
            stop_reason=resp.stop_reason,
            tool_calls=len(uses),
            cut_in_call=bool(blocks) and blocks[-1].get("type") == "tool_use",
            max_tokens=max_tokens,
            retried=max_tokens != usual,
        )
        tried, max_tokens = max_tokens, usual
        if isinstance(decision, agent_stop.Retry) and min(decision.max_tokens, ceiling) > tried:
            # The cut call's input is partial: it is never run or kept; asked again, bigger.
            max_tokens = min(decision.max_tokens, ceiling)
            log.info("critic_tools.cut_mid_call", max_tokens=tried, retry_max_tokens=max_tokens)
            continue
        if isinstance(decision, agent_stop.Retry | agent_stop.OutputLimit):
            # Cut again, or no room to ask for more: the tool rounds end, the report follows.
            again = "again " if tried != usual else ""
            review.stopped = "output_limit"
            review.detail = (
                f"the model's reply was cut off {again}in the middle of a tool call at "
                f"{tried} output tokens; the cut call was not run or kept"
            )
            break
        keep(blocks)
        if resp.stop_reason != "tool_use" or not uses:
            review.text = _text(messages[-1]["content"])
            if not review.text:
                review.error = f"the model ended its review with no answer ({resp.stop_reason})"
            return _logged(review)
        results = []
        for use in uses:
            if review.tool_calls >= limits.max_tool_calls:
                text, is_error = "not run: the review's tool calls are spent", True
            else:
                review.tool_calls += 1
                text, is_error = tools.run(use["name"], use.get("input") or {})
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": use["id"],
                    "content": text,
                    "is_error": is_error,
                }
            )
        messages.append({"role": "user", "content": results})

    add_user_text(messages, FINAL_PROMPT.format(why=review.detail))
    req = request("none")
    needed = worst(req)
    if review.cost + needed > limits.max_cost_usd:
        review.error = (
            f"the review's cost cap of ${limits.max_cost_usd:.2f} leaves no room for an "
            f"answer: ${review.cost:.4f} spent, and one more call could cost ${needed:.4f}"
        )
        return _logged(review)
    resp, blocks = call(req, ANSWER_TIMEOUT)
    keep(blocks)
    review.text = _text(messages[-1]["content"])
    if not review.text:
        review.error = (
            f"asked for its report without tools, the model gave none ({resp.stop_reason})"
        )
    return _logged(review)


def _logged(review: ToolReview) -> ToolReview:
    log.info(
        "critic_tools.done",
        stopped=review.stopped,
        detail=review.detail,
        steps=review.steps,
        tool_calls=review.tool_calls,
        cost=round(review.cost, 4),
        error=review.error[:300],
    )
    return review


def _text(blocks: list[dict[str, Any]]) -> str:
    return "".join(b.get("text", "") for b in blocks if b.get("type") == "text").strip()


__all__ = ["ReviewCheckout", "review_checkout"]  # where the critic has found them
