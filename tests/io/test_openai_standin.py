"""The local OpenAI Responses server (bot/standins/openai/) over real HTTP: each rule the
real API enforces, tried and broken, refused in the API's error shape before the script is
used; Codex's own request accepted, and its next turn; the answer's shape, streamed and
whole; usage and the prompt cache; scripted errors."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bot.standins import openai as m
from bot.standins.openai import Fail, ModelSpec, OpenAIServer, Reply
from tests.helpers import DATA

Json = dict[str, Any]
KEY = {"Authorization": "Bearer sk-local-test"}
CODEX = DATA / "codex_request.json"
LONG = "The quick brown fox jumps over the lazy dog. " * 200  # ~9,000 chars: ~2,250 tokens
BASH = {
    "type": "function",
    "name": "bash",
    "description": "Run a shell command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    server = OpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def srv(server: OpenAIServer) -> Iterator[OpenAIServer]:
    """The module's server, as new for each test (one server and client for all: fast)."""
    server.reset()
    server.models = m.default_models()
    server.window_override = None
    server.strict_tools = True
    yield server


@pytest.fixture(scope="module")
def http(server: OpenAIServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers=KEY, timeout=10.0) as client:
        yield client


@pytest.fixture(scope="module")
def bare(server: OpenAIServer) -> Iterator[httpx.Client]:
    """A client that sends no key."""
    with httpx.Client(base_url=server.base_url, timeout=10.0) as client:
        yield client


def body(**kw: Any) -> Json:
    return {"model": "gpt-6.1-sol", "input": "hi", "store": False, **kw}


def user(s: str) -> Json:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]}


def fc(call_id: str, name: str = "bash") -> Json:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def fco(call_id: str, out: str = "ok") -> Json:
    return {"type": "function_call_output", "call_id": call_id, "output": out}


def events(resp: httpx.Response) -> list[Json]:
    """The SSE events of ``resp``, each checked: its ``event:`` line names its type."""
    assert resp.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in resp.text.split("\n\n"):
        if not block.strip():
            continue
        head, data = block.split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def refused(
    srv: OpenAIServer, http: httpx.Client, sent: Any, code: str | None, status: int = 400
) -> Json:
    """The error of a request the server must refuse, with the script left as it was."""
    srv.play(m.text("never sent"))
    resp = http.post("/responses", json=sent)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code, error
    assert len(srv.script) == 1  # the refusal came before the script was used
    srv.script.clear()
    return dict(error)


def ok(http: httpx.Client, sent: Json, path: str = "/responses") -> Json:
    resp = http.post(path, json=sent)
    assert resp.status_code == 200, resp.text
    answer: Json = resp.json()
    return answer


# -- auth, the body, the fields ----------------------------------------------------------


@pytest.mark.parametrize("auth", [None, "", "Bearer", "sk-local-test", "Basic x"])
def test_every_endpoint_wants_a_bearer_key(
    srv: OpenAIServer, bare: httpx.Client, auth: str | None
) -> None:
    headers = {} if auth is None else {"Authorization": auth}
    srv.play(m.text("never sent"))
    for method, path in (
        ("POST", "/responses"),
        ("POST", "/responses/input_tokens"),
        ("GET", "/models"),
        ("GET", "/models/gpt-6.1-sol"),
    ):
        sent = body() if method == "POST" else None
        resp = bare.request(method, path, headers=headers, json=sent)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key"
        assert resp.json()["error"]["type"] == "invalid_request_error"
    assert len(srv.script) == 1 and srv.requests == []


def test_a_body_must_be_a_json_object(srv: OpenAIServer, http: httpx.Client) -> None:
    resp = http.post("/responses", content=b"{not json", headers={"content-type": "x"})
    assert resp.status_code == 400 and "could not parse the JSON" in resp.json()["error"]["message"]
    refused(srv, http, [body()], "invalid_type")
    refused(srv, http, "gpt-6.1-sol", "invalid_type")
    # A gzip body is read; an encoding it cannot read is refused.
    srv.play(m.text("unzipped"))
    packed = gzip.compress(json.dumps(body()).encode())
    zipped = {"content-type": "application/json", "content-encoding": "gzip"}
    assert http.post("/responses", content=packed, headers=zipped).status_code == 200
    zstd = {**zipped, "content-encoding": "zstd"}
    assert http.post("/responses", content=packed, headers=zstd).status_code == 415


def test_an_unknown_parameter_is_named(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(srv, http, body(max_tokens=100), "unknown_parameter")
    assert error["message"] == "Unknown parameter: 'max_tokens'."
    assert error["param"] == "max_tokens"
    # Nested ones too: reasoning's, text's.
    assert refused(srv, http, body(reasoning={"effort": "low", "budget": 3}), "unknown_parameter")[
        "param"
    ] == ("reasoning.budget")
    refused(srv, http, body(text={"verbosity": "low", "colour": "red"}), "unknown_parameter")


def test_every_documented_field_is_known(http: httpx.Client) -> None:
    sent = body(
        instructions="Be brief.",
        tools=[BASH],
        tool_choice="auto",
        parallel_tool_calls=True,
        reasoning={"effort": "high", "summary": "auto", "context": "all_turns"},
        stream=True,
        stream_options={"include_obfuscation": False},
        include=["reasoning.encrypted_content"],
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        text={"verbosity": "low", "format": {"type": "text"}},
        client_metadata={"x-codex-installation-id": "abc"},
        max_output_tokens=1000,
        max_tool_calls=5,
        metadata={"who": "test"},
        truncation="disabled",
        safety_identifier="u1",
        user="u1",
        service_tier="auto",
        background=False,
        previous_response_id=None,
        conversation=None,
        prompt=None,
        top_logprobs=0,
        temperature=None,
        top_p=None,
    )
    assert set(sent) == m.REQUEST_KEYS
    http.post("/responses", json=sent)  # no script: a 500, but not a 400
    resp = http.post("/responses", json=sent)
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "the local model has no scripted reply left"


@pytest.mark.parametrize("stream", ["true", 1, None, {}])
def test_stream_must_be_a_boolean(srv: OpenAIServer, http: httpx.Client, stream: Any) -> None:
    error = refused(srv, http, body(stream=stream), "invalid_type")
    assert error["param"] == "stream"


def test_max_output_tokens_from_16_to_the_models_limit(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    error = refused(srv, http, body(max_output_tokens=15), "integer_below_min_value")
    assert error["param"] == "max_output_tokens"
    refused(srv, http, body(max_output_tokens=128_001), "integer_above_max_value")
    for wrong in ("100", 100.0, True):
        refused(srv, http, body(max_output_tokens=wrong), "invalid_type")
    srv.play(m.text("a"), m.text("b"))
    assert ok(http, body(max_output_tokens=16))["max_output_tokens"] == 16
    assert ok(http, body(max_output_tokens=128_000))["status"] == "completed"
    srv.add_model(ModelSpec("gpt-small", max_output=1000))
    refused(srv, http, body(model="gpt-small", max_output_tokens=1001), "integer_above_max_value")


def test_reasoning_effort_must_be_one_of_the_models_levels(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    error = refused(
        srv, http, body(model="gpt-5.5", reasoning={"effort": "max"}), "unsupported_value"
    )
    assert error["param"] == "reasoning.effort"
    assert error["message"] == (
        "Unsupported value: 'reasoning.effort' does not support 'max' with this model. "
        "Supported values are: 'low', 'medium', 'high', and 'xhigh'."
    )
    refused(srv, http, body(model="gpt-6-luna", reasoning={"effort": "ultra"}), "unsupported_value")
    refused(srv, http, body(reasoning={"effort": "none"}), "unsupported_value")
    refused(srv, http, body(reasoning={"effort": "extreme"}), "unsupported_value")
    srv.play(m.text("a"), m.text("b"), m.text("c"))
    ok(http, body(reasoning={"effort": "ultra"}))
    ok(http, body(model="gpt-6-luna", reasoning={"effort": "max"}))
    ok(http, body(model="gpt-5.5", reasoning={"effort": "xhigh"}))


def test_reasoning_models_take_no_sampling_parameters(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    error = refused(srv, http, body(temperature=0.2), "unsupported_parameter")
    assert (
        error["message"] == "Unsupported parameter: 'temperature' is not supported with this model."
    )
    refused(srv, http, body(top_p=0.5), "unsupported_parameter")
    srv.add_model(ModelSpec("gpt-sampler", sampling=True))
    refused(srv, http, body(model="gpt-sampler", temperature=2.5), "invalid_value")
    srv.play(m.text("warm"))
    ok(http, body(model="gpt-sampler", temperature=0.7))


def test_encrypted_reasoning_needs_store_false(srv: OpenAIServer, http: httpx.Client) -> None:
    include = ["reasoning.encrypted_content"]
    assert refused(srv, http, body(store=True, include=include), "invalid_value")["param"] == (
        "include"
    )
    sent = body(include=include)
    del sent["store"]  # store defaults to true, as the API's does
    refused(srv, http, sent, "invalid_value")
    refused(srv, http, body(include=["reasoning.secret_content"]), "invalid_value")
    srv.play(m.text("fine"))
    ok(http, body(include=include))


def test_stream_options_only_with_stream(srv: OpenAIServer, http: httpx.Client) -> None:
    refused(srv, http, body(stream_options={"include_obfuscation": False}), "invalid_value")


def test_stored_state_that_does_not_exist_is_refused(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(
        srv, http, body(previous_response_id="resp_nope"), "previous_response_not_found"
    )
    assert error["message"] == "Previous response with id 'resp_nope' not found."
    assert error["param"] == "previous_response_id"
    refused(srv, http, body(conversation="conv_1"), "not_found")
    refused(srv, http, body(prompt={"id": "pmpt_1"}), "not_found")
    item_ref = [user("hi"), {"type": "item_reference", "id": "msg_nope"}]
    assert "not found" in refused(srv, http, body(input=item_ref), None)["message"]
    refused(srv, http, body(background=True), "unsupported_value")


def test_previous_response_id_continues_a_stored_response(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    srv.play(m.call("bash", {"command": "ls"}), m.text("listed"), m.text("private"))
    first = ok(http, body(store=True, tools=[BASH], input="list files"))
    assert first["store"] is True
    call_id = first["output"][0]["call_id"]
    # The previous response's call is answered by this input's output: consistent.
    second = ok(http, body(tools=[BASH], previous_response_id=first["id"], input=[fco(call_id)]))
    assert second["previous_response_id"] == first["id"]
    assert srv.input_tokens[1] > m.count_tokens(body(tools=[BASH], input=[fco(call_id)]))
    # The stored call's item can be referenced; the second (store: false) is not stored.
    ok(
        http,
        body(
            tools=[BASH],
            input=[
                user("again"),
                {"type": "item_reference", "id": first["output"][0]["id"]},
                fco(call_id),
            ],
        ),
    )
    refused(srv, http, body(previous_response_id=second["id"]), "previous_response_not_found")


# -- the model catalogue ------------------------------------------------------------------


def test_an_unknown_model_is_a_400_in_the_apis_words(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(srv, http, body(model="gpt-9"), "model_not_found")
    assert error["message"] == "The requested model 'gpt-9' does not exist."
    refused(srv, http, {"input": "hi"}, "missing_required_parameter")


def test_the_models_api_lists_the_catalogue(srv: OpenAIServer, http: httpx.Client) -> None:
    listed = ok_get(http, "/models")
    assert listed["object"] == "list"
    ids = [d["id"] for d in listed["data"]]
    assert {"gpt-6.1-sol", "gpt-6-sol", "gpt-6-luna", "gpt-5.5"} <= set(ids)
    assert all(set(d) == {"id", "object", "created", "owned_by"} for d in listed["data"])
    assert ok_get(http, "/models/gpt-5.5")["owned_by"] == "openai"
    resp = http.get("/models/gpt-9")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    srv.add_model(ModelSpec("gpt-new"))
    assert ok_get(http, "/models/gpt-new")["id"] == "gpt-new"
    assert http.get("/nowhere").json()["error"]["message"] == "Invalid URL (GET /v1/nowhere)"


def ok_get(http: httpx.Client, path: str) -> Json:
    resp = http.get(path)
    assert resp.status_code == 200, resp.text
    answer: Json = resp.json()
    return answer


# -- the input -----------------------------------------------------------------------------


def test_input_is_a_string_or_a_non_empty_list(srv: OpenAIServer, http: httpx.Client) -> None:
    refused(srv, http, body(input={"role": "user"}), "invalid_type")
    refused(srv, http, body(input=[]), "empty_array")
    refused(srv, http, body(input=["hi"]), "invalid_type")
    del_input = body()
    del del_input["input"]
    refused(srv, http, del_input, "missing_required_parameter")


def test_input_items_are_known_and_well_formed(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(srv, http, body(input=[{"type": "thought", "text": "x"}]), "invalid_value")
    assert error["param"] == "input[0].type"
    refused(srv, http, body(input=[{"text": "no type, no role"}]), "missing_required_parameter")
    refused(srv, http, body(input=[{"role": "robot", "content": "x"}]), "invalid_value")
    refused(srv, http, body(input=[{**user("x"), "colour": "red"}]), "unknown_parameter")
    refused(
        srv,
        http,
        body(input=[{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]),
        "invalid_value",
    )
    refused(
        srv,
        http,
        body(input=[{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]),
        "invalid_value",
    )
    no_args = {"type": "function_call", "call_id": "c1", "name": "bash"}
    assert refused(srv, http, body(input=[no_args]), "missing_required_parameter")["param"] == (
        "input[0].arguments"
    )
    refused(srv, http, body(input=[{**fc("c1"), "arguments": {}}]), "invalid_type")
    # An easy message (no type) and every role, in string or part form, are fine.
    srv.play(m.text("ok"))
    ok(
        http,
        body(
            input=[
                {"role": "system", "content": "s"},
                {"role": "developer", "content": [{"type": "input_text", "text": "d"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
                {"role": "user", "content": "u"},
            ]
        ),
    )


def test_a_tool_output_must_answer_an_earlier_call(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(srv, http, body(input=[user("x"), fco("call_9")]), "invalid_value")
    assert error["message"] == "No tool call found for function call output with call_id call_9."
    # Before its call is no better.
    refused(srv, http, body(input=[fco("c1"), fc("c1")]), "invalid_value")
    # Nor an output of the wrong kind.
    ctc = {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "1"}
    error = refused(srv, http, body(input=[ctc, fco("c1")]), "invalid_value")
    assert error["message"] == "No tool call found for function call output with call_id c1."
    ctco = {"type": "custom_tool_call_output", "call_id": "c2", "output": "x"}
    error = refused(srv, http, body(input=[fc("c2"), ctco]), "invalid_value")
    assert error["message"] == "No tool call found for custom tool call output with call_id c2."


def test_every_call_is_answered_unless_it_is_the_last_item(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    error = refused(srv, http, body(input=[user("x"), fc("c1"), user("and?")]), "invalid_value")
    assert error["message"] == "No tool output found for function call c1."
    refused(srv, http, body(input=[fc("c1"), fc("c2"), fco("c2")]), "invalid_value")
    refused(srv, http, body(input=[fc("c1"), fco("c1"), fc("c1"), fco("c1")]), "invalid_value")
    refused(srv, http, body(input=[fc("c1"), fco("c1"), fco("c1")]), "invalid_value")
    srv.play(m.text("a"), m.text("b"))
    ok(http, body(tools=[BASH], input=[user("x"), fc("c1")]))  # the last item may wait
    ok(http, body(tools=[BASH], input=[user("x"), fc("c1"), fc("c2"), fco("c2"), fco("c1")]))


# -- reasoning items -------------------------------------------------------------------------


def reasoned(srv: OpenAIServer, http: httpx.Client, model: str = "gpt-6.1-sol") -> list[Json]:
    """A response with a reasoning item and a call, encrypted content included."""
    srv.play(m.call("bash", {"command": "ls"}))
    sent = body(
        model=model,
        tools=[BASH],
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
    )
    output: list[Json] = ok(http, sent)["output"]
    return output


def followup(output: list[Json], model: str = "gpt-6.1-sol", **kw: Any) -> Json:
    back = [*output, fco(output[-1]["call_id"])]
    return body(
        model=model,
        tools=[BASH],
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        input=[user("list"), *back],
        **kw,
    )


def test_reasoning_comes_back_as_issued(srv: OpenAIServer, http: httpx.Client) -> None:
    rs, call = reasoned(srv, http)
    assert rs["type"] == "reasoning" and rs["id"].startswith("rs_") and rs["summary"] == []
    assert m.reasoning_item_id(rs["encrypted_content"], "gpt-6.1-sol") == rs["id"]
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    srv.play(m.text("a"), m.text("b"))
    ok(http, followup([rs, call]))
    ok(http, followup([{k: v for k, v in rs.items() if k != "id"}, call]))  # id left out


def test_forged_or_foreign_reasoning_is_refused(srv: OpenAIServer, http: httpx.Client) -> None:
    rs, call = reasoned(srv, http)
    forged = {**rs, "encrypted_content": rs["encrypted_content"][:-4] + "AAAA"}
    error = refused(srv, http, followup([forged, call]), "invalid_encrypted_content")
    assert error["param"] == "input[1].encrypted_content"
    refused(
        srv,
        http,
        followup([{**rs, "encrypted_content": "gAAAAABnope"}, call]),
        "invalid_encrypted_content",
    )
    # Another item's id with this item's content.
    refused(srv, http, followup([{**rs, "id": "rs_other"}, call]), "invalid_encrypted_content")
    # To another model.
    refused(srv, http, followup([rs, call], model="gpt-6-sol"), "invalid_encrypted_content")
    # Without its content, under store: false: nothing to find it by.
    bare = {k: v for k, v in rs.items() if k != "encrypted_content"}
    error = refused(srv, http, followup([bare, call]), None)
    assert error["message"].startswith(f"Item with id '{rs['id']}' not found.")
    # Compaction items this server never issued.
    compacted = body(input=[{"type": "compaction", "encrypted_content": "gAAAAABx"}, user("x")])
    refused(srv, http, compacted, "invalid_encrypted_content")


def test_a_call_cannot_come_back_without_its_reasoning(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    rs, call = reasoned(srv, http)
    error = refused(srv, http, followup([call]), None)
    assert error["message"] == (
        f"Item '{call['id']}' of type 'function_call' was provided without its required "
        f"'reasoning' item: '{rs['id']}'."
    )
    # After the call is no better than not at all.
    refused(srv, http, _after(rs, call), None)


def _after(rs: Json, call: Json) -> Json:
    sent = followup([call])
    sent["input"].append(rs)
    return sent


# -- tools ---------------------------------------------------------------------------------


def test_tools_are_known_and_well_formed(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(
        srv, http, body(tools=[{"type": "bash_20250124", "name": "b"}]), "invalid_value"
    )
    assert error["param"] == "tools[0].type"
    no_params = {"type": "function", "name": "bash"}
    assert refused(srv, http, body(tools=[no_params]), "missing_required_parameter")["param"] == (
        "tools[0].parameters"
    )
    refused(srv, http, body(tools=[{**BASH, "parameters": "{}"}]), "invalid_type")
    refused(
        srv,
        http,
        body(tools=[{**BASH, "parameters": {"type": "string"}}]),
        "invalid_function_parameters",
    )
    refused(srv, http, body(tools=[{**BASH, "name": "run bash"}]), "invalid_value")
    refused(srv, http, body(tools=[BASH, BASH]), "invalid_value")
    refused(srv, http, body(tools=[{**BASH, "input_schema": {}}]), "unknown_parameter")
    refused(
        srv,
        http,
        body(tools=[{"type": "custom", "name": "exec", "format": {"type": "grammar"}}]),
        "invalid_value",
    )


def test_strict_function_schemas_must_be_closed_and_fully_required(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    loose = {"type": "object", "properties": {"command": {"type": "string"}}}
    tool = {"type": "function", "name": "bash", "parameters": loose}  # strict by default
    error = refused(srv, http, body(tools=[tool]), "invalid_function_parameters")
    assert "'additionalProperties' is required to be supplied and to be false" in error["message"]
    closed = {**loose, "additionalProperties": False}
    error = refused(
        srv, http, body(tools=[{**tool, "parameters": closed}]), "invalid_function_parameters"
    )
    assert "Missing 'command'" in error["message"]
    nested = {
        **closed,
        "required": ["command"],
        "properties": {"command": {"type": "object", "properties": {"x": {"type": "string"}}}},
    }
    refused(srv, http, body(tools=[{**tool, "parameters": nested}]), "invalid_function_parameters")
    srv.play(m.text("ok"))
    ok(http, body(tools=[{**tool, "strict": False}]))


def test_additional_tools_and_namespaces(srv: OpenAIServer, http: httpx.Client) -> None:
    def extra(*tools: Json) -> Json:
        return body(
            input=[
                {"type": "additional_tools", "role": "developer", "tools": list(tools)},
                user("x"),
            ]
        )

    hosted_in_ns = {"type": "namespace", "name": "functions", "tools": [{"type": "web_search"}]}
    error = refused(srv, http, extra(hosted_in_ns), "invalid_value")
    assert error["param"] == "input[0].tools[0].tools[0].type"
    refused(
        srv, http, extra({"type": "namespace", "name": "functions"}), "missing_required_parameter"
    )
    refused(srv, http, extra({"type": "telepathy"}), "invalid_value")
    bad_fn = {"type": "namespace", "name": "fns", "tools": [{"type": "function", "name": "f"}]}
    refused(srv, http, extra(bad_fn), "missing_required_parameter")
    wrong_role = extra(BASH)
    wrong_role["input"][0]["role"] = "user"
    refused(srv, http, wrong_role, "invalid_value")
    assert srv.hosted_tools == set()
    srv.play(m.text("ok"))
    ok(
        http,
        extra({"type": "namespace", "name": "functions", "tools": [BASH]}, {"type": "web_search"}),
    )
    assert srv.hosted_tools == {"web_search"}


def test_hosted_tools_are_recorded(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.play(m.text("ok"))
    tools = [
        BASH,
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "web_search_preview"},
    ]
    ok(http, body(tools=tools))
    assert srv.hosted_tools == {"code_interpreter", "web_search_preview"}


def test_tool_choice_names_an_offered_tool(srv: OpenAIServer, http: httpx.Client) -> None:
    error = refused(
        srv,
        http,
        body(tools=[BASH], tool_choice={"type": "function", "name": "sh"}),
        "invalid_value",
    )
    assert error["message"] == "Tool choice 'function' not found in 'tools' parameter."
    refused(srv, http, body(tool_choice="required"), "invalid_value")
    refused(srv, http, body(tools=[BASH], tool_choice="always"), "invalid_value")
    refused(srv, http, body(tools=[BASH], tool_choice={"type": "web_search"}), "invalid_value")
    srv.play(m.call("bash", {"command": "ls"}))
    ok(http, body(tools=[BASH], tool_choice={"type": "function", "name": "bash"}))


def test_a_script_the_request_could_not_produce_is_a_500(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    srv.play(m.call("python", {"code": "1"}))
    resp = http.post("/responses", json=body(tools=[BASH]))
    assert resp.status_code == 500 and "does not offer" in resp.json()["error"]["message"]
    srv.play(m.call("bash", {"command": "ls"}))
    resp = http.post("/responses", json=body(tools=[BASH], tool_choice="none"))
    assert resp.status_code == 500
    two = Reply([*m.call("bash", "{}").output, *m.call("bash", "{}").output])
    srv.play(two)
    resp = http.post("/responses", json=body(tools=[BASH], parallel_tool_calls=False))
    assert resp.status_code == 500
    srv.strict_tools = False
    srv.play(m.call("python", {"code": "1"}))
    ok(http, body(tools=[BASH]))


# -- the context window and the token count ----------------------------------------------


def test_a_prompt_over_the_window_is_refused_and_the_script_kept(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    srv.window_override = 1000
    sent = body(input=[user("x" * 6000)])
    counted = ok(http, {k: sent[k] for k in ("model", "input")}, "/responses/input_tokens")
    assert counted == {"object": "response.input_tokens", "input_tokens": m.count_tokens(sent)}
    assert counted["input_tokens"] > 1000
    error = refused(srv, http, sent, "context_length_exceeded")
    assert error["message"] == (
        "Your input exceeds the context window of this model. Please adjust your input and "
        "try again."
    )
    assert srv.input_tokens[-1] == counted["input_tokens"]
    srv.play(m.text("fits"))
    ok(http, body(input=[user("x" * 3000)]))
    # truncation: "auto" drops the oldest items instead.
    srv.play(m.text("truncated"))
    answer = ok(http, body(truncation="auto", input=[user("x" * 6000), user("now?")]))
    assert answer["usage"]["input_tokens"] <= 1000


def test_a_models_own_window_applies(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.add_model(ModelSpec("gpt-tiny", window=2000))
    refused(srv, http, body(model="gpt-tiny", input=LONG), "context_length_exceeded")
    srv.play(m.text("ok"))
    ok(http, body(input=LONG))


def test_the_count_endpoint_checks_like_the_api(srv: OpenAIServer, http: httpx.Client) -> None:
    for wrong, code in (
        (body(), "unknown_parameter"),  # store is no count field
        ({"model": "gpt-9", "input": "x"}, "model_not_found"),
        ({"model": "gpt-5.5", "input": [fco("c1")]}, "invalid_value"),
    ):
        resp = http.post("/responses/input_tokens", json=wrong)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == code
    sent = {"model": "gpt-5.5", "input": "hello", "instructions": "Be brief.", "tools": [BASH]}
    assert ok(http, sent, "/responses/input_tokens")["input_tokens"] == m.count_tokens(sent)
    assert srv.requests == []  # counting is not a response request


def test_count_tokens_is_deterministic_and_monotonic() -> None:
    small = body(input=[user("hello")])
    more = body(input=[user("hello"), user("world")])
    assert m.count_tokens(small) == m.count_tokens(copy.deepcopy(small))
    assert m.count_tokens(more) > m.count_tokens(small)
    assert m.count_tokens(body(input=[user("hello")], tools=[BASH])) > m.count_tokens(small)
    assert m.count_tokens(body(input="hello")) == m.count_tokens(
        body(input=[{"type": "message", "role": "user", "content": "hello"}])
    )
    # Ids and statuses are bookkeeping, not prompt.
    assert m.count_tokens(body(input=[{**user("hello"), "id": "msg_1"}])) == m.count_tokens(small)


# -- the answer ------------------------------------------------------------------------------


def test_a_whole_response_in_the_apis_shape(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.play(m.text("hello there"))
    answer = ok(http, body(instructions="Be kind.", reasoning={"effort": "medium"}))
    assert answer["id"].startswith("resp_") and answer["object"] == "response"
    assert answer["status"] == "completed" and answer["error"] is None
    assert answer["incomplete_details"] is None and answer["model"] == "gpt-6.1-sol"
    assert isinstance(answer["created_at"], int)
    rs, msg = answer["output"]
    assert rs["type"] == "reasoning" and "encrypted_content" not in rs  # not included
    assert msg["id"].startswith("msg_") and msg["role"] == "assistant"
    assert msg["status"] == "completed"
    assert msg["content"] == [
        {"annotations": [], "logprobs": [], "type": "output_text", "text": "hello there"}
    ]
    usage = answer["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == m.REASONING_TOKENS["medium"]
    assert usage["output_tokens"] == m.REASONING_TOKENS["medium"] + 3  # 11 chars: 3 tokens
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert srv.responses == [answer]
    # Without reasoning asked, no reasoning item.
    srv.play(m.text("plain"))
    assert [i["type"] for i in ok(http, body())["output"]] == ["message"]


def test_the_stream_in_the_apis_order(srv: OpenAIServer, http: httpx.Client) -> None:
    words = "word " * 30
    srv.play(
        Reply(
            [
                {"type": "message", "content": [{"type": "output_text", "text": words}]},
                {
                    "type": "function_call",
                    "name": "bash",
                    "arguments": json.dumps({"command": "ls " * 20}),
                },
            ],
            summary="Thinking about words.",
        )
    )
    sent = body(
        stream=True,
        tools=[BASH],
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
    )
    evs = events(http.post("/responses", json=sent))
    kinds = [e["type"] for e in evs]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
    assert kinds[-1] == "response.completed"
    final = evs[-1]["response"]
    assert final["status"] == "completed" and [i["type"] for i in final["output"]] == [
        "reasoning",
        "message",
        "function_call",
    ]
    assert final["output"][0]["summary"] == [
        {"type": "summary_text", "text": "Thinking about words."}
    ]
    assert final == srv.responses[-1]
    # Each item: added (in progress), its deltas, done (whole).
    added = [e for e in evs if e["type"] == "response.output_item.added"]
    done = [e for e in evs if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [0, 1, 2] == [e["output_index"] for e in done]
    assert [e["item"] for e in done] == final["output"]
    assert added[1]["item"]["content"] == [] and added[1]["item"]["status"] == "in_progress"
    assert added[2]["item"]["arguments"] == ""
    message = [k for k in kinds if "content_part" in k or "output_text" in k]
    assert (
        message[0] == "response.content_part.added" and message[-1] == "response.content_part.done"
    )
    assert message[-2] == "response.output_text.done"
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert text == words
    assert all(
        e["item_id"] == final["output"][1]["id"]
        for e in evs
        if e["type"] == "response.output_text.delta"
    )
    args = "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta")
    assert args == final["output"][2]["arguments"]
    fdone = next(e for e in evs if e["type"] == "response.function_call_arguments.done")
    assert fdone["arguments"] == args
    summary = "".join(
        e["delta"] for e in evs if e["type"] == "response.reasoning_summary_text.delta"
    )
    assert summary == "Thinking about words."
    # Every event lies between its item's added and done.
    for i in range(3):
        first = kinds.index("response.output_item.added", kinds.index("response.in_progress"))
        assert first < kinds.index("response.completed")
        assert evs.index(added[i]) < evs.index(done[i])


def test_a_custom_tool_call_streams_its_input(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.play(m.cx_shell("echo hi > out.txt; ls -la"))
    evs = events(http.post("/responses", json=codex_request()))
    kinds = [e["type"] for e in evs]
    assert "response.custom_tool_call_input.delta" in kinds
    given = "".join(e["delta"] for e in evs if e["type"] == "response.custom_tool_call_input.delta")
    item = evs[-1]["response"]["output"][-1]
    assert item["type"] == "custom_tool_call" and item["name"] == "exec"
    assert item["id"].startswith("ctc_") and item["call_id"].startswith("call_")
    assert (
        given
        == item["input"]
        == ('const r = await tools.exec_command({cmd: "echo hi > out.txt; ls -la"}); text(r);')
    )
    done = next(e for e in evs if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == given and done["item_id"] == item["id"]


def test_incomplete_answers_end_the_stream_with_response_incomplete(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    srv.play(m.cut_text("I was about to"))
    evs = events(http.post("/responses", json=body(stream=True)))
    assert evs[-1]["type"] == "response.incomplete"
    response = evs[-1]["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert "response.completed" not in [e["type"] for e in evs]


def test_a_reply_longer_than_max_output_tokens_is_cut(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    srv.play(m.text(LONG))
    answer = ok(http, body(max_output_tokens=100, reasoning={"effort": "low"}))
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer["usage"]["output_tokens"] == 100
    _, msg = answer["output"]
    assert msg["status"] == "incomplete"
    assert msg["content"][0]["text"] == LONG[: (100 - m.REASONING_TOKENS["low"]) * 4]


def test_scripted_usage_and_call_ids_are_kept(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.play(
        m.call(
            "bash",
            {"command": "ls"},
            call_id="call_mine",
            usage={"input_tokens": 7, "output_tokens": 3},
        )
    )
    answer = ok(http, body(tools=[BASH]))
    assert answer["output"][0]["call_id"] == "call_mine"
    assert answer["usage"]["input_tokens"] == 7 and answer["usage"]["total_tokens"] == 10


def test_the_prompt_cache_reads_the_shared_prefix(srv: OpenAIServer, http: httpx.Client) -> None:
    first_input = [user(LONG), user("first")]
    srv.play(m.text("one"), m.text("two"), m.text("three"), m.text("four"))
    one = ok(http, body(prompt_cache_key="k1", input=first_input))["usage"]
    assert one["input_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": one["input_tokens"],
    }
    two = ok(http, body(prompt_cache_key="k1", input=[*first_input, user("second")]))["usage"]
    assert two["input_tokens_details"]["cached_tokens"] == one["input_tokens"]
    assert two["input_tokens_details"]["cache_write_tokens"] == (
        two["input_tokens"] - one["input_tokens"]
    )
    # input_tokens counts every input token, cached and written included.
    assert two["input_tokens"] == m.count_tokens(body(input=[*first_input, user("second")]))
    # Another key shares nothing; a short prompt is neither read nor written.
    other = ok(http, body(prompt_cache_key="k2", input=[*first_input, user("second")]))["usage"]
    assert other["input_tokens_details"]["cached_tokens"] == 0
    short = ok(http, body(prompt_cache_key="k3", input="hi"))["usage"]
    assert short["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 0}


# -- scripted failures, the responder, the record ----------------------------------------


def test_a_scripted_error_with_its_headers(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.play(
        Fail(429, "Rate limit reached.", "requests", "rate_limit_exceeded", {"retry-after": "2"}),
        Fail(500, "The server had an error."),
    )
    resp = http.post("/responses", json=body())
    assert resp.status_code == 429 and resp.headers["retry-after"] == "2"
    assert resp.json() == {
        "error": {
            "message": "Rate limit reached.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    resp = http.post("/responses", json=body(stream=True))  # not in_stream: a plain 500
    assert resp.status_code == 500 and resp.json()["error"]["type"] == "server_error"
    resp = http.post("/responses", json=body())
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "the local model has no scripted reply left"


def test_a_failure_mid_stream(srv: OpenAIServer, http: httpx.Client) -> None:
    srv.play(Fail(500, "overloaded", code="server_error", in_stream=True))
    evs = events(http.post("/responses", json=body(stream=True)))
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert evs[-1]["response"]["status"] == "failed"
    assert evs[-1]["response"]["error"] == {"code": "server_error", "message": "overloaded"}
    assert srv.responses == []


def test_the_responder_answers_when_the_script_is_empty(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    srv.responder = lambda sent: m.text(f"you said {sent['input']}")
    srv.play(m.text("scripted first"))
    assert ok(http, body())["output"][0]["content"][0]["text"] == "scripted first"
    assert ok(http, body(input="ping"))["output"][0]["content"][0]["text"] == "you said ping"
    assert [r["input"] for r in srv.requests] == ["hi", "ping"]
    assert srv.headers[0]["Authorization"] == KEY["Authorization"]
    assert len(srv.input_tokens) == 2 and len(srv.responses) == 2
    srv.reset()
    assert srv.requests == srv.responses == [] and srv.responder is None


def test_refused_requests_are_recorded_too(srv: OpenAIServer, http: httpx.Client) -> None:
    refused(srv, http, body(max_output_tokens=1), "integer_below_min_value")
    assert len(srv.requests) == len(srv.input_tokens) == 1 and srv.responses == []


# -- Codex ------------------------------------------------------------------------------------


def codex_request() -> Json:
    loaded: Json = json.loads(CODEX.read_text())
    return loaded


def test_codexs_own_request_is_accepted_and_its_next_turn_too(
    srv: OpenAIServer, http: httpx.Client
) -> None:
    sent = codex_request()
    srv.play(m.cx_shell("cat out.txt"), m.text("Done."), m.text("Done again."))
    evs = events(http.post("/responses", json=sent))
    final = evs[-1]["response"]
    assert evs[-1]["type"] == "response.completed"
    rs, call = final["output"]
    assert rs["type"] == "reasoning" and rs["encrypted_content"]
    assert call["type"] == "custom_tool_call" and call["name"] == "exec"
    # Codex's next turn: the output items as it sends them back, and the call's output.
    answer = {
        "type": "custom_tool_call_output",
        "id": "ctco_01a214c2-3408-7193-9f51-865ef8a6fcec2",
        "call_id": call["call_id"],
        "output": [{"type": "input_text", "text": "Script completed\nOutput:\nhi\n"}],
    }
    back = {k: call[k] for k in ("type", "id", "status", "call_id", "name", "input")}
    nxt = {**sent, "input": [*sent["input"], rs, back, answer]}
    evs = events(http.post("/responses", json=nxt))
    assert evs[-1]["response"]["output"][-1]["content"][0]["text"] == "Done."
    # The reasoning item's id may be left out: its content names it.
    no_id = {k: v for k, v in rs.items() if k != "id"}
    nxt["input"] = [*sent["input"], no_id, back, answer]
    assert events(http.post("/responses", json=nxt))[-1]["type"] == "response.completed"
    # Codex's prompt cache key: the second turn read the first's prompt.
    usage = srv.responses[1]["usage"]
    assert (
        usage["input_tokens_details"]["cached_tokens"] == srv.responses[0]["usage"]["input_tokens"]
    )


def test_codex_helpers_write_its_javascript() -> None:
    shell = m.cx_shell('echo "a b" > f')
    assert shell.output == [
        {
            "type": "custom_tool_call",
            "name": "exec",
            "input": 'const r = await tools.exec_command({cmd: "echo \\"a b\\" > f"}); text(r);',
        }
    ]
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n-x\n+y\n*** End Patch\n"
    js = m.cx_patch(patch).output[0]["input"]
    assert js == f"text(await tools.apply_patch({json.dumps(patch)}));"
    assert m.cx_exec("text(1)", call_id="call_7").output[0]["call_id"] == "call_7"
    said = m.text("hi", delay=0.5)
    assert said.delay == 0.5 and said.output[0]["content"] == [
        {"type": "output_text", "text": "hi"}
    ]
