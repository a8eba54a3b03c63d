"""A stand-in's WSGI app on a real port, served from a thread: how every local server of
the tests, the benchmarks and the demo starts and stops."""

from __future__ import annotations

import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server


def serve(app: Any, host: str, port: int, name: str) -> tuple[BaseWSGIServer, str]:
    """``app`` served on ``host:port`` (0: a free port) in a daemon thread; the server and
    its URL."""
    server = make_server(host, port, app, threaded=True)
    # A short poll: ``shutdown`` waits for the serving loop to notice, and a test fixture
    # stops a server per test (socketserver's default 0.5 s was half a second of each).
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name=name
    ).start()
    return server, f"http://{host}:{server.server_port}"


def stop(server: BaseWSGIServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
