"""The local Anthropic server against the real anthropic SDK, where it must behave like the
real API: the model catalogue, the context window, the token count, prompt caching and
thinking. Each rejection is checked in the API's words, and before the script is used."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer, ModelSpec, Reply
from bot.standins.anthropic.billing import billed_usd

Json = dict[str, Any]
LONG = "The quick brown fox jumps over the lazy dog. " * 200  # ~9,000 chars: ~2,250 tokens
BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}


@pytest.fixture
def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-local-test", base_url=model.url, max_retries=0)


def user(s: str, *, cached: bool = False) -> Json:
    block: Json = {"type": "text", "text": s}
    if cached:
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": "user", "content": [block]}


def ask(client: anthropic.Anthropic, **kw: Any) -> anthropic.types.Message:
    kw.setdefault("model", "claude-test")
    kw.setdefault("max_tokens", 2000)
    message: anthropic.types.Message = client.messages.create(**kw)
    return message


def rejected(client: anthropic.Anthropic, **kw: Any) -> str:
    """The 400's message for a request the server must refuse."""
    with pytest.raises(anthropic.BadRequestError) as err:
        ask(client, **kw)
    body = err.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def sent_back(message: anthropic.types.Message) -> list[Json]:
    return [b.model_dump(exclude_none=True) for b in message.content]


# -- the context window and the token count ----------------------------------------------


def test_a_prompt_over_the_window_is_refused_in_the_apis_words_and_the_script_kept(
    model: AnthropicServer, client: anthropic.Anthropic
) -> None:
    model.window_override = 1000
    messages = [user("x" * 6000)]
    counted = client.messages.count_tokens(model="claude-test", messages=messages).input_tokens  # type: ignore[arg-type]
    assert counted > 1000
    model.play(m.text("never sent"))
    assert rejected(client, messages=messages) == (
        f"prompt is too long: {counted} tokens > 1000 maximum"
    )
    assert len(model.script) == 1  # the script item is still there
    assert model.input_tokens == [counted]  # the window check counted what count_tokens did
    # Just under the window it is answered, with the item the refusal left.
    fits = [user("x" * 3000)]
    assert ask(client, messages=fits).content[0].text == "never sent"  # type: ignore[union-attr]
    assert model.input_tokens[-1] <= 1000 and not model.script


def test_a_models_own_window_applies_and_the_models_api_reports_it(
    model: AnthropicServer, client: anthropic.Anthropic
) -> None:
    model.add_model(ModelSpec("claude-small", "Small", window=500, max_output=1000))
    assert client.models.retrieve("claude-small").max_input_tokens == 500
    model.play(m.text("a"), m.text("b"))
    assert "tokens > 500 maximum" in rejected(
        client, model="claude-small", max_tokens=100, messages=[user("y" * 2400)]
    )
    msg = ask(client, model="claude-test", max_tokens=100, messages=[user("y" * 2400)])
    assert msg.model == "claude-test"  # the same prompt fits claude-test's 200,000
    # The model's output limit too, in the existing wording.
    limit = rejected(client, model="claude-small", max_tokens=1001, messages=[user("hi")])
    assert "max_tokens: 1001 > 1000, which is the maximum allowed number of output tokens" in limit
    model.window_override = 100  # a test's override shrinks every model's window
    assert client.models.retrieve("claude-test").max_input_tokens == 100


def test_the_count_is_monotonic_and_never_more_than_a_quarter_of_the_json() -> None:
    base: Json = {
        "model": "claude-test",
        "system": [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}],
        "tools": [BASH],
        "messages": [
            user("Fix the bug in calc.py"),
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "calc.py"}
                ],
            },
        ],
    }
    n = m.count_tokens(base)
    assert n == m.count_tokens(json.loads(json.dumps(base)))  # deterministic
    # What the budget's cheap bounds rely on: never more than the JSON's quarter.
    assert n <= len(json.dumps(base)) // 4
    grown = json.loads(json.dumps(base))
    grown["messages"][2]["content"][0]["content"] += " test_calc.py"
    more_text = m.count_tokens(grown)
    grown["messages"].append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    assert n < more_text < m.count_tokens(grown)
    # The cache_control marker is not content.
    plain = json.loads(json.dumps(base))
    del plain["system"][0]["cache_control"]
    assert m.count_tokens(plain) == n


# -- the model catalogue -------------------------------------------------------------------


def test_models_retrieve_list_and_404(client: anthropic.Anthropic, model: AnthropicServer) -> None:
    sonnet = client.models.retrieve("claude-sonnet-5-5")
    assert (sonnet.max_input_tokens, sonnet.max_tokens, sonnet.lifecycle) == (
        1_000_000,
        128_000,
        "active",
    )
    caps = sonnet.capabilities
    assert caps is not None and caps.effort.supported and caps.effort.max.supported
    assert caps.effort.xhigh is not None and caps.effort.xhigh.supported
    assert caps.thinking.types.adaptive.supported and not caps.thinking.types.enabled.supported
    haiku = client.models.retrieve("claude-haiku-4-5")
    assert haiku.capabilities is not None and not haiku.capabilities.effort.supported
    assert haiku.capabilities.thinking.types.enabled.supported
    assert not haiku.capabilities.thinking.types.adaptive.supported
    old = client.models.retrieve("claude-sonnet-4-5")
    assert old.lifecycle == "deprecated" and old.retires_at is not None
    assert old.retires_at.isoformat() == "2026-11-30T00:00:00+00:00"
    assert client.models.retrieve("claude-3-5-haiku-20241022").lifecycle == "retired"
    with pytest.raises(anthropic.NotFoundError) as err:
        client.models.retrieve("claude-nonesuch")
    assert err.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model: claude-nonesuch"},
    }
    # Two to a page: the SDK follows has_more/last_id through every page.
    first = client.models.list(limit=2)
    assert len(first.data) == 2 and first.has_more and first.last_id == first.data[-1].id
    assert sorted(x.id for x in first) == sorted(model.models)


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")  # the SDK's
def test_an_unknown_or_retired_model_is_a_404_on_messages(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.play(m.text("never sent"))
    for name in ("claude-3-5-haiku-20241022", "claude-nonesuch"):
        with pytest.raises(anthropic.NotFoundError) as err:
            ask(client, model=name, messages=[user("hi")])
        assert err.value.body == {
            "type": "error",
            "error": {"type": "not_found_error", "message": f"model: {name}"},
        }
    assert len(model.script) == 1
    # A deprecated model still answers.
    assert (
        ask(client, model="claude-sonnet-4-5", messages=[user("hi")]).model == "claude-sonnet-4-5"
    )


# -- usage and the prompt cache ------------------------------------------------------------


def split(msg: anthropic.types.Message) -> tuple[int, int, int]:
    u = msg.usage
    return u.input_tokens, u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0


def cached_system(text: str = LONG) -> list[Json]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def test_a_shared_prefix_is_read_from_the_cache_and_the_split_sums_to_the_count(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.responder = lambda body: m.text("ok")
    one = ask(client, system=cached_system(), messages=[user("first question", cached=True)])
    fresh, read, written = split(one)
    # The breakpoint is on the last block: the whole prompt is written, none left over.
    assert (fresh, read, written) == (0, 0, model.input_tokens[0])
    # The same system and first turn, one more exchange: the earlier prefix is read. The
    # first turn now as a string, which the API reads as the same single text block.
    conversation = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "ok"},
    ]
    two = ask(client, system=cached_system(), messages=[*conversation, user("second", cached=True)])
    fresh, read, written = split(two)
    assert read == model.input_tokens[0]  # everything up to the first request's breakpoint
    assert written > 0 and fresh + read + written == model.input_tokens[1]
    # An explicit usage on a Reply is reported as it is.
    model.play(
        Reply([{"type": "text", "text": "x"}], usage={"input_tokens": 7, "output_tokens": 3})
    )
    three = ask(client, system=cached_system(), messages=[user("first question")])
    assert (three.usage.input_tokens, three.usage.output_tokens) == (7, 3)
    assert split(three)[1:] == (0, 0)


def test_top_level_cache_control_caches_up_to_the_last_block(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.responder = lambda body: m.text("ok")
    kw: Any = {"cache_control": {"type": "ephemeral"}, "system": LONG}
    first = ask(client, messages=[user("q")], **kw)
    assert split(first) == (0, 0, model.input_tokens[0])
    turn = [user("q"), {"role": "assistant", "content": "ok"}, user("and then?")]
    again = ask(client, messages=turn, **kw)
    assert split(again)[1] == model.input_tokens[0]
    # It takes one of the four places.
    system = [
        {"type": "text", "text": f"{i}", "cache_control": {"type": "ephemeral"}} for i in "abcd"
    ]
    assert rejected(
        client, messages=[user("q")], cache_control={"type": "ephemeral"}, system=system
    ) == ("A maximum of 4 blocks with cache_control may be provided. Found 5.")


def test_a_prefix_changed_early_reads_nothing(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.responder = lambda body: m.text("ok")
    ask(client, system=cached_system(), messages=[user("q", cached=True)])
    changed = ask(client, system=cached_system("!" + LONG[1:]), messages=[user("q", cached=True)])
    assert split(changed)[1] == 0 and split(changed)[2] > 0
    # Another model has a cache of its own: the same prompt is written again.
    other = ask(
        client, model="claude-sonnet-5-5", system=cached_system(), messages=[user("q", cached=True)]
    )
    assert split(other)[1] == 0
    # Thinking turned on changes the cached messages, not the system before them.
    thinking = ask(
        client,
        system=cached_system(),
        thinking={"type": "adaptive"},
        messages=[user("q", cached=True)],
    )
    assert 0 < split(thinking)[1] < model.input_tokens[-1]


def test_a_short_prefix_is_not_cached(client: anthropic.Anthropic, model: AnthropicServer) -> None:
    model.responder = lambda body: m.text("ok")
    short = cached_system("Be brief.")
    for _ in range(2):
        msg = ask(client, system=short, messages=[user("q", cached=True)])
        assert split(msg)[1:] == (0, 0)  # under claude-test's 1,024 tokens
    # Haiku 4.5 needs 4,096: LONG (~2,250 tokens) is cached for claude-test, not for it.
    for _ in range(2):
        msg = ask(client, model="claude-haiku-4-5", system=cached_system(), messages=[user("q")])
        assert split(msg)[1:] == (0, 0)


def test_more_than_four_breakpoints_is_a_400(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.play(m.text("never sent"))
    system = [
        {"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}
        for i in range(4)
    ]
    why = rejected(client, system=system, messages=[user("q", cached=True)])
    assert why == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    assert len(model.script) == 1


def test_the_lookback_reaches_20_blocks_before_a_breakpoint_and_no_further(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.responder = lambda body: m.text("ok")
    first = [user(LONG, cached=True)]

    def grown(blocks: int) -> list[Json]:
        more: list[Json] = [{"type": "text", "text": f"note {i}"} for i in range(blocks)]
        more[-1]["cache_control"] = {"type": "ephemeral"}
        return [
            user(LONG),
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": more},
        ]

    ask(client, messages=first)
    # 20 new blocks after the old breakpoint: it is the 20th block before the new one.
    assert split(ask(client, messages=grown(19)))[1] > 0
    model.cache.clear()
    ask(client, messages=first)
    assert split(ask(client, messages=grown(20)))[1] == 0  # one further: missed


def test_a_cache_entry_expires_five_minutes_after_its_last_use(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    now = [1000.0]
    model.cache.clock = lambda: now[0]
    model.responder = lambda body: m.text("ok")
    kw: Any = {"system": cached_system(), "messages": [user("q")]}
    ask(client, **kw)
    now[0] += 299
    assert split(ask(client, **kw))[1] > 0  # read: and so refreshed
    now[0] += 299
    assert split(ask(client, **kw))[1] > 0
    now[0] += 301
    assert split(ask(client, **kw))[1] == 0


# -- thinking ----------------------------------------------------------------------------


def tool_loop(reply: list[Json], call_id: str) -> list[Json]:
    return [
        user("fix it"),
        {"role": "assistant", "content": reply},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "calc.py"}],
        },
    ]


def test_a_thinking_block_comes_signed_and_must_come_back_unchanged(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.play(m.bash("ls", thinking="I should list the files first."))
    first = ask(client, thinking={"type": "adaptive"}, tools=[BASH], messages=[user("fix it")])
    thought = first.content[0]
    assert thought.type == "thinking" and thought.thinking == "I should list the files first."
    assert thought.signature == m.thinking_signature("claude-test", thought.thinking)
    call = first.content[-1]
    assert call.type == "tool_use"
    back = sent_back(first)
    model.responder = lambda body: m.text("done")
    kw: Any = {"thinking": {"type": "adaptive"}, "tools": [BASH]}
    assert ask(client, messages=tool_loop(back, call.id), **kw).content[-1].type == "text"
    # Edited, sent to another model, or after the call: each a 400, the script unused.
    edited = [{**back[0], "thinking": "I should delete everything."}, *back[1:]]
    assert rejected(client, messages=tool_loop(edited, call.id), **kw) == (
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    )
    assert (
        rejected(client, model="claude-sonnet-5-5", messages=tool_loop(back, call.id), **kw)
        == "messages.1.content.0: Invalid `signature` in `thinking` block"
    )
    moved = [*back[1:], back[0]]
    assert "must come before" in rejected(client, messages=tool_loop(moved, call.id), **kw)
    # Dropped mid tool loop while thinking is on: the API's requirement.
    dropped = rejected(client, messages=tool_loop(back[1:], call.id), **kw)
    assert dropped.startswith(
        "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`"
    )
    # Without thinking in the request the blocks are still checked, and no thinking comes back.
    assert "Invalid `signature`" in rejected(
        client, tools=[BASH], messages=tool_loop(edited, call.id)
    )
    plain = ask(client, tools=[BASH], messages=tool_loop(back, call.id))
    assert [b.type for b in plain.content] == ["text"]


def test_thinking_is_billed_as_output(client: anthropic.Anthropic, model: AnthropicServer) -> None:
    model.play(m.text("ok"), m.text("ok", thinking="hmm " * 250))
    plain = ask(client, messages=[user("q")])
    thought = ask(client, thinking={"type": "adaptive"}, messages=[user("q")])
    assert thought.usage.output_tokens - plain.usage.output_tokens >= 250


def test_redacted_thinking_must_be_one_the_server_gave(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.play(m.bash("ls", redacted=True))
    first = ask(client, thinking={"type": "adaptive"}, tools=[BASH], messages=[user("fix it")])
    assert [b.type for b in first.content] == ["thinking", "redacted_thinking", "tool_use"]
    back = sent_back(first)
    call_id = back[-1]["id"]
    model.responder = lambda body: m.text("done")
    kw: Any = {"thinking": {"type": "adaptive"}, "tools": [BASH]}
    assert ask(client, messages=tool_loop(back, call_id), **kw).content[-1].type == "text"
    forged = [back[0], {"type": "redacted_thinking", "data": "c29tZXRoaW5n"}, back[2]]
    assert rejected(client, messages=tool_loop(forged, call_id), **kw) == (
        "messages.1.content.1: Invalid `data` in `redacted_thinking` block"
    )


def test_thinking_and_effort_must_be_ones_the_model_takes(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    model.play(m.text("never sent"))
    q = [user("q")]
    assert rejected(client, thinking={"type": "enabled", "budget_tokens": 1024}, messages=q) == (
        '"thinking.type.enabled" is not supported for this model. Use "thinking.type.adaptive" '
        'and "output_config.effort" to control thinking behavior.'
    )
    assert rejected(
        client, model="claude-haiku-4-5", thinking={"type": "adaptive"}, messages=q
    ) == ("adaptive thinking is not supported on this model")
    assert rejected(client, output_config={"effort": "max"}, messages=q) == (
        "This model does not support effort level 'max'. Supported levels: high, low, medium."
    )
    assert (
        rejected(client, model="claude-haiku-4-5", output_config={"effort": "low"}, messages=q)
        == "This model does not support the effort parameter."
    )
    haiku: Any = {"model": "claude-haiku-4-5", "messages": q}
    assert "greater than or equal to 1024" in rejected(
        client, thinking={"type": "enabled", "budget_tokens": 1000}, **haiku
    )
    assert "`max_tokens` must be greater than `thinking.budget_tokens`" in rejected(
        client, max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}, **haiku
    )
    assert len(model.script) == 1  # none of these used it
    # What each model does take is answered, the thinking signed for that model.
    xhigh = ask(client, model="claude-sonnet-5-5", output_config={"effort": "xhigh"}, messages=q)
    assert xhigh.content[0].type == "text"
    model.play(m.text("ok"))
    budget = ask(client, thinking={"type": "enabled", "budget_tokens": 1024}, **haiku)
    first = budget.content[0]
    assert first.type == "thinking"
    assert first.signature == m.thinking_signature("claude-haiku-4-5", first.thinking)


def test_the_count_tokens_endpoint_checks_the_model(model: AnthropicServer) -> None:
    url = f"{model.url}/v1/messages/count_tokens"
    headers = {"x-api-key": "k"}
    body = {"model": "claude-nonesuch", "messages": [user("hi")]}
    assert httpx.post(url, json=body, headers=headers).status_code == 404
    assert httpx.post(url, json=body).status_code == 401
    ok = httpx.post(url, json={**body, "model": "claude-test"}, headers=headers)
    assert ok.json() == {"input_tokens": m.count_tokens({**body, "model": "claude-test"})}
    # It holds a request to the same rules as the messages endpoint, max_tokens apart.
    budget = {"type": "enabled", "budget_tokens": 2048}
    haiku = {**body, "model": "claude-haiku-4-5", "thinking": budget}
    assert httpx.post(url, json=haiku, headers=headers).status_code == 200
    wrong = {**haiku, "model": "claude-test"}  # adaptive only
    assert httpx.post(url, json=wrong, headers=headers).status_code == 400


def test_mixed_ttls_split_the_writes_as_the_api_bills_them(
    client: anthropic.Anthropic, model: AnthropicServer
) -> None:
    """A 1-hour breakpoint before a 5-minute one: the prefix up to the 1-hour one is a
    1-hour write, the rest up to the last breakpoint a 5-minute one (usage's
    ``cache_creation``), and the bill prices each at its rate (2x and 1.25x input). A
    1-hour breakpoint after a 5-minute one is refused, as the API refuses it."""
    model.responder = lambda body: m.text("ok")
    long_ttl = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    first = ask(client, system=long_ttl, messages=[user(LONG + "?", cached=True)])
    created = first.usage.cache_creation
    assert created is not None
    hour, five = created.ephemeral_1h_input_tokens, created.ephemeral_5m_input_tokens
    assert hour > 2000 and five > 2000
    assert hour + five == first.usage.cache_creation_input_tokens
    # Read back next time up to the last breakpoint; a new tail is a 5-minute write only.
    again = ask(
        client,
        system=long_ttl,
        messages=[
            user(LONG + "?"),
            {"role": "assistant", "content": "ok"},
            user("more " * 1000, cached=True),
        ],
    )
    assert again.usage.cache_creation is not None
    assert again.usage.cache_creation.ephemeral_1h_input_tokens == 0
    assert again.usage.cache_read_input_tokens == hour + five
    # claude-test is unlisted: priced at the table's highest, $10 input and $50 output.
    u = first.usage
    expected = (u.input_tokens * 10 + hour * 10 * 2 + five * 10 * 1.25 + u.output_tokens * 50) / 1e6
    assert abs(billed_usd("claude-test", model.responses[0]["usage"]) - expected) < 1e-12
    five_first = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    assert "must not come after" in rejected(
        client,
        system=five_first,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "q",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
            }
        ],
    )
