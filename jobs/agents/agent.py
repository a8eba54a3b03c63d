"""One agent turn: the step loop over Anthropic's Messages API with client tools.

A step is one model call plus the tool calls it asks for. The turn ends on a non-tool
finish, the step cap, the tool-call budget, a doom loop (the same call three times in a
row), the issue's budget (checked before each call: a call that could cross it is never
made), too many stalls, cancellation, a refusal, the context window, or a reply cut
mid-tool-call twice; the reason is returned, never swallowed. A reply that must not be
kept (refused, cut, or cut inside a tool call) never reaches the conversation, so the
stored conversation is always one the Messages API accepts; its usage is still counted. Those
rules are pure decisions in ``bot.core.rules.loop.agent_stop``; this module does the I/O. The
conversation is a list of plain dicts so it can be stored in Redis and continued by
another worker.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, assert_never

import anthropic

from bot.core.pricing import usage_from
from bot.core.record import Usage
from bot.core.rules.loop import agent_stop as rules
from bot.core.rules.loop import budget, context
from bot.core.rules.loop.agent_stop import End, Go, Stop
from bot.core.rules.loop.budget import Budget, Spent
from jobs import precall
from jobs.agents.tools import TOOLS, ToolBox

MAX_TOKENS = 8192
THINKING_BLOCKS = ("thinking", "redacted_thinking")

SYSTEM = """\
You are loopbot, an autonomous software engineer working on one GitHub issue.
The repository is checked out at {root}; commands run there, in a sandbox{network}.
Make the smallest correct change that resolves the issue, with tests where the project
has them. Use the bash tool to explore and run commands and the text editor tool to
edit files. Do not commit, push or create branches: the harness commits your changes
after each turn and runs the verify command `{verify}`; a turn ends when you stop
calling tools.{protected} Finish with a short summary of what you changed and why."""


@dataclass
class Limits:
    step_cap: int
    tool_budget: int
    budget: Budget | None = None  # the whole-life budget; None: unlimited
    spent: Spent = field(default_factory=Spent)  # what the issue had spent as the turn began
    stall_timeout: float = 300.0


@dataclass
class Outcome:
    end: End
    steps: int = 0
    tool_calls: int = 0
    usage: list[tuple[str, Usage]] = field(default_factory=list)  # (model, usage) per call
    # Calls already charged to the loop as they were made (the model gateway's, for a
    # backend in the sandbox): counted in the turn's cost, never charged again.
    charged: list[tuple[str, Usage]] = field(default_factory=list)
    text: str = ""
    detail: str = ""
    model_seconds: float = 0.0  # time waiting for the model (for the overhead benchmark)
    tool_seconds: float = 0.0

    @property
    def cost(self) -> float:
        return sum(u.cost_usd for _, u in [*self.usage, *self.charged])

    @property
    def tokens(self) -> int:
        return sum(
            u.input_tokens + u.output_tokens + u.cache_read_tokens + u.cache_write_tokens
            for _, u in [*self.usage, *self.charged]
        )


def with_cache_points(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of the conversation with a cache breakpoint on its last block.

    Tools and system carry their own breakpoint; together they cache the stable prefix
    (tools, system, conversation so far) and each step only pays for what is new.
    """
    out = copy.deepcopy(messages)
    for msg in reversed(out):
        content = msg.get("content")
        if isinstance(content, str):
            msg["content"] = [
                {"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}
            ]
            break
        # Thinking blocks cannot carry a cache mark (the API refuses it).
        marked = [b for b in content or [] if b.get("type") not in THINKING_BLOCKS]
        if marked:
            marked[-1]["cache_control"] = {"type": "ephemeral"}
            break
    return out


class TurnAgent(Protocol):
    """What the loop needs of an agent backend: loopbot's own (``Agent``) or one that
    runs in the sandbox (``jobs.agents.claude_code.ClaudeCodeAgent``)."""

    model: str
    system: str
    last_model: str | None
    # The spend caps above the loop (jobs/spend.py): each call admitted and charged there.
    spend: precall.Gate | None

    def run_turn(self, messages: list[dict[str, Any]], prompt: str, limits: Limits) -> Outcome: ...


def add_user_text(messages: list[dict[str, Any]], text: str) -> None:
    """Append a user prompt, merged into a trailing user message (e.g. tool results)."""
    if messages and messages[-1]["role"] == "user":
        content = messages[-1]["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        content.append({"type": "text", "text": text})
        messages[-1]["content"] = content
    else:
        messages.append({"role": "user", "content": [{"type": "text", "text": text}]})


def with_attachments(messages: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> None:
    """The attachments' blocks at the start of the first message, unless it holds them."""
    if not blocks or not messages or messages[0]["role"] != "user":
        return
    content = messages[0]["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if not any(isinstance(b, dict) and b.get("type") in ("image", "document") for b in content):
        messages[0]["content"] = [*blocks, *content]


def strip_thinking(messages: list[dict[str, Any]]) -> int:
    """Remove thinking blocks from the assistant messages, in place; how many went. A
    message left with nothing says so in a text block (only a final one may be empty)."""
    dropped = 0
    for msg in messages:
        content = msg.get("content")
        if msg.get("role") != "assistant" or not isinstance(content, list):
            continue
        kept = [b for b in content if b.get("type") not in THINKING_BLOCKS]
        dropped += len(content) - len(kept)
        msg["content"] = kept or [{"type": "text", "text": "(thought without writing)"}]
    return dropped


def _stop_of(decision: Go | Stop) -> Stop | None:
    """None when the turn goes on, else the stop that ends it."""
    match decision:
        case Go():
            return None
        case (
            rules.Cancelled()
            | rules.Refused()
            | rules.ContextWindow()
            | rules.OutputLimit()
            | rules.Shutdown()
            | rules.StepCap()
            | rules.ToolBudget()
            | rules.DoomLoop()
            | rules.Stalled()
            | rules.BudgetExhausted()
            | rules.Finished()
            | rules.TextOnly()
            | rules.ResourceLimit()
        ) as stop:
            return stop
        case never:
            assert_never(never)


def _keep(
    messages: list[dict[str, Any]], blocks: list[dict[str, Any]], outcome: Outcome, tokens: int
) -> tuple[int, int]:
    """Store the reply in the conversation; returns the tokens the API counted for it
    (input and output) with the conversation's length just after it, for the budget."""
    messages.append({"role": "assistant", "content": blocks})
    texts = [b["text"] for b in blocks if b.get("type") == "text" and b.get("text")]
    if texts:
        outcome.text = "\n".join(texts)
    return tokens, len(messages)


def _explanation(resp: Any) -> str:
    """A refusal's ``stop_details.explanation`` (None in older SDKs and most replies)."""
    details = getattr(resp, "stop_details", None)
    return str(getattr(details, "explanation", None) or "")


def _ended(outcome: Outcome, stop: Stop) -> Outcome:
    outcome.end, outcome.detail = stop.end, stop.detail
    return outcome


def _not_run(call: dict[str, Any], stop: Stop) -> dict[str, Any]:
    """The answer to a tool call the turn ended before: every tool_use is answered so the
    stored conversation stays valid."""
    return {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "content": f"not run: the turn ended ({stop.end})",
        "is_error": True,
    }


class Agent:
    def __init__(
        self,
        client: anthropic.Anthropic,
        model: str,
        tools: ToolBox,
        *,
        verify: str,
        network: bool = False,
        protected: tuple[str, ...] = (),
        fallback_model: str | None = None,
        on_step: Callable[[int, str], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        draining: Callable[[], bool] = lambda: False,
        resources: Callable[[], str | None] = lambda: None,
        window: int = 200_000,
        window_of: Callable[[str], int] | None = None,
        threshold: float = context.THRESHOLD,
        params_for: Callable[[str], dict[str, Any]] = lambda model: {},
        max_tokens: int = MAX_TOKENS,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.model = model
        # The model's context window (the Models API's max_input_tokens) and the share of
        # it past which the conversation is shrunk before a call (bot/core/rules/loop/context.py).
        self.window = window
        self.window_of = window_of or (lambda model: window)  # the fallback model's too
        self._learned: dict[str, int] = {}  # windows the API named in "prompt is too long"
        self.threshold = threshold
        self.gauge = context.Gauge()
        self.params_for = params_for  # thinking and effort for a model (bot.core.models)
        self.max_tokens = max_tokens
        self.on_event = on_event or (lambda kind, data: None)
        # The model that last wrote to the conversation (its thinking blocks are tied to it);
        # the loop sets it from the record when it resumes a stored conversation.
        self.last_model: str | None = None
        self.fallback_model = fallback_model
        self.tools = tools
        self.system = SYSTEM.format(
            root=tools.root,
            verify=verify,
            network=(
                " with network access through an HTTP proxy (proxy variables are set)"
                if network
                else " without network"
            ),
            protected=(
                " Leave "
                + ", ".join(f"`{p}`" for p in protected)
                + " alone: loopbot never merges a change there on its own."
                if protected
                else ""
            ),
        )
        self.on_step = on_step or (lambda n, what: None)
        self.cancelled = cancelled
        self.draining = draining  # the worker is shutting down: hand over at the next step
        self.resources = resources  # what is over a resource limit after a tool call
        # The client's retries, made here instead of in the SDK (see run_turn).
        self.retries = int(getattr(client, "max_retries", 2))
        self.sleep = sleep
        self._worst: budget.Call | None = None  # the pending call's worst case
        # The approved issue's images and PDFs as content blocks (jobs/loop/attachments.py):
        # in the first message, and put back into it when a shrink folds it into a brief.
        self.attachments: list[dict[str, Any]] = []
        # Blocks for the next turn's prompt only (a writer's comment's images), then gone.
        self.pending: list[dict[str, Any]] = []
        self.spend: precall.Gate | None = None  # the loop sets it (jobs/spend.py)

    def _request(
        self,
        messages: list[dict[str, Any]],
        with_tools: bool,
        model: str,
        max_tokens: int = MAX_TOKENS,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "system": [
                {"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}
            ],
            "messages": with_cache_points(messages),
            **self.params_for(model),
        }
        if with_tools:
            kwargs["tools"] = TOOLS
        return kwargs

    def _switch_model(self, messages: list[dict[str, Any]], model: str) -> None:
        """Thinking blocks are tied to the model that wrote them: before another model is
        called on this conversation, they go (the API accepts a past turn without them)."""
        if self.last_model is not None and self.last_model != model:
            self._unsign(messages, model, self.last_model)
        self.last_model = model

    def _unsign(self, messages: list[dict[str, Any]], model: str, was: str) -> None:
        """Make the conversation one ``model`` may continue: no thinking blocks another
        model signed, and no tool loop another model began (the API would hold its last
        call to ``model``'s thinking rules), whose calls and results become plain text."""
        dropped = strip_thinking(messages)
        closed = context.close_tool_loop(messages)
        if dropped or closed:
            self.on_event(
                "thinking_dropped",
                {"model": model, "was": was, "blocks": dropped, "tool_loop_closed": closed},
            )

    def window_for(self, model: str) -> int:
        """``model``'s context window: the Models API's, or what the API said when it
        answered "prompt is too long" (smaller, and true)."""
        known = self.window if model == self.model else self.window_of(model)
        return min(known, self._learned.get(model, known))

    def _fixed_size(self, with_tools: bool, model: str) -> int:
        """Characters of a request without its messages (system, tools, parameters)."""
        return context.chars(self._request([], with_tools, model))

    def _shrink(
        self,
        messages: list[dict[str, Any]],
        fixed: int,
        reason: str,
        estimate: int,
        model: str,
    ) -> bool:
        """Shrink ``messages`` in place toward the target share of ``model``'s window; an
        event says what was done with the sizes before and after. False: nothing came off
        (the conversation is as small as shrinking makes it)."""
        window = self.window_for(model)
        target = int(window * context.TARGET)

        def size_of(candidate: list[dict[str, Any]]) -> int:
            return self.gauge.estimate(fixed + context.chars(candidate))

        before = len(messages)
        now = size_of(messages)  # measured as ``after`` is, so the two compare
        shrunk = context.shrink(messages, lambda candidate: size_of(candidate) <= target)
        after = size_of(shrunk.messages)
        if shrunk.level == "none" or after >= now:
            self.on_event("context_full", {"reason": reason, "tokens": estimate, "window": window})
            return False
        messages[:] = shrunk.messages
        with_attachments(messages, self.attachments)  # the brief is text: the files go back
        self.on_event(
            "context_shrunk",
            {
                "reason": reason,
                "level": shrunk.level,
                "tokens_before": estimate,
                "tokens_after": after,
                "messages_before": before,
                "messages_after": len(messages),
                "cleared": shrunk.cleared,
                "summarised": shrunk.summarised,
                "clipped": shrunk.clipped,
                "window": window,
            },
        )
        return True

    def _over_budget(
        self,
        request: dict[str, Any],
        limits: Limits,
        outcome: Outcome,
        seconds: float,
        counted: tuple[int, int] | None,
        messages: list[dict[str, Any]],
    ) -> str | None:
        """Why ``request`` may not be sent (the budget it could cross), or None.

        ``counted``: the last response's tokens as the API counted them (input, cache and
        output) and the conversation's length just after it; the request's input is at
        most that plus the bytes added since.
        """
        bound = (
            budget.grown_bound(counted[0], messages[counted[1] :]) if counted is not None else None
        )
        if limits.budget is None:
            model, max_tokens = str(request["model"]), int(request["max_tokens"])
            self._worst = budget.worst_call(
                model, bound if bound is not None else budget.input_bound(request), max_tokens
            )
            return self._over_cap(self._worst)
        spent = limits.spent.plus(usd=outcome.cost, tokens=outcome.tokens, seconds=seconds)
        out, self._worst = precall.check_worst(self.client, request, limits.budget, spent, bound)
        if out is not None:
            return out.detail
        return self._over_cap(self._worst)

    def _over_cap(self, worst: budget.Call) -> str | None:
        """Why a spend cap above the loop refuses the call (its words), or None: its
        worst case is reserved under them (``jobs.spend``)."""
        if self.spend is None:
            return None
        try:
            self.spend.admit(worst)
        except precall.OverBudget as exc:
            return str(exc)
        return None

    def _used(self, outcome: Outcome, model: str, used: Usage) -> None:
        """A call's usage, in the turn's tally and on the spend caps' counters."""
        outcome.usage.append((model, used))
        if self.spend is not None:
            self.spend.charge(model, used)

    def _charge_lost_call(self, outcome: Outcome, model: str, max_tokens: int) -> None:
        """A call that timed out or lost its connection may have reached the API and been
        billed in full: it is charged at the worst case the pre-check allowed it, so no
        number of such calls can spend past the budget unseen."""
        if self._worst is not None:
            self._used(outcome, model, precall.worst_usage(self._worst, max_tokens))

    def run_turn(self, messages: list[dict[str, Any]], prompt: str, limits: Limits) -> Outcome:
        """Run one turn on ``messages`` (mutated in place) starting with ``prompt``."""
        first = not messages
        add_user_text(messages, prompt)
        if first:
            with_attachments(messages, self.attachments)
        if self.pending:
            messages[-1]["content"].extend(self.pending)
            self.pending = []
        outcome = Outcome(end="finished")
        recent: tuple[str, ...] = ()  # the latest tool calls' fingerprints, for doom loops
        stalls = 0
        busy = 0  # refusals in a row (429, 5xx, 529) retried for this request
        model = self.model
        with_tools = not rules.text_only(limits.step_cap)
        started = time.monotonic()
        counted: tuple[int, int] | None = None
        max_tokens = self.max_tokens  # raised once to retry a reply cut mid-tool-call
        too_long = 0  # "prompt is too long" answers in a row
        resent_unsigned = False  # a conversation sent again without its thinking blocks
        while True:
            stop = _stop_of(
                rules.before_call(
                    cancelled=self.cancelled(),
                    draining=self.draining(),
                    steps=outcome.steps,
                    step_cap=limits.step_cap,
                )
            )
            if stop is not None:
                return _ended(outcome, stop)
            self._switch_model(messages, model)
            fixed = self._fixed_size(with_tools, model)
            size = fixed + context.chars(messages)
            estimate = self.gauge.estimate(size)
            if context.over(estimate, self.window_for(model), self.threshold) and self._shrink(
                messages, fixed, "threshold", estimate, model
            ):
                counted = None  # the conversation was rewritten: the budget's bound restarts
                size = fixed + context.chars(messages)
            request = self._request(messages, with_tools, model, max_tokens)
            why = self._over_budget(
                request, limits, outcome, time.monotonic() - started, counted, messages
            )
            if why is not None:
                return _ended(outcome, rules.BudgetExhausted(why))
            called = time.monotonic()
            try:
                # No retries in the SDK: a timed-out attempt may have been billed, and each
                # attempt must pass the budget's pre-check first (retried here, below).
                resp = self.client.with_options(
                    timeout=limits.stall_timeout, max_retries=0
                ).messages.create(**request)
            except (anthropic.APITimeoutError, anthropic.APIConnectionError) as exc:
                outcome.model_seconds += time.monotonic() - called
                self._charge_lost_call(outcome, model, max_tokens)
                stalls += 1
                self.on_step(outcome.steps, f"stall {stalls}: {type(exc).__name__}")
                if (stop := _stop_of(rules.after_stall(stalls))) is not None:
                    return _ended(outcome, stop)
                continue  # retry the same request, once the pre-check allows it
            except (anthropic.RateLimitError, anthropic.InternalServerError) as exc:
                # Refused, not billed: retried as the SDK would (retry-after, else backoff),
                # then the fallback model for a server error, as before.
                outcome.model_seconds += time.monotonic() - called
                if busy < self.retries and precall.retryable(exc):
                    busy += 1
                    self.sleep(precall.retry_delay(exc.response.headers, busy))
                    continue
                busy = 0
                if (
                    isinstance(exc, anthropic.InternalServerError)
                    and self.fallback_model
                    and model != self.fallback_model
                ):
                    model = self.fallback_model
                    continue
                raise
            except anthropic.BadRequestError as exc:
                outcome.model_seconds += time.monotonic() - called
                found = context.too_long(str(exc))
                if found is not None:
                    # Never fatal: the API said how big the prompt is and what fits, so the
                    # gauge learns the real ratio and the conversation shrinks below it.
                    too_long += 1
                    self.gauge = self.gauge.measured(found[0], size)
                    self._learned[model] = min(found[1], self._learned.get(model, found[1]))
                    if too_long <= 2 and self._shrink(
                        messages, fixed, "prompt_too_long", found[0], model
                    ):
                        counted = None
                        continue
                    return _ended(outcome, rules.ContextWindow())
                if "signature" in str(exc) and not resent_unsigned:
                    # Thinking blocks another model (or an older deployment) wrote: the
                    # API rejects them; a past turn is valid without them.
                    resent_unsigned = True
                    before = context.chars(messages)
                    self._unsign(messages, model, "unknown")
                    if context.chars(messages) != before:
                        continue
                raise
            outcome.model_seconds += time.monotonic() - called
            stalls = busy = 0
            too_long = 0 if resp.stop_reason != "model_context_window_exceeded" else too_long
            outcome.steps += 1  # every call is a step, dropped replies too: retries are bounded
            used = usage_from(resp.model or model, resp.usage)
            self._used(outcome, resp.model or model, used)  # charged, kept or not
            read = used.input_tokens + used.cache_read_tokens + used.cache_write_tokens
            self.gauge = self.gauge.measured(read, size)  # the tokenizer's real ratio
            counted = (read, len(messages))  # until the reply is kept (with its output)
            blocks = [b.model_dump(exclude_none=True) for b in resp.content]
            calls = [b for b in blocks if b.get("type") == "tool_use"]
            decision = rules.after_response(
                step_cap=limits.step_cap,
                stop_reason=resp.stop_reason,
                tool_calls=len(calls),
                cut_in_call=bool(blocks) and blocks[-1].get("type") == "tool_use",
                max_tokens=max_tokens,
                retried=max_tokens != self.max_tokens,
                explanation=_explanation(resp),
            )
            max_tokens = self.max_tokens  # back to the usual limit once a reply is kept
            match decision:
                case rules.Retry(max_tokens=bigger):
                    # The cut call's input is partial: never run or store it; ask again.
                    self.on_step(outcome.steps, f"cut mid-tool-call: retry at {bigger}")
                    max_tokens = bigger
                    continue
                case rules.ContextWindow() as stop:
                    # The reply filled the window and is cut: drop it, shrink, ask again
                    # (twice at most in a row, as for "prompt is too long").
                    too_long += 1
                    if too_long <= 2 and self._shrink(
                        messages, fixed, "window_exceeded", read + used.output_tokens, model
                    ):
                        counted = None
                        continue
                    return _ended(outcome, stop)
                case rules.Refused() | rules.OutputLimit() as stop:
                    return _ended(outcome, stop)  # the reply is not kept
                case rules.Resume():
                    # pause_turn: the reply sent back as it is lets it carry on; an empty one
                    # has nothing to send back (the API refuses an empty message inside a
                    # conversation), so the same request goes again.
                    if blocks:
                        counted = _keep(messages, blocks, outcome, read + used.output_tokens)
                    continue
                case rules.Continue(prompt=prompt):
                    counted = _keep(messages, blocks, outcome, read + used.output_tokens)
                    add_user_text(messages, prompt)
                    continue
                case rules.TextOnly() | rules.Finished() as stop:
                    _keep(messages, blocks, outcome, read + used.output_tokens)
                    return _ended(outcome, stop)
                case Go():
                    counted = _keep(messages, blocks, outcome, read + used.output_tokens)
                case never:
                    assert_never(never)
            results, recent, stop = self._run_tools(calls, recent, limits, outcome)
            messages.append({"role": "user", "content": results})
            if stop is not None:
                return _ended(outcome, stop)

    def _run_tools(
        self,
        calls: list[dict[str, Any]],
        recent: tuple[str, ...],
        limits: Limits,
        outcome: Outcome,
    ) -> tuple[list[dict[str, Any]], tuple[str, ...], Stop | None]:
        """Run one step's tool calls, in order, until one of them ends the turn.

        Returns their results (one per call, those after the end answered "not run"),
        the doom-loop window with every call asked for, and the stop, if any.
        """
        results: list[dict[str, Any]] = []
        stop: Stop | None = None
        for call in calls:
            args = call.get("input") or {}
            recent = rules.remember(recent, rules.fingerprint(call["name"], args))
            if stop is None:
                stop = _stop_of(
                    rules.before_tool(
                        cancelled=self.cancelled(),
                        draining=self.draining(),
                        tool_calls=outcome.tool_calls,
                        tool_budget=limits.tool_budget,
                        recent=recent,
                        tool=call["name"],
                    )
                )
            if stop is not None:
                results.append(_not_run(call, stop))
                continue
            ran = time.monotonic()
            text, is_error = self.tools.run(call["name"], args)
            outcome.tool_seconds += time.monotonic() - ran
            outcome.tool_calls += 1
            self.on_step(outcome.steps, call["name"])
            if (problem := self.resources()) is not None:
                text, is_error = f"{text}\n[loopbot: {problem}; the turn ends here]", True
                stop = rules.ResourceLimit(problem)
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": call["id"],
                    "content": text,
                    "is_error": is_error,
                }
            )
        return results, recent, stop
