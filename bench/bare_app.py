"""The comparison point for bench/webhook.py: a Flask endpoint that does nothing."""

from __future__ import annotations

from flask import Flask, request

app = Flask("bare")


@app.post("/webhook")
def webhook() -> tuple[str, int]:
    request.get_data()
    return '{"status": "ok"}', 202
