"""The check every start of the web makes first: its settings, and a Redis it can use.

``loopbot web`` runs it before it starts gunicorn; the Procfile's gunicorn runs it as a
command (``python -m bot.web.startup``) from its ``on_starting`` hook, before it binds
the port (bot/web/gunicorn_conf.py); ``app_from_env`` runs it again in each worker.
"""

from __future__ import annotations

import sys

from bot.core.settings import Settings, SettingsError, load_settings
from bot.io.logs import configure
from bot.io.redis import check_at_startup


def web_settings() -> Settings:
    """The web's settings, checked as a process starts.

    Invalid settings, or a Redis that can never be used (refused credentials, TLS, a bad
    URL), end the process: one message on stderr naming what is wrong, exit status 2. A
    Redis that is only down is logged and start-up goes on (the web answers 503 until it
    is back).
    """
    try:
        settings = load_settings(role="web")
    except SettingsError as exc:
        sys.stderr.write(f"loopbot web: {exc}\n")
        raise SystemExit(2) from None
    configure(settings.log_format)
    check_at_startup(settings.redis_url, "loopbot web", tolerate_down=True)
    return settings


if __name__ == "__main__":
    web_settings()
