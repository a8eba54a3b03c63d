"""The comparison points for bench/webhook.py.

``app``: a Flask endpoint that does nothing. ``durable``: one that makes the request
durable the cheapest way there is, one Redis write (an RPUSH of the body), before it
answers 202: the real floor for an ingress that must not lose a delivery. It uses
loopbot's own Redis client settings (timeouts, retries), so the comparison is the work
done per request, not the client.
"""

from __future__ import annotations

import os
from functools import cache

from flask import Flask, request
from redis import Redis

from bot.io.redis import connect

app = Flask("bare")
durable = Flask("durable")


@app.post("/webhook")
def webhook() -> tuple[str, int]:
    request.get_data()
    return '{"status": "ok"}', 202


@cache
def _redis() -> Redis:
    return connect(os.environ["REDIS_URL"], retries=2, timeout=2)


@durable.post("/webhook")
def durable_webhook() -> tuple[str, int]:
    _redis().rpush("bench:durable", request.get_data())
    return '{"status": "ok"}', 202
