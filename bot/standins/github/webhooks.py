"""Webhook deliveries: ``State.emit`` queues them; one thread sends them in order, signed
with the webhook secret as GitHub signs them, and records each outcome in ``deliveries``."""

from __future__ import annotations

import json
import time
import uuid

import httpx

from bot.core.signature import sign
from bot.standins.github.state import State
from bot.standins.github.wire import Json, now
from bot.standins.serving import client_tls


def send_forever(state: State) -> None:
    """Send queued deliveries until ``None`` is queued (the server stopping)."""
    with httpx.Client(timeout=10, verify=client_tls()) as client:
        while True:
            item = state.outbox.get()
            if item is None:
                state.outbox.task_done()
                return
            record = _deliver(state, client, *item)
            with state.lock:
                state.deliveries.append(record)
            state.outbox.task_done()


def _deliver(state: State, client: httpx.Client, event: str, payload: Json) -> Json:
    body = json.dumps(payload).encode()
    delivery = str(uuid.uuid4())
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": sign(state.webhook_secret, body),
        "User-Agent": "GitHub-Hookshot/local",
    }
    record: Json = {
        "id": state.next_id(),
        "event": event,
        "delivery": delivery,
        "action": payload.get("action"),
        "delivered_at": now(),
        "installation_id": (payload.get("installation") or {}).get("id"),
        "repository_id": (payload.get("repository") or {}).get("id"),
        "status_code": 0,  # as GitHub records a delivery that got no HTTP answer
    }
    started = time.monotonic()
    try:
        assert state.webhook_url is not None
        resp = client.post(state.webhook_url, content=body, headers=headers)
        record["status"] = record["status_code"] = resp.status_code
    except httpx.HTTPError as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["duration"] = round(time.monotonic() - started, 3)
    return record
