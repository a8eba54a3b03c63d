"""A stand-in's WSGI app on a real port, served from a thread: how every local server of
the tests, the benchmarks and the demo starts and stops."""

from __future__ import annotations

import functools
import socketserver
import ssl
import threading
from typing import Any

import httpx
from werkzeug.serving import BaseWSGIServer, make_server


def run_in_thread(server: socketserver.BaseServer, name: str = "local-server") -> None:
    """``server.serve_forever()`` in a daemon thread, polling often: ``shutdown`` waits for
    the serving loop to notice, and a test stops a server or three each (socketserver's
    default poll of 0.5 s was half a second of every test)."""
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name=name
    ).start()


@functools.cache
def client_tls() -> ssl.SSLContext:
    """The TLS context of the stand-ins' own HTTP clients (webhook deliveries, a user's
    clicks), made once per process as httpx makes its default one: each client making
    its own read the CA bundle again, about 20 ms of CPU, in every test with a GitHub."""
    return httpx.create_ssl_context()


def serve(app: Any, host: str, port: int, name: str) -> tuple[BaseWSGIServer, str]:
    """``app`` served on ``host:port`` (0: a free port) in a daemon thread; the server and
    its URL."""
    server = make_server(host, port, app, threaded=True)
    run_in_thread(server, name)
    return server, f"http://{host}:{server.server_port}"


def stop(server: socketserver.BaseServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
