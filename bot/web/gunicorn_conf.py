"""gunicorn's configuration for the Procfile's web line (``-c python:bot.web.gunicorn_conf``).

The settings are ``loopbot web``'s (``GUNICORN_SETTINGS``, bot/web/serving.py): one copy
for both. The command line still gives the bind address, the workers and the app.

``on_starting`` makes the web's start-up check (bot/web/startup.py) before the master
binds the port or starts a worker, as ``loopbot web`` does before it starts gunicorn. A
check in the worker alone is not enough: gunicorn starts a worker that exits again, for
ever, with the port open, so a load balancer's health check hangs instead of failing.
Here an invalid configuration ends gunicorn at once, with the message and a non-zero
status, and nothing ever listened.

The check runs as a command of its own, so the master imports none of loopbot's modules
(the settings import redis): gevent patches each worker before redis and the app are
imported, which is also why the Procfile does not use ``--preload``.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from bot.web.serving import GUNICORN_SETTINGS

globals().update(GUNICORN_SETTINGS)


def on_starting(server: Any) -> None:
    """In gunicorn's master, before it binds: stop it when the start-up check fails (the
    check says why on stderr)."""
    sys.stdout.flush()
    sys.stderr.flush()
    status = subprocess.run([sys.executable, "-m", "bot.web.startup"], check=False).returncode
    if status != 0:
        # Nothing is bound and no worker runs yet: halt unlinks a pidfile and exits.
        reason = "loopbot web: the start-up check failed (see above)"
        server.halt(reason=reason, exit_status=status if status > 0 else 1)
