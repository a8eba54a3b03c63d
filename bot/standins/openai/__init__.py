"""A local server for OpenAI's Responses API that plays scripted responses.

Tests point the Codex CLI (``@openai/codex`` 0.169.0) and loopbot's model gateway at it
(``OPENAI_BASE_URL=<url>/v1``) in place of api.openai.com. ``POST /v1/responses`` answers
with the next item of the script: a response (``Reply``: messages, function and custom
tool calls, a status, usage), an HTTP error such as a 429 with its headers (``Fail``, or
a ``response.failed`` event mid-stream), after an optional delay. Or a ``responder``
callable decides from the request. Every request is recorded, body and headers, and every
response answered, for assertions. Answers stream (``stream: true``) as the API's
server-sent events, in the API's order, or come whole.

The server is at least as strict as the real API about what it is sent, and where unsure
harsher, never kinder: every check below is a 400 in the API's error shape
(``{"error": {"message", "type", "param", "code"}}``) BEFORE any script item is used, so
a request the real API would refuse fails a test instead of passing it.

* Fields: an unknown one is ``unknown_parameter``; each known one has its type and values
  checked (``max_output_tokens`` an integer from 16 to the model's output limit,
  ``reasoning.effort`` one of the model's levels, ``stream`` a boolean, ``temperature`` and
  ``top_p`` refused by reasoning models, ``include: ["reasoning.encrypted_content"]``
  only with ``store: false``; ``store`` defaults to true, as the API's does).
* The model: a catalogue (``ModelSpec``, ``GET /v1/models``); an unknown id is
  ``model_not_found``. Its ``window`` is the most input tokens a request may hold, by one
  deterministic count (``count_tokens``) used everywhere: over it is
  ``context_length_exceeded`` (unless ``truncation: "auto"``, which drops the oldest
  items instead). ``POST /v1/responses/input_tokens`` checks the same (its own, shorter
  list of fields) but answers the count over the window too: that is how a client learns.
* The input: a string or a list of known items, each with its required fields and no
  unknown ones; message roles and content part types as the API takes them; a consistent
  conversation (every tool output answers an earlier call of its kind, every call is
  answered unless it is the very last item, call ids unique); ``reasoning`` items given
  back must carry the ``encrypted_content`` this server issued to the same model (an HMAC
  of the item id and the model), or name a stored one; a call or message this server
  issued with a reasoning item must come back after that reasoning item.
* Tools: every tool type known (``tools`` and ``additional_tools`` input items, whose
  ``namespace`` entries nest function and custom tools), function tools with a name and an
  object schema, strict schemas (the default) closed and fully required; ``tool_choice``
  naming an offered tool. The hosted (server-side) tool types seen are recorded in
  ``hosted_tools``.
* State: ``previous_response_id`` must name a response this server stored (``store`` not
  false) and its conversation is prepended to the input; ``item_reference`` must name a
  stored item; there are no conversations, stored prompts or background responses.

And the answer is checked against the request as a model would honour it: a scripted call
of a tool the request does not offer (or any call under ``tool_choice: "none"``, or more
than one under ``parallel_tool_calls: false``) is a 500 naming the script's mistake.

Usage is computed unless a ``Reply`` sets it, with a prompt cache (``PromptCache``), and a
reply longer than the request's ``max_output_tokens`` is cut there and answered
``incomplete``. For Codex in "code mode" (gpt-6.1-sol: one custom tool, ``exec``, that
runs JavaScript calling Codex's tools) ``cx_exec``, ``cx_shell`` and ``cx_patch`` script
its calls.

Layout: ``server`` (``OpenAIServer``: the app, its routes, stored responses, the test's
hands), ``replies`` (``Reply``, ``Fail`` and the helpers that script them), ``validate``
(the request's fields and the type checks), ``tools`` (``tools`` and ``tool_choice``),
``items`` (input items and the conversation), ``models`` (the catalogue), ``tokens``
(the token count), ``cache`` (``PromptCache``), ``reasoning`` (encrypted reasoning),
``response`` (the response object, cut at ``max_output_tokens``), ``sse`` (streaming)
and ``wire`` (``Json``, ids, the error shape, reading the body).
"""

from bot.standins.openai.models import ModelSpec, default_models
from bot.standins.openai.reasoning import reasoning_item_id
from bot.standins.openai.replies import (
    Fail,
    Item,
    Reply,
    call,
    custom,
    cut_text,
    cx_exec,
    cx_patch,
    cx_shell,
    text,
)
from bot.standins.openai.server import OpenAIServer
from bot.standins.openai.tokens import REASONING_TOKENS, count_tokens
from bot.standins.openai.validate import REQUEST_KEYS
from bot.standins.openai.wire import Json

__all__ = [
    "REASONING_TOKENS",
    "REQUEST_KEYS",
    "Fail",
    "Item",
    "Json",
    "ModelSpec",
    "OpenAIServer",
    "Reply",
    "call",
    "count_tokens",
    "custom",
    "cut_text",
    "cx_exec",
    "cx_patch",
    "cx_shell",
    "default_models",
    "reasoning_item_id",
    "text",
]
