"""The App manifest (``app.yml``) and the pure parts of GitHub's manifest flow.

``app.yml`` ships inside the package (``bot/ops/app.yml``; the checkout's top-level
``app.yml`` links to it), so ``loopbot app create`` and ``loopbot doctor --github`` read
the same manifest however loopbot was installed. Nothing here does I/O beyond reading
that file: the flow itself is in ``bot/ops/app_create.py``.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import yaml

# What the conversion returns that loopbot keeps, and the variable each goes to.
CREDENTIALS = ("GITHUB_APP_ID", "GITHUB_PRIVATE_KEY", "GITHUB_WEBHOOK_SECRET")
_ORG = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ManifestError(Exception):
    """The manifest, an option or GitHub's answer is not usable; the message says why."""


def manifest_text() -> str:
    return resources.files("bot.ops").joinpath("app.yml").read_text()


def load_manifest(text: str | None = None) -> dict[str, Any]:
    """``app.yml`` as a dict (the packaged one unless ``text`` is given)."""
    data = yaml.safe_load(manifest_text() if text is None else text)
    if not isinstance(data, dict):
        raise ManifestError("app.yml is not a mapping")
    for key in ("default_permissions", "default_events", "hook_attributes"):
        if key not in data:
            raise ManifestError(f"app.yml has no {key}")
    return data


def deployment_manifest(
    base: dict[str, Any], url: str, redirect_url: str, name: str | None = None
) -> dict[str, Any]:
    """The manifest to post for a deployment at ``url`` (its webhook at ``url/webhook``),
    sending the browser back to ``redirect_url`` (the local page that takes the code)."""
    site = _https_or_local(url, "--url")
    manifest = dict(base)
    manifest["hook_attributes"] = {**base.get("hook_attributes", {}), "url": f"{site}/webhook"}
    manifest["hook_attributes"]["active"] = True
    manifest["redirect_url"] = redirect_url
    if name:
        if len(name) > 34:  # GitHub's limit for an App's name
            raise ManifestError("--name: at most 34 characters")
        manifest["name"] = name
    return manifest


def _https_or_local(url: str, option: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ManifestError(f"{option}: expected https://HOST[/PATH], got {url!r}")
    local = parts.hostname in ("localhost", "127.0.0.1", "::1")
    if parts.scheme == "http" and not local:
        # GitHub would send the webhook secret's signatures (and the payloads) in clear.
        raise ManifestError(f"{option}: GitHub must reach loopbot over https, not {url!r}")
    if parts.query or parts.fragment:
        raise ManifestError(f"{option}: no query or fragment, got {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def web_url(api_url: str) -> str:
    """GitHub's web address for an API address: ``api.github.com`` is ``github.com``, a
    GitHub Enterprise Server's ``https://HOST/api/v3`` is ``https://HOST``; any other
    (a local test server) serves both at one address."""
    parts = urlsplit(api_url.rstrip("/"))
    if parts.hostname == "api.github.com":
        return "https://github.com"
    path = parts.path
    if path.endswith("/api/v3"):
        path = path[: -len("/api/v3")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def registration_url(github_web: str, org: str | None, state: str) -> str:
    """Where the browser posts the manifest: the account's or the organization's
    "new GitHub App" page, with the ``state`` GitHub hands back."""
    if org is not None and not _ORG.match(org):
        raise ManifestError(f"--org: not a GitHub organization name: {org!r}")
    where = f"/organizations/{org}/settings/apps/new" if org else "/settings/apps/new"
    return f"{github_web}{where}?{urlencode({'state': state})}"


def credentials(conversion: dict[str, Any]) -> dict[str, str]:
    """The settings the conversion's answer gives: App id, private key, webhook secret."""
    app_id, pem, secret = (conversion.get(k) for k in ("id", "pem", "webhook_secret"))
    if not isinstance(app_id, int) or app_id <= 0:
        raise ManifestError("GitHub's answer has no App id")
    if not isinstance(pem, str) or "BEGIN" not in pem:
        raise ManifestError("GitHub's answer has no private key")
    if not isinstance(secret, str) or not secret:
        raise ManifestError(
            "GitHub's answer has no webhook secret: set one in the App's settings "
            "(General → Webhook secret) and put it in GITHUB_WEBHOOK_SECRET"
        )
    return {
        "GITHUB_APP_ID": str(app_id),
        "GITHUB_PRIVATE_KEY": pem,
        "GITHUB_WEBHOOK_SECRET": secret,
    }


def _quoted(value: str) -> str:
    """A double-quoted dotenv value: python-dotenv turns ``\\n`` back into a newline."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def merge_env(existing: str, values: dict[str, str]) -> str:
    """``existing`` dotenv text with ``values`` set: a line that sets one of them is
    replaced where it stands, the others are appended; comments and other lines stay."""
    for key in values:
        if not _ENV_KEY.match(key):
            raise ManifestError(f"not a variable name: {key!r}")
    lines, done = [], set()
    for line in existing.splitlines():
        key = line.split("=", 1)[0].strip().removeprefix("export ").strip()
        if "=" in line and key in values:
            if key not in done:
                lines.append(f"{key}={_quoted(values[key])}")
                done.add(key)
            continue
        lines.append(line)
    lines += [f"{k}={_quoted(v)}" for k, v in values.items() if k not in done]
    return "\n".join(lines) + "\n"


def form_page(action: str, manifest: dict[str, Any], org: str | None) -> str:
    """The local page whose button posts the manifest to GitHub."""
    from html import escape

    where = f"the organization {escape(org)}" if org else "your account"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Register loopbot</title>
<style>body{{font:16px system-ui;margin:4em auto;max-width:40em}}button{{font-size:1em}}</style>
</head><body>
<h1>Register the loopbot GitHub App</h1>
<p>The button sends loopbot's manifest (its permissions, events and webhook
<code>{escape(manifest["hook_attributes"]["url"])}</code>) to GitHub, which registers
the App for {where}. GitHub then sends you back here, and loopbot writes the App's id,
private key and webhook secret to its env file.</p>
<form method="post" action="{escape(action)}">
<input type="hidden" name="manifest" value="{escape(json.dumps(manifest))}">
<button type="submit" id="register">Register on GitHub</button>
</form></body></html>
"""


def done_page(slug: str, install_url: str, env_file: str) -> str:
    from html import escape

    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>loopbot registered</title></head>
<body style="font:16px system-ui;margin:4em auto;max-width:40em">
<h1>Registered: {escape(slug)}</h1>
<p>The App's credentials are in <code>{escape(env_file)}</code>. Next,
<a href="{escape(install_url)}">install the App</a> on the repositories loopbot should
work on, and start <code>loopbot web</code> and <code>loopbot worker</code>.</p>
<p>You can close this page.</p></body></html>
"""
