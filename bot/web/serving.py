"""gunicorn settings for ``loopbot web``; the Procfile's gunicorn reads the same ones
through its config module, bot/web/gunicorn_conf.py. Imported by gunicorn's master
before gevent patches a worker: it imports nothing.

A connection must not cost a whole worker: with the sync worker, two clients that send a
request a byte at a time held /healthz for 30 s, longer than GitHub waits for a delivery
(10 s, and it does not redeliver by itself). Under gevent each connection is a greenlet,
so a slow client holds only memory. gunicorn has no per-request read deadline for its
async workers: the limits below bound what a client may send, and a reverse proxy with
short header/body read timeouts belongs in front in production (see docs/operating.md#slow-clients).
"""

from __future__ import annotations

GUNICORN_SETTINGS: dict[str, object] = {
    "worker_class": "gevent",
    "worker_connections": 1000,  # concurrent connections per worker (greenlets)
    "timeout": 30,  # a worker that does not heartbeat for 30 s is restarted
    "graceful_timeout": 30,
    "keepalive": 5,  # seconds an idle keep-alive connection may wait for its next request
    "limit_request_line": 8190,
    "limit_request_fields": 100,
    "limit_request_field_size": 8190,
}
