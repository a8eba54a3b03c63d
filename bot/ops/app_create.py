"""``loopbot app create``: register the GitHub App in one step (GitHub's manifest flow).

1. A local page (on 127.0.0.1) holds a form whose button posts loopbot's manifest, with
   the operator's URL, to GitHub's "new GitHub App" page, with a random ``state``.
2. GitHub registers the App and sends the browser back to the local page's callback with
   a one-time ``code`` and the same ``state``; a callback with another state is refused
   and the flow keeps waiting (a page on another site cannot finish it for you).
3. The code is exchanged (``POST /app-manifests/{code}/conversions``) for the App's id,
   private key and webhook secret, which are written to the env file (mode 0600, replaced
   atomically, other lines kept) that ``loopbot web`` and ``worker`` read. They are never
   printed.

GitHub Enterprise Server works through ``GITHUB_API_URL`` (``https://HOST/api/v3``): the
browser goes to ``https://HOST`` and the env file records the API address too.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import tempfile
import threading
import webbrowser
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from flask import Flask, Response, request
from werkzeug.serving import make_server

from bot.io.github.app import convert_manifest_code
from bot.io.github.failures import GitHubError
from bot.ops import manifest as mf
from bot.ops.manifest import ManifestError

DEFAULT_API_URL = "https://api.github.com"


@dataclass
class Outcome:
    """What the callback did; ``done`` is set once the flow is over, either way."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    slug: str = ""
    app_id: int = 0
    install_url: str = ""


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """Set ``values`` in the env file at ``path``: written to a new file created 0600 in
    the same directory, then renamed over the old one, so no reader ever sees a partial
    file and the secrets never sit in a file others can read."""
    existing = path.read_text() if path.exists() else ""
    text = mf.merge_env(existing, values)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=".env-", dir=directory)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def already_registered(path: Path) -> bool:
    """Whether the env file already names an App (``--force`` replaces it)."""
    from bot.core.settings import read_env_file

    return bool(read_env_file(path).get("GITHUB_APP_ID"))


def make_flow_app(
    *,
    api_url: str,
    site_url: str,
    org: str | None,
    name: str | None,
    env_file: Path,
    local_url: str,
    state: str,
    outcome: Outcome,
) -> Flask:
    """The local page and its callback; ``outcome`` says when and how the flow ended."""
    github_web = mf.web_url(api_url)
    manifest = mf.deployment_manifest(mf.load_manifest(), site_url, f"{local_url}/callback", name)
    action = mf.registration_url(github_web, org, state)
    app = Flask("loopbot-app-create")
    lock = threading.Lock()

    @app.get("/")
    def page() -> Response:
        resp = Response(mf.form_page(action, manifest, org), mimetype="text/html")
        resp.headers["Cache-Control"] = "no-store"
        # The form may post only to GitHub, and (browsers apply form-action to the
        # redirects that follow a post) be sent back only here.
        resp.headers["Content-Security-Policy"] = (
            f"default-src 'none'; style-src 'unsafe-inline'; form-action {github_web} {local_url}"
        )
        return resp

    @app.get("/callback")
    def callback() -> tuple[Response, int]:
        given = request.args.get("state", "")
        code = request.args.get("code", "")
        if not hmac.compare_digest(given.encode(), state.encode()) or not code:
            # Not GitHub sending back our own request: say so, keep waiting.
            return _text("This link is not the answer to this registration; ignored."), 400
        with lock:
            if outcome.done.is_set():
                return _text("This registration is already finished."), 409
            try:
                app_json = convert_manifest_code(api_url, code)
                values = mf.credentials(app_json)
                if api_url.rstrip("/") != DEFAULT_API_URL:
                    values["GITHUB_API_URL"] = api_url.rstrip("/")
                write_env_file(env_file, values)
            except (GitHubError, ManifestError, OSError) as exc:
                outcome.error = str(exc)
                outcome.done.set()
                return _text(f"Registration failed: {exc}"), 502
            outcome.slug = str(app_json.get("slug") or app_json.get("name") or "")
            outcome.app_id = int(values["GITHUB_APP_ID"])
            html_url = str(app_json.get("html_url") or f"{github_web}/apps/{outcome.slug}")
            outcome.install_url = f"{html_url}/installations/new"
            outcome.done.set()
        page = mf.done_page(outcome.slug, outcome.install_url, str(env_file))
        return Response(page, mimetype="text/html"), 200

    return app


def _text(message: str) -> Response:
    return Response(message + "\n", mimetype="text/plain")


def run(
    *,
    api_url: str,
    site_url: str,
    org: str | None,
    name: str | None,
    env_file: Path,
    port: int,
    open_browser: bool,
    timeout: float,
    out: TextIO,
) -> int:
    """Serve the local page until the callback finishes the flow or ``timeout`` passes;
    0 when the credentials are written."""
    state = secrets.token_urlsafe(32)
    outcome = Outcome()
    server = make_server("127.0.0.1", port, Flask("placeholder"), threaded=True)
    local_url = f"http://127.0.0.1:{server.server_port}"
    server.app = make_flow_app(
        api_url=api_url,
        site_url=site_url,
        org=org,
        name=name,
        env_file=env_file,
        local_url=local_url,
        state=state,
        outcome=outcome,
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="app-create")
    thread.start()
    try:
        print(f"Open {local_url}/ in a browser signed in to GitHub, and press", file=out)
        print("the button to register the App. Waiting (Ctrl-C stops)...", file=out, flush=True)
        if open_browser:
            with contextlib.suppress(webbrowser.Error):
                webbrowser.open(local_url + "/")
        if not outcome.done.wait(timeout):
            print(f"loopbot app create: no answer from GitHub within {timeout:.0f} s", file=out)
            return 1
    finally:
        server.shutdown()
        server.server_close()
    if outcome.error:
        print(f"loopbot app create: {outcome.error}", file=out)
        return 1
    print(
        f"Registered the App {outcome.slug} (id {outcome.app_id}); its id, private key and "
        f"webhook secret are in {env_file} (mode 0600).",
        file=out,
    )
    print(f"Next: install it on your repositories: {outcome.install_url}", file=out)
    return 0


def check_options(api_url: str, site_url: str, org: str | None, name: str | None) -> None:
    """Refuse bad options before anything is served (raises ``ManifestError``)."""
    mf.deployment_manifest(mf.load_manifest(), site_url, "http://127.0.0.1/callback", name)
    mf.registration_url(mf.web_url(api_url), org, "x")
