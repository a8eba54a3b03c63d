"""The response object: every field the API sends (``_skeleton``) and its output cut
where ``max_output_tokens`` runs out (``_cut``)."""

from __future__ import annotations

import time

from bot.standins.openai.models import ModelSpec
from bot.standins.openai.tokens import _said
from bot.standins.openai.wire import Json, new_id


def _cut(out: list[Json], spent: int, limit: int) -> tuple[list[Json], int]:
    """``out`` cut where ``limit`` output tokens run out (the reasoning first, as the model
    spends them): the item the cut falls in is shortened and ``incomplete``, later ones
    are dropped. The output and its tokens (``limit``)."""
    left = limit - spent
    kept: list[Json] = []
    for item in out:
        if item["type"] == "reasoning":
            kept.append(item)
            continue
        if left <= 0:
            break
        cost = _said(item)
        if cost <= left:
            kept.append(item)
            left -= cost
            continue
        chars = left * 4
        cut = dict(item)
        if cut["type"] == "message":
            parts, room = [], chars
            for part in cut.get("content") or []:
                said = str(part.get("text", ""))
                parts.append({**part, "text": said[:room]} if "text" in part else part)
                room -= min(room, len(said))
                if room <= 0:
                    break
            cut["content"] = parts
        elif cut["type"] == "function_call":
            cut["arguments"] = str(cut.get("arguments", ""))[: max(0, chars - len(cut["name"]))]
        elif cut["type"] == "custom_tool_call":
            cut["input"] = str(cut.get("input", ""))[: max(0, chars - len(cut["name"]))]
        cut["status"] = "incomplete"
        kept.append(cut)
        break
    return kept, limit


def _skeleton(body: Json, spec: ModelSpec) -> Json:
    """A response object to ``body`` in progress: every field the API sends, no output."""
    reasoning = body.get("reasoning")
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"),
        "model": spec.id,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {
            "effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
            "summary": reasoning.get("summary") if isinstance(reasoning, dict) else None,
        },
        "safety_identifier": body.get("safety_identifier"),
        "service_tier": body.get("service_tier") or "default",
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "usage": None,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }
