"""WSGI entry for gunicorn: ``gunicorn 'bot.wsgi:app_from_env()'`` (see the Procfile)."""

from __future__ import annotations

import sys

from flask import Flask

from bot.logs import configure
from bot.redis_conn import check_at_startup
from bot.settings import SettingsError, load_settings
from bot.webapp import create_app


def app_from_env() -> Flask:
    try:
        settings = load_settings(role="web")
    except SettingsError as exc:
        sys.stderr.write(f"loopbot web: {exc}\n")
        raise SystemExit(2) from None
    configure(settings.log_format)
    check_at_startup(settings.redis_url, "loopbot web", tolerate_down=True)
    return create_app(settings)
