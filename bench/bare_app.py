"""The comparison points for bench/webhook.py.

``app``: a Flask endpoint that does nothing. ``durable``: one that makes the request
durable the cheapest way there is, one Redis write (an RPUSH of the body), before it
answers 202: the real floor for an ingress that must not lose a delivery.
"""

from __future__ import annotations

import os
from functools import cache

from flask import Flask, request
from redis import Redis

app = Flask("bare")
durable = Flask("durable")


@app.post("/webhook")
def webhook() -> tuple[str, int]:
    request.get_data()
    return '{"status": "ok"}', 202


@cache
def _redis() -> Redis:
    return Redis.from_url(os.environ["REDIS_URL"])


@durable.post("/webhook")
def durable_webhook() -> tuple[str, int]:
    _redis().rpush("bench:durable", request.get_data())
    return '{"status": "ok"}', 202
