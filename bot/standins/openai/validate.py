"""The request's top-level fields (``check_fields``), and the type and value checks every
other check is built from (``_typed``, ``_one_of``, ``_unknown``, ``_missing``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bot.standins.openai.models import ModelSpec
from bot.standins.openai.wire import Json, Rejected

# The Responses API's request fields (https://platform.openai.com/docs/api-reference/
# responses/create); any other is refused, as the API refuses it.
REQUEST_KEYS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "store",
        "stream",
        "stream_options",
        "include",
        "prompt_cache_key",
        "prompt_cache_retention",
        "text",
        "client_metadata",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "temperature",
        "top_p",
        "truncation",
        "safety_identifier",
        "user",
        "service_tier",
        "background",
        "previous_response_id",
        "conversation",
        "prompt",
        "top_logprobs",
    }
)

# ``POST /v1/responses/input_tokens`` takes fewer: what shapes the prompt, nothing about
# the answer (https://platform.openai.com/docs/api-reference/responses/input-tokens).
COUNT_KEYS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "truncation",
        "previous_response_id",
        "conversation",
    }
)
INCLUDES = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
        "message.output_text.logprobs",
    }
)
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")


def _kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a decimal"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _typed(v: Any, param: str, *kinds: str) -> None:
    """``v`` must be one of ``kinds``: "string", "boolean", "integer", "number", "array",
    "object", "null"."""
    ok = {
        "string": isinstance(v, str),
        "boolean": isinstance(v, bool),
        "integer": isinstance(v, int) and not isinstance(v, bool),
        "number": isinstance(v, int | float) and not isinstance(v, bool),
        "array": isinstance(v, list),
        "object": isinstance(v, dict),
        "null": v is None,
    }
    if not any(ok[k] for k in kinds):
        named = {"string": "a string", "boolean": "a boolean", "integer": "an integer"}
        named |= {"number": "a number", "array": "an array", "object": "an object"}
        want = " or ".join(named.get(k, k) for k in kinds if k != "null")
        raise Rejected(
            f"Invalid type for '{param}': expected {want}, but got {_kind_of(v)} instead.",
            "invalid_type",
            param,
        )


def _one_of(v: Any, param: str, allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    if v not in allowed:
        listed = ", ".join(f"'{a}'" for a in allowed[:-1])
        listed = f"{listed}, and '{allowed[-1]}'" if listed else f"'{allowed[-1]}'"
        raise Rejected(
            f"Invalid value: '{v}'. Supported values are: {listed}.", "invalid_value", param
        )


def _unknown(keys: Iterable[str], allowed: Iterable[str], where: str) -> None:
    extra = sorted(set(keys) - set(allowed))
    if extra:
        name = f"{where}.{extra[0]}" if where else extra[0]
        raise Rejected(f"Unknown parameter: '{name}'.", "unknown_parameter", name)


def _missing(obj: Json, keys: Iterable[str], where: str) -> None:
    for key in keys:
        if key not in obj or obj[key] is None:
            name = f"{where}.{key}" if where else key
            raise Rejected(
                f"Missing required parameter: '{name}'.", "missing_required_parameter", name
            )


def _strict_schema(schema: Any, tool: str, path: tuple[str, ...] = ()) -> None:
    """A strict function schema (the default) must close every object
    (``additionalProperties: false``) and require every property, as the API demands."""
    if isinstance(schema, list):
        for sub in schema:
            _strict_schema(sub, tool, path)
        return
    if not isinstance(schema, dict):
        return
    where = f"Invalid schema for function '{tool}': In context={path!r}, "
    if schema.get("type") == "object" or "properties" in schema:
        if schema.get("additionalProperties") is not False:
            raise Rejected(
                where + "'additionalProperties' is required to be supplied and to be false.",
                "invalid_function_parameters",
                "tools",
            )
        props = schema.get("properties") or {}
        required = schema.get("required") or []
        missing = [p for p in props if p not in required]
        if missing:
            raise Rejected(
                where + "'required' is required to be supplied and to be an array including "
                f"every key in properties. Missing '{missing[0]}'.",
                "invalid_function_parameters",
                "tools",
            )
        for name, sub in props.items() if isinstance(props, dict) else []:
            _strict_schema(sub, tool, (*path, "properties", name))
    for key in ("items", "anyOf", "allOf", "$defs", "definitions"):
        sub = schema.get(key)
        if isinstance(sub, dict) and key in ("$defs", "definitions"):
            for name, node in sub.items():
                _strict_schema(node, tool, (*path, key, name))
        elif sub is not None:
            _strict_schema(sub, tool, (*path, key))


def check_fields(body: Json, spec: ModelSpec, keys: frozenset[str]) -> None:
    """The request's fields, their types and values, for ``spec`` (raises ``Rejected``)."""
    _unknown(body, keys, "")
    if "stream" in body:
        _typed(body["stream"], "stream", "boolean")
    for key in ("store", "parallel_tool_calls", "background"):
        if key in body:
            _typed(body[key], key, "boolean", "null")
    for key in ("instructions", "prompt_cache_key", "safety_identifier", "user"):
        if key in body:
            _typed(body[key], key, "string", "null")
    if body.get("stream_options") is not None:
        _typed(body["stream_options"], "stream_options", "object")
        _unknown(body["stream_options"], ("include_obfuscation",), "stream_options")
        if body.get("stream") is not True:
            raise Rejected(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "invalid_value",
                "stream_options",
            )
    limit = body.get("max_output_tokens")
    if limit is not None:
        _typed(limit, "max_output_tokens", "integer")
        if limit < 16:
            raise Rejected(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value "
                f">= 16, but got {limit} instead.",
                "integer_below_min_value",
                "max_output_tokens",
            )
        if limit > spec.max_output:
            raise Rejected(
                "Invalid 'max_output_tokens': integer above maximum value. Expected a value "
                f"<= {spec.max_output}, but got {limit} instead.",
                "integer_above_max_value",
                "max_output_tokens",
            )
    if body.get("max_tool_calls") is not None:
        _typed(body["max_tool_calls"], "max_tool_calls", "integer")
        if body["max_tool_calls"] < 1:
            raise Rejected(
                "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, "
                f"but got {body['max_tool_calls']} instead.",
                "integer_below_min_value",
                "max_tool_calls",
            )
    if body.get("top_logprobs") is not None:
        _typed(body["top_logprobs"], "top_logprobs", "integer")
        if not 0 <= body["top_logprobs"] <= 20:
            raise Rejected(
                "Invalid 'top_logprobs': expected a value from 0 to 20.",
                "invalid_value",
                "top_logprobs",
            )
    for key, most in (("temperature", 2.0), ("top_p", 1.0)):
        if body.get(key) is None:
            continue
        if not spec.sampling:
            raise Rejected(
                f"Unsupported parameter: '{key}' is not supported with this model.",
                "unsupported_parameter",
                key,
            )
        _typed(body[key], key, "number")
        if not 0 <= body[key] <= most:
            raise Rejected(
                f"Invalid '{key}': expected a value from 0 to {most:g}.", "invalid_value", key
            )
    reasoning = body.get("reasoning")
    if reasoning is not None:
        _typed(reasoning, "reasoning", "object")
        _unknown(reasoning, ("effort", "summary", "generate_summary", "context"), "reasoning")
        effort = reasoning.get("effort")
        if effort is not None and effort not in spec.efforts:
            levels = [f"'{e}'" for e in spec.efforts]
            listed = (
                ", ".join(levels[:-1]) + f", and {levels[-1]}" if len(levels) > 1 else levels[0]
            )
            raise Rejected(
                f"Unsupported value: 'reasoning.effort' does not support '{effort}' with this "
                f"model. Supported values are: {listed}.",
                "unsupported_value",
                "reasoning.effort",
            )
        for key in ("summary", "generate_summary"):
            if reasoning.get(key) is not None:
                _one_of(reasoning[key], f"reasoning.{key}", ("auto", "concise", "detailed"))
    text = body.get("text")
    if text is not None:
        _typed(text, "text", "object")
        _unknown(text, ("format", "verbosity"), "text")
        if text.get("verbosity") is not None:
            _one_of(text["verbosity"], "text.verbosity", ("low", "medium", "high"))
        fmt = text.get("format")
        if fmt is not None:
            _typed(fmt, "text.format", "object")
            _one_of(fmt.get("type"), "text.format.type", ("text", "json_object", "json_schema"))
            if fmt["type"] == "json_schema":
                _missing(fmt, ["name", "schema"], "text.format")
                if fmt.get("strict") is True:
                    _strict_schema(fmt["schema"], str(fmt["name"]))
    include = body.get("include")
    if include is not None:
        _typed(include, "include", "array")
        for n, name in enumerate(include):
            _one_of(name, f"include[{n}]", sorted(INCLUDES))
        if "reasoning.encrypted_content" in include and body.get("store", True) is not False:
            raise Rejected(
                "Encrypted reasoning content ('reasoning.encrypted_content' in 'include') is "
                "only returned when 'store' is false.",
                "invalid_value",
                "include",
            )
    for key, values in (
        ("truncation", ("auto", "disabled")),
        ("service_tier", SERVICE_TIERS),
        ("prompt_cache_retention", ("in_memory", "24h")),
    ):
        if body.get(key) is not None:
            _one_of(body[key], key, values)
    for key in ("metadata", "client_metadata"):
        meta = body.get(key)
        if meta is None:
            continue
        _typed(meta, key, "object")
        if key == "metadata" and len(meta) > 16:
            raise Rejected(
                "Invalid 'metadata': too many properties. Expected an object with at most 16 "
                f"properties, but got an object with {len(meta)} properties instead.",
                "object_above_max_properties",
                "metadata",
            )
        for k, v in meta.items():
            _typed(v, f"{key}.{k}", "string")
            if key == "metadata" and (len(k) > 64 or len(v) > 512):
                raise Rejected(
                    f"Invalid 'metadata.{k}': keys are at most 64 characters and values at "
                    "most 512.",
                    "invalid_value",
                    f"metadata.{k}",
                )
    if body.get("background"):
        raise Rejected(
            "Background mode is not simulated by this local server (nor would loopbot poll "
            "for it).",
            "unsupported_value",
            "background",
        )
    if body.get("conversation") is not None:
        if body.get("previous_response_id") is not None:
            raise Rejected(
                "Mutually exclusive parameters: Ensure you are only providing one of: "
                "'previous_response_id' or 'conversation'.",
                "mutually_exclusive_parameters",
                "conversation",
            )
        named = body["conversation"]
        named = named.get("id") if isinstance(named, dict) else named
        raise Rejected(f"Conversation with id '{named}' not found.", "not_found", "conversation")
    if body.get("prompt") is not None:
        named = body["prompt"]
        named = named.get("id") if isinstance(named, dict) else named
        raise Rejected(f"Prompt with id '{named}' not found.", "not_found", "prompt")
    _missing(body, ["input"], "")
    given = body["input"]
    _typed(given, "input", "string", "array")
    if isinstance(given, list) and not given:
        raise Rejected(
            "Invalid 'input': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            "empty_array",
            "input",
        )
