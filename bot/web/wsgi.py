"""WSGI entry for gunicorn: ``gunicorn 'bot.web.wsgi:app_from_env()'`` (see the Procfile)."""

from __future__ import annotations

from flask import Flask
from gunicorn.errors import AppImportError

from bot.web.app import create_app
from bot.web.startup import web_settings


def app_from_env() -> Flask:
    """The app, in a gunicorn worker, from the environment (and its env file).

    The Procfile's config module checks the same before any worker starts; this is for a
    gunicorn started without it. A worker that exits (SystemExit) is started again, for
    ever, while the port stays open; one whose app fails to load (AppImportError) stops
    gunicorn, with a non-zero status.
    """
    try:
        settings = web_settings()
    except SystemExit:
        # web_settings wrote why on stderr.
        raise AppImportError("loopbot web: the app cannot start (see above)") from None
    return create_app(settings)
