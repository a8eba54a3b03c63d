"""A local server for Anthropic's Messages API that plays scripted responses.

``POST /v1/messages`` answers with the next item of the script: a message (text and
tool-use blocks, a stop reason, usage with cache fields), an HTTP error such as 429 or
529 with its headers, or a delay (for stall tests). Or a ``responder`` callable decides
from the request. Every request is recorded, body and headers, for assertions.

Every stop reason the real API gives can be scripted (``cut_tool``, ``cut_text``,
``paused``, ``refused``, ``context_full``), in the shapes the SDK parses. And the server is
at least as strict as the real API about what it is sent (``invalid``): a conversation
with a tool call left unanswered, or a tool result that answers no call, is a 400
``invalid_request_error`` in the API's words, before any script item is used, so a
broken conversation the agent stored fails a test instead of passing it.

It behaves like the real API where a harness can get the API wrong: a catalogue of
models (``ModelSpec``; ``GET /v1/models``, unknown and retired ones a 404), each with its
context window (``prompt is too long``, checked before the script is used), output limit,
thinking types and effort levels; one deterministic token count (``count_tokens``) for the
window, ``/v1/messages/count_tokens`` and usage; usage computed unless a ``Reply`` sets it,
split by a prompt-cache simulation (``PromptCache``: breakpoints, the 20-block lookback,
the minimum cacheable prefix, TTLs, writes split by TTL as the API bills them), and what
the API would bill for it (``AnthropicServer.billed_usd``); and thinking blocks signed
for their text and model, which must come back unchanged, to the same model, before the
message's other blocks.
Where unsure, it is harsher than the API, never kinder.

loopbot's readiness triage call (known by its schema, ``is_triage``) has a script and a
record of its own (``play_triage``, ``triage_requests``), validated like any request: the
scripts tests write for the agent and the critic stay theirs, and an unscripted triage
is answered "ready".

Layout: ``server`` (``AnthropicServer``: the app, its routes, the test's hands),
``replies`` (``Reply``, ``Fail`` and the helpers that script them), ``validate`` (the
request's 400s), ``models`` (the catalogue), ``tokens`` (the token count), ``thinking``
(signatures and the thinking rules), ``cache`` (``PromptCache`` and breakpoints),
``billing`` (an answer's bill), ``triage`` (the readiness triage's own script), ``sse``
(streaming) and ``wire`` (``Json``, content blocks, the error answer).
"""

from bot.standins.anthropic.cache import MAX_CACHE_POINTS
from bot.standins.anthropic.models import MAX_OUTPUT_TOKENS, ModelSpec
from bot.standins.anthropic.replies import (
    Fail,
    Item,
    Reading,
    Reply,
    Responder,
    bash,
    cc_bash,
    cc_edit,
    cc_write,
    context_full,
    cut_text,
    cut_tool,
    oc_bash,
    oc_edit,
    oc_write,
    paused,
    refused,
    replace,
    structured,
    text,
    tool,
    write_file,
)
from bot.standins.anthropic.server import AnthropicServer
from bot.standins.anthropic.thinking import thinking_invalid, thinking_signature
from bot.standins.anthropic.tokens import count_tokens
from bot.standins.anthropic.triage import triage_answer
from bot.standins.anthropic.validate import format_invalid, invalid
from bot.standins.anthropic.wire import Json

__all__ = [
    "MAX_CACHE_POINTS",
    "MAX_OUTPUT_TOKENS",
    "AnthropicServer",
    "Fail",
    "Item",
    "Json",
    "ModelSpec",
    "Reading",
    "Reply",
    "Responder",
    "bash",
    "cc_bash",
    "cc_edit",
    "cc_write",
    "context_full",
    "count_tokens",
    "cut_text",
    "cut_tool",
    "format_invalid",
    "invalid",
    "oc_bash",
    "oc_edit",
    "oc_write",
    "paused",
    "refused",
    "replace",
    "structured",
    "text",
    "thinking_invalid",
    "thinking_signature",
    "tool",
    "triage_answer",
    "write_file",
]
