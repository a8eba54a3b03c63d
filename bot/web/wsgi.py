"""WSGI entry for gunicorn: ``gunicorn 'bot.web.wsgi:app_from_env()'`` (see the Procfile)."""

from __future__ import annotations

import sys

from flask import Flask

from bot.core.settings import SettingsError, load_settings
from bot.io.logs import configure
from bot.io.redis import check_at_startup
from bot.web.app import create_app


def app_from_env() -> Flask:
    try:
        settings = load_settings(role="web")
    except SettingsError as exc:
        sys.stderr.write(f"loopbot web: {exc}\n")
        raise SystemExit(2) from None
    configure(settings.log_format)
    check_at_startup(settings.redis_url, "loopbot web", tolerate_down=True)
    return create_app(settings)
