"""The model gateway's OpenAI side (``jobs/gateway/responses.py``): what a Responses request
may carry, how an answer's usage is read and priced, and Codex's config
(``jobs/agents/codex.py``). Pure: no server is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.core import openai_models
from bot.core.models import ModelSpec
from bot.core.pricing import OPENAI_UNKNOWN, is_openai, price, usage_from, usage_from_responses
from bot.core.repo_config import McpServer
from bot.core.rules.loop import budget
from jobs.agents import codex
from jobs.gateway import messages
from jobs.gateway.responses import ResponsesGateway, _ResponsesUsage
from tests.helpers import DATA

SOL = openai_models.SPECS["gpt-6.1-sol"]


def make(spec: ModelSpec = SOL, cap: int = 16_000, effort: str | None = None) -> ResponsesGateway:
    return ResponsesGateway(
        None,  # type: ignore[arg-type]  # never forwards here
        policy=messages.Policy(spec.id, spec, cap, effort),
        run_dir=Path("/nonexistent"),
        guard=lambda request: budget.Call(tokens=1, usd=0.0),
        charge=lambda model, used: None,
    )


def body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-6.1-sol", "input": "hi", "stream": True, **extra}


def refused(gw: ResponsesGateway, request: Any) -> str:
    with pytest.raises(messages.Refused) as e:
        gw.shaped(request)
    assert e.value.status == 400
    return e.value.message


def test_another_model_or_a_body_that_is_no_object_is_refused() -> None:
    gw = make()
    assert "gpt-6.1-sol" in refused(gw, body(model="gpt-5.5-pro"))
    for bad in ([], "x", None, 3):
        refused(gw, bad)


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search"},
        {"type": "web_search_preview"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {"type": "mcp", "server_url": "https://example.com", "server_label": "x"},
        {"type": "computer_use_preview"},
        {"type": "tool_search"},
        {"type": "WEB_SEARCH"},
        "web_search",
    ],
)
def test_a_hosted_tool_is_refused_wherever_it_is_offered(tool: Any) -> None:
    gw = make()
    assert "only function, custom and local tools" in refused(gw, body(tools=[tool]))
    nested = {"type": "namespace", "name": "x", "tools": [{"type": "function", "name": "f"}, tool]}
    refused(gw, body(tools=[nested]))
    extra = {"type": "additional_tools", "role": "developer", "tools": [nested]}
    refused(gw, body(input=[extra, {"role": "user", "content": "hi"}]))


def test_codex_s_own_tools_pass() -> None:
    sample = json.loads((DATA / "codex_request.json").read_text())
    out = make().shaped(sample)
    assert out["input"] == sample["input"] and out["store"] is False


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "file id",
        ),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/y.png"}],
                    }
                ]
            },
            "image_url",
        ),
    ],
)
def test_stored_state_and_remote_inputs_are_refused(extra: dict[str, Any], why: str) -> None:
    assert why in refused(make(), body(**extra))


def test_data_urls_and_tool_text_that_mentions_urls_pass() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    call = {
        "type": "function_call",
        "call_id": "c1",
        "name": "exec_command",
        "arguments": json.dumps({"image_url": "https://example.com", "file_id": "x"}),
    }
    make().shaped(body(input=[{"role": "user", "content": [image]}, call]))


def test_price_changing_and_unknown_fields_are_dropped_and_store_is_off() -> None:
    out = make().shaped(body(service_tier="priority", background=True, store=True, speed="fast"))
    assert "service_tier" not in out and "background" not in out and "speed" not in out
    assert out["store"] is False


def test_max_output_is_capped_by_the_loop_and_the_model_and_effort_is_the_loop_s() -> None:
    assert make(cap=16_000).shaped(body(max_output_tokens=99_999))["max_output_tokens"] == 16_000
    assert make(cap=16_000).shaped(body(max_output_tokens=100))["max_output_tokens"] == 100
    assert make(cap=16_000).shaped(body())["max_output_tokens"] == 16_000
    assert make(cap=16_000).shaped(body(max_output_tokens="9"))["max_output_tokens"] == 16_000
    assert make(cap=16_000).shaped(body(max_output_tokens=True))["max_output_tokens"] == 16_000
    small = ModelSpec("gpt-6.1-sol", 100_000, 4_000, False, frozenset())
    assert make(small, cap=16_000).shaped(body())["max_output_tokens"] == 4_000
    out = make(effort="high").shaped(body(reasoning={"effort": "max", "context": "all_turns"}))
    assert out["reasoning"] == {"effort": "high", "context": "all_turns"}
    # A level the model does not take is not sent: Codex's own choice stands.
    assert make(small, effort="high").shaped(body(reasoning={"effort": "low"}))["reasoning"] == {
        "effort": "low"
    }


def test_the_budget_sees_every_field_and_the_capped_output() -> None:
    """A structured output's schema is input the API bills: the budget sees it (the red
    team's 200 KB schema was judged at 2,036 tokens when only the input was counted)."""
    gw = make(cap=1_000)
    schema = {"type": "json_schema", "name": "x", "schema": {"description": "s" * 200_000}}
    shaped = gw.shaped(body(instructions="x", text={"format": schema}, max_output_tokens=5_000))
    seen = gw.budgeted(shaped)
    assert seen["max_tokens"] == 1_000 and "max_output_tokens" not in seen
    assert budget.input_bound(seen) > 200_000


def test_an_image_or_a_file_makes_the_bound_the_whole_window() -> None:
    """Media is billed by pixels and pages, not bytes: a small PDF holds far more tokens
    than bytes, so its request is judged at the model's window."""
    gw = make()
    pdf = {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,AA"}
    seen = gw.budgeted(gw.shaped(body(input=[{"role": "user", "content": [pdf]}])))
    assert budget.input_bound(seen) == SOL.window
    output = {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    assert budget.input_bound(gw.budgeted(gw.shaped(body(input=[call, output])))) == SOL.window
    plain = gw.budgeted(gw.shaped(body()))
    assert budget.input_bound(plain) < 3_000  # text alone: its bytes


@pytest.mark.parametrize(
    "item",
    [
        {"id": "msg_123"},
        {"type": None, "id": "msg_123"},
        {"type": "computer_call_output", "call_id": "c", "output": {"type": "computer_screenshot"}},
        {"type": "web_search_call", "id": "ws_1"},
        {"type": "mcp_call", "id": "m"},
        {"type": "image_generation_call", "id": "ig"},
        "a string item",
    ],
)
def test_input_items_other_than_a_local_conversation_s_are_refused(item: Any) -> None:
    refused(make(), body(input=[{"role": "user", "content": "hi"}, item]))


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "web_search_preview"},
        {"type": "mcp", "server_label": "x"},
        {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}]},
        "web_search",
    ],
)
def test_a_tool_choice_of_a_hosted_tool_is_refused(choice: Any) -> None:
    refused(make(), body(tool_choice=choice))


def test_a_remote_url_on_any_part_is_refused() -> None:
    shot = {"type": "computer_screenshot", "image_url": "https://example.com/s.png"}
    refused(make(), body(input=[{"role": "user", "content": [shot]}]))
    nested = {"type": "input_image", "image_url": {"url": "http://x/y"}}
    refused(make(), body(input=[{"role": "user", "content": [nested]}]))
    ok = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}
    make().shaped(body(tool_choice=ok))


def test_the_placeholder_is_the_only_key() -> None:
    gw = make()
    assert gw.authorised({"authorization": f"Bearer {gw.placeholder}"})
    assert not gw.authorised({"authorization": "Bearer sk-other"})
    assert not gw.authorised({"x-api-key": gw.placeholder})
    assert not gw.authorised({})


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


USAGE = {
    "input_tokens": 10_000,
    "input_tokens_details": {"cached_tokens": 6_000, "cache_write_tokens": 1_000},
    "output_tokens": 500,
    "output_tokens_details": {"reasoning_tokens": 100},
}


def test_usage_and_tool_calls_are_read_from_the_stream_in_any_chunking() -> None:
    call = {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "text(1)"}
    message = {"type": "message", "content": [{"type": "output_text", "text": "done"}]}
    stream = sse(
        {"type": "response.created", "response": {"status": "in_progress"}},
        {"type": "response.output_item.done", "output_index": 0, "item": call},
        {"type": "response.output_item.done", "output_index": 1, "item": message},
        {
            "type": "response.completed",
            "response": {"status": "completed", "output": [call, message], "usage": USAGE},
        },
    )
    for size in (1, 7, len(stream)):
        reader = _ResponsesUsage("gpt-6.1-sol")
        for i in range(0, len(stream), size):
            reader.feed(stream[i : i + size], stream=True)
        used = reader.usage()
        assert used is not None and reader.done and reader.stop_reason == "completed"
        assert (used.input_tokens, used.cache_read_tokens, used.cache_write_tokens) == (
            3_000,
            6_000,
            1_000,
        )
        assert used.cost_usd == pytest.approx(
            (3_000 * 2 + 6_000 * 0.1 + 1_000 * 2.5 + 500 * 10) / 1e6
        )
        kinds = [(b["type"], b.get("name")) for b in reader.content()]
        assert kinds == [("tool_use", "exec"), ("text", None)]


def test_a_cut_stream_has_no_usage_and_an_incomplete_one_is_charged() -> None:
    reader = _ResponsesUsage("gpt-6.1-sol")
    reader.feed(sse({"type": "response.created", "response": {}}), stream=True)
    assert reader.usage() is None and not reader.done
    reader.feed(
        sse(
            {
                "type": "response.incomplete",
                "response": {
                    "status": "incomplete",
                    "incomplete_details": {"reason": "max_output_tokens"},
                    "usage": USAGE,
                },
            }
        ),
        stream=True,
    )
    assert reader.usage() is not None and reader.stop_reason == "incomplete: max_output_tokens"


def test_odd_usage_figures_never_lower_the_charge_below_zero_or_double_count() -> None:
    weird = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 500, "cache_write_tokens": -3},
        "output_tokens": "9",
    }
    used = usage_from_responses("gpt-6.1-sol", weird)
    assert used.input_tokens == 0 and used.cache_read_tokens == 100
    assert used.output_tokens == 0 and used.cost_usd >= 0


def test_openai_prices_and_the_long_tier() -> None:
    assert is_openai("gpt-6.1-sol") and is_openai("o4-mini") and not is_openai("claude-x")
    assert price("gpt-5.5-2026-04-23") is price("gpt-5.5")
    assert price("gpt-7-unheard-of") is OPENAI_UNKNOWN
    assert OPENAI_UNKNOWN.output >= max(p.highest.output for p in [price("gpt-5.5-pro")])

    class U:
        def __init__(self, inp: int) -> None:
            self.input_tokens, self.output_tokens = inp, 1_000_000
            self.cache_creation_input_tokens = self.cache_read_input_tokens = 0

    assert usage_from("gpt-6.1-sol", U(272_000)).cost_usd == pytest.approx(0.544 + 10)
    assert usage_from("gpt-6.1-sol", U(272_001)).cost_usd == pytest.approx(272_001 * 4 / 1e6 + 15)


def test_codex_s_config_is_loopbot_s_alone() -> None:
    text = codex.config(
        "gpt-6.1-sol",
        272_000,
        "high",
        'rules with "quotes"\nand lines',
        {"calc": McpServer(command="python3", args=("srv.py",), env={"A": "1"})},
    )
    import tomllib

    parsed = tomllib.loads(text)
    assert parsed["model"] == "gpt-6.1-sol" and parsed["model_provider"] == "loopbot"
    assert parsed["developer_instructions"] == 'rules with "quotes"\nand lines'
    assert parsed["project_doc_max_bytes"] == 0 and parsed["web_search"] == "disabled"
    assert parsed["model_providers"]["loopbot"]["base_url"] == f"{messages.BASE_URL}/v1"
    assert parsed["skills"]["include_instructions"] is False
    assert all(v is False for v in parsed["features"].values())
    assert parsed["mcp_servers"]["calc"] == {
        "command": "python3",
        "args": ["srv.py"],
        "env": {"A": "1"},
    }
    assert parsed["model_reasoning_effort"] == "high"
    assert "model_reasoning_effort" not in tomllib.loads(codex.config("m", 1, None, "s"))
