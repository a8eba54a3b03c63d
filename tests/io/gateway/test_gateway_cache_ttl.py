"""The model gateway and the 1-hour prompt cache (issue 37, item 2): an agent in the
sandbox posts its own requests, with the placeholder key, asking for 1-hour cache
writes, which the API bills at 2x input. The gateway prices each write at its TTL's rate,
read from the answer's own usage, and judges each call's worst case at the dearest rate
the request can incur: the bill never passes the budget.

Real components: the gateway on its Unix socket, the real ``anthropic`` client, the
local Anthropic server (its prompt cache splits the writes by TTL as the API bills them,
``AnthropicServer.billed_usd``), the real budget check (``precall.check_worst``, counting
near the edge with the server's ``count_tokens``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic

from bot.core.models import ModelSpec
from bot.core.rules.loop import budget
from bot.core.rules.loop.budget import Budget, Spent
from bot.standins import anthropic as m
from bot.standins.anthropic import AnthropicServer
from jobs import precall
from jobs.gateway import messages as gateway
from tests.io.gateway.test_gateway_limits import post

MODEL = "claude-sonnet-4-6"  # $3 input, $15 output per MTok; a 1-hour write $6
SPEC = ModelSpec(MODEL, 200_000, 8_000, False, frozenset())


def gateway_to(model: AnthropicServer, tmp_path: Path, usd: float) -> tuple[Any, dict[str, float]]:
    client = anthropic.Anthropic(api_key="sk-real", base_url=model.url)
    limits = Budget(usd=usd, tokens=100_000_000, turns=10, hours=10)
    spent = {"usd": 0.0}

    def guard(request: dict[str, Any]) -> budget.Call:  # as precall.guard: read, then judge
        out, worst = precall.check_worst(client, request, limits, Spent(usd=spent["usd"]))
        if out is not None:
            raise precall.OverBudget(out.detail)
        return worst

    def charge(name: str, used: Any) -> None:
        spent["usd"] += used.cost_usd

    gw = gateway.ModelGateway(
        client,
        gateway.Policy(MODEL, SPEC, 8000),
        run_dir=tmp_path / "gw",
        guard=guard,
        charge=charge,
    ).start()
    return gw, spent


def test_an_agent_s_own_one_hour_cache_writes_cannot_bill_past_the_budget(
    model: AnthropicServer, tmp_path: Path
) -> None:
    """With a $1.00 budget, requests each writing about 20K tokens to the 1-hour cache
    (a fresh prefix every time, so each is a write): the gateway charges what the server
    bills, and refuses the call that could cross the budget, so the bill stays within
    $1.00 (the red team's: $0.96 charged, $1.54 billed)."""
    model.responder = lambda body: m.text("ok")
    gw, spent = gateway_to(model, tmp_path, 1.00)
    answers = []
    try:
        for i in range(20):
            prefix = f"call {i}: " + "all work and no play makes a dull bot. " * 2000
            body = {
                "model": MODEL,
                "max_tokens": 16,
                "stream": True,
                "system": [
                    {
                        "type": "text",
                        "text": prefix,
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    }
                ],
                "messages": [{"role": "user", "content": "hi"}],
            }
            answers.append(post(gw, body))
    finally:
        gw.stop()
    served = [a for a in answers if a.startswith(b"HTTP/1.1 200")]
    assert len(served) >= 5, answers[-1][:300]  # it ran near the budget before refusing
    assert any(b"budget" in a for a in answers if a.startswith(b"HTTP/1.1 400"))
    # Every answer's writes were 1-hour writes, as the server reported them.
    assert all(
        r["usage"]["cache_creation"]["ephemeral_1h_input_tokens"] > 0 for r in model.responses
    )
    billed = model.billed_usd()
    assert billed <= 1.00, (billed, spent)
    assert abs(spent["usd"] - billed) < 1e-9  # charged what was billed, no less


def _count(gw: Any, body: dict[str, Any]) -> bytes:
    """``body`` posted to the gateway's ``/v1/messages/count_tokens``."""
    import json

    from tests.io.gateway.test_gateway_limits import _whole, connect

    data = json.dumps(body).encode()
    s = connect(gw)
    s.sendall(
        b"POST /v1/messages/count_tokens HTTP/1.1\r\nHost: x\r\nx-api-key: "
        + gw.placeholder.encode()
        + b"\r\ncontent-length: "
        + str(len(data)).encode()
        + b"\r\n\r\n"
        + data
    )
    out = b""
    while not _whole(out) and (chunk := s.recv(65536)):
        out += chunk
    s.close()
    return out


def test_no_token_count_is_sent_once_the_step_cap_is_reached_or_the_turn_closed(
    model: AnthropicServer, tmp_path: Path
) -> None:
    """Past the turn's step cap (and once the harness closed the gateway), a sandbox
    process kept the real key for ``count_tokens`` as long as it liked: only a spent
    budget stopped it (red team, issue 37 item 6). Now the gateway refuses it too."""
    model.responder = lambda body: m.text("ok")
    gw, _ = gateway_to(model, tmp_path, 1.00)
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    try:
        gw.max_calls = 1
        assert _count(gw, body).startswith(b"HTTP/1.1 200")  # within the cap: counted
        assert post(gw, body).startswith(b"HTTP/1.1 200")
        sent = model.counts
        answer = _count(gw, body)  # at the cap: no model call left to count for
        assert answer.startswith(b"HTTP/1.1 400") and b"step cap" in answer, answer
        assert not gw.capped  # a count does not end the turn; a refused model call does
        assert post(gw, body).startswith(b"HTTP/1.1 400") and gw.capped
        for _ in range(5):
            answer = _count(gw, body)
            assert answer.startswith(b"HTTP/1.1 400") and b"step cap" in answer, answer
        assert model.counts == sent
        gw.max_calls, gw.capped = None, ""
        gw.closed = "the turn is over"
        answer = _count(gw, body)
        assert answer.startswith(b"HTTP/1.1 400") and b"the turn is over" in answer, answer
        assert model.counts == sent
    finally:
        gw.stop()
