"""``loopbot doctor --github``: the live App against what loopbot needs.

For each installation, the permissions and events its owner granted against ``app.yml``
(an App's new permissions reach an installation only once its owner accepts them, so the
App and each installation are compared apart); then the App's webhook: whether its URL
answers a signed ping from here, and GitHub's own record of its recent deliveries, each
failure with what to do about it. The decisions are pure functions of what the API
answered; ``run_github_checks`` does the asking."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from bot.core.settings import Settings, SettingsError, load_settings
from bot.core.signature import sign
from bot.ops import doctor_rules
from bot.ops.doctor import Check
from bot.ops.manifest import load_manifest, web_url

if TYPE_CHECKING:
    from bot.io.github.client import GitHubApp

LEVELS = {"read": 1, "write": 2, "admin": 3}
SHOWN_FAILURES = 5  # the most recent failed deliveries listed, each with its advice
PING_TIMEOUT = 10.0


def app_settings_url(github_web: str, app: Mapping[str, Any]) -> str:
    """The App's settings page: under the organization that owns it, or the user's."""
    owner = app.get("owner") or {}
    slug = app.get("slug", "")
    if owner.get("type") == "Organization":
        return f"{github_web}/organizations/{owner.get('login')}/settings/apps/{slug}"
    return f"{github_web}/settings/apps/{slug}"


def _short(level: int) -> str:
    return next((name for name, n in LEVELS.items() if n == level), "none")


def _lacking(wanted: Mapping[str, str], granted: Mapping[str, Any]) -> dict[str, str]:
    """Each permission ``granted`` has below what ``wanted`` asks: name → what it has."""
    return {
        name: str(granted.get(name) or "none")
        for name, level in wanted.items()
        if LEVELS.get(str(granted.get(name)), 0) < LEVELS[level]
    }


def grant_checks(
    where: str,
    granted: Mapping[str, Any],
    events: list[str],
    *,
    wanted: Mapping[str, str],
    wanted_events: list[str],
    app: Mapping[str, Any],
    settings_url: str,
    accept_url: str,
) -> list[Check]:
    """One installation's permissions and events against ``wanted``: a failure per
    permission or event it lacks, saying whether the App itself lacks it (edit the App)
    or only the installation (its owner has not accepted the App's new permissions);
    a warning for what it has that loopbot never uses."""
    checks: list[Check] = []
    app_lacks = _lacking(wanted, app.get("permissions") or {})
    for name, has in _lacking(wanted, granted).items():
        want = wanted[name]
        if name in app_lacks:
            fix = (
                f"give the App {name}: {want} at {settings_url}/permissions, then the owner "
                f"of {where} accepts the new permissions"
            )
        else:
            fix = f"the App asks for it; the owner of {where} must accept it at {accept_url}"
        checks.append(
            Check(
                f"permission {name} ({where})",
                False,
                f"{has}, loopbot needs {want} ({_why(name)})",
                fix,
            )
        )
    app_events = set(app.get("events") or [])
    for event in wanted_events:
        if event in events:
            continue
        if event not in app_events:
            fix = f"subscribe the App to {event} at {settings_url}/permissions"
        else:
            fix = f"the owner of {where} must accept the App's new events at {accept_url}"
        checks.append(Check(f"event {event} ({where})", False, "not delivered to loopbot", fix))
    extra = sorted(
        f"{name}: {level}"
        for name, level in granted.items()
        if LEVELS.get(str(level), 0) > LEVELS.get(wanted.get(name, ""), 0)
    )
    if not any(not c.ok for c in checks):
        detail = f"{len(wanted)} permissions and {len(wanted_events)} events as app.yml asks"
        if extra:
            detail += f"; also granted {', '.join(extra)}, which loopbot never uses"
        checks.append(Check(f"installation {where}", True, detail, warn=bool(extra)))
    return checks


def _why(permission: str) -> str:
    """What loopbot does with a permission, from app.yml's own comments."""
    return {
        "metadata": "every App; branch rules",
        "issues": "labels, status comments, closing",
        "pull_requests": "open, review, merge",
        "contents": "clone, push the loop branch",
        "checks": "check runs",
        "statuses": "required statuses, for the merge gate",
    }.get(permission, "see app.yml")


def installation_checks(
    installations: Sequence[Mapping[str, Any]],
    app: Mapping[str, Any],
    manifest: Mapping[str, Any],
    github_web: str,
) -> list[Check]:
    """Every installation's grant (see ``grant_checks``), or why there is none to check."""
    settings_url = app_settings_url(github_web, app)
    if not installations:
        return [
            Check(
                "installations",
                False,
                "the App is installed nowhere: no webhook reaches loopbot",
                f"install it: {github_web}/apps/{app.get('slug')}/installations/new",
            )
        ]
    checks: list[Check] = []
    for inst in installations:
        where = str((inst.get("account") or {}).get("login") or f"installation {inst['id']}")
        accept = str(inst.get("html_url") or settings_url)
        if inst.get("suspended_at"):
            checks.append(
                Check(
                    f"installation {where}",
                    False,
                    f"suspended since {inst['suspended_at']}: GitHub sends it nothing",
                    f"unsuspend it at {accept}",
                )
            )
            continue
        checks.extend(
            grant_checks(
                where,
                inst.get("permissions") or {},
                list(inst.get("events") or []),
                wanted=manifest["default_permissions"],
                wanted_events=list(manifest["default_events"]),
                app=app,
                settings_url=settings_url,
                accept_url=accept,
            )
        )
    return checks


def hook_config_checks(config: Mapping[str, Any], settings_url: str) -> list[Check]:
    """What the App's webhook configuration says before anything is sent to it."""
    url = str(config.get("url") or "")
    if not url:
        return [
            Check(
                "webhook url",
                False,
                "the App has no webhook URL: GitHub sends loopbot nothing",
                f"set it to https://YOUR-HOST/webhook at {settings_url}",
            )
        ]
    checks: list[Check] = []
    parts = urlsplit(url)
    if parts.path.rstrip("/") != "/webhook":
        checks.append(
            Check(
                "webhook url",
                False,
                f"{url}: loopbot web serves POST /webhook, not {parts.path or '/'}",
                f"set it to {parts.scheme}://{parts.netloc}/webhook at {settings_url}",
            )
        )
    if config.get("content_type") not in (None, "json"):
        checks.append(
            Check(
                "webhook content type",
                False,
                f"{config.get('content_type')}: loopbot reads JSON bodies only",
                "set it to application/json (PATCH /app/hook/config content_type=json)",
            )
        )
    if str(config.get("insecure_ssl", "0")) not in ("0", "0.0"):
        checks.append(
            Check(
                "webhook TLS",
                True,
                "certificate checks are off (insecure_ssl): anyone on the path can read "
                "and replay deliveries",
                warn=True,
            )
        )
    if not config.get("secret"):
        checks.append(
            Check(
                "webhook secret",
                False,
                "the App has no webhook secret: loopbot refuses every unsigned delivery",
                f"set it to GITHUB_WEBHOOK_SECRET's value at {settings_url}",
            )
        )
    return checks


def ping_outcome_check(url: str, status: int | None, error: str = "") -> Check:
    """What a signed ping to the webhook URL from this machine says. ``status`` None
    means no HTTP answer (``error`` says why)."""
    seen = "from this machine; GitHub's own deliveries are listed below"
    if status is None:
        return Check(
            "webhook answers",
            False,
            f"{url}: no answer ({error})",
            "start loopbot web there, and check DNS, TLS and the firewall",
        )
    if 200 <= status < 300:
        return Check(
            "webhook answers", True, f"{url} accepted a signed ping (HTTP {status}) {seen}"
        )
    if status in (401, 403):
        return Check(
            "webhook answers",
            False,
            f"{url} refused the signature (HTTP {status}): the web there has another "
            "GITHUB_WEBHOOK_SECRET than this environment",
            "give loopbot web, the worker and the App the same webhook secret",
        )
    if status in (404, 405):
        return Check(
            "webhook answers",
            False,
            f"{url}: HTTP {status}; not loopbot's webhook endpoint",
            "point the App's webhook URL at loopbot web's /webhook",
        )
    if 300 <= status < 400:
        return Check(
            "webhook answers",
            False,
            f"{url}: redirects (HTTP {status}); GitHub does not follow redirects",
            "set the App's webhook URL to the address it redirects to",
        )
    return Check(
        "webhook answers",
        False,
        f"{url}: HTTP {status}",
        "see loopbot web's log (a 503 means it cannot reach Redis)",
    )


def _advice(code: int, guid: str) -> str:
    """What to do about a delivery GitHub recorded as failed, by the answer it got."""
    if code == 0:
        return (
            "GitHub got no HTTP answer: the URL is not reachable from GitHub (DNS, "
            "firewall, an invalid TLS certificate, or loopbot web not running)"
        )
    if code in (401, 403):
        return (
            "loopbot web refused the signature: the App's webhook secret is not "
            "GITHUB_WEBHOOK_SECRET; set the same value in both"
        )
    if code in (404, 405):
        return "the webhook URL's path is wrong: loopbot web serves POST /webhook"
    if 300 <= code < 400:
        return "GitHub does not follow redirects: set the URL it redirects to"
    if code == 503:
        return "loopbot web could not reach Redis then: check REDIS_URL and Redis"
    if code == 400:
        return f"loopbot web refused the payload: its log says why (delivery {guid})"
    return f"see loopbot web's log for delivery {guid}"


def delivery_checks(deliveries: Sequence[Mapping[str, Any]], settings_url: str) -> list[Check]:
    """GitHub's record of the webhook's newest deliveries (newest first): the most recent
    failures, each with advice. Failing now (the newest delivery failed) fails the check;
    failures followed by a success are history, shown as warnings."""
    if not deliveries:
        return [Check("webhook deliveries", True, "none recorded yet")]
    failed = [d for d in deliveries if not 200 <= int(d.get("status_code") or 0) < 300]
    if not failed:
        return [Check("webhook deliveries", True, f"the last {len(deliveries)} all succeeded")]
    failing_now = failed[0] is deliveries[0]
    redeliver = f"redeliver at {settings_url}/advanced once fixed"
    summary = Check(
        "webhook deliveries",
        not failing_now,
        f"{len(failed)} of the last {len(deliveries)} failed"
        + ("" if failing_now else "; the newest succeeded"),
        redeliver,
        warn=not failing_now,
    )
    checks = [summary]
    for d in failed[:SHOWN_FAILURES]:
        code = int(d.get("status_code") or 0)
        event = str(d.get("event", "?")) + (f".{d['action']}" if d.get("action") else "")
        detail = f"{d.get('delivered_at')} {event}: {d.get('status') or f'HTTP {code}'}"
        advice = _advice(code, str(d.get("guid", "")))
        if failing_now:
            checks.append(Check(f"delivery {d.get('guid')}", False, detail, advice))
        else:
            checks.append(
                Check(f"delivery {d.get('guid')}", True, f"{detail} ({advice})", warn=True)
            )
    return checks


def ping(url: str, secret: str, events: list[str]) -> tuple[int | None, str]:
    """POST a signed ``ping`` to ``url`` as GitHub would; its status, or None and why."""
    body = json.dumps(
        {
            "zen": "loopbot doctor --github",
            "hook_id": 0,
            "hook": {"type": "App", "active": True, "events": events},
        }
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": f"doctor-{uuid.uuid4()}",
        "X-Hub-Signature-256": sign(secret, body),
        "User-Agent": "loopbot-doctor",
    }
    try:
        resp = httpx.post(url, content=body, headers=headers, timeout=PING_TIMEOUT)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return resp.status_code, ""


def run_github_checks(env: Mapping[str, str] | None = None) -> list[Check]:
    """Ask GitHub, as the App, about its installations and webhook (see the module)."""
    from bot.io.github.client import GitHubApp

    try:
        settings: Settings = load_settings(env, role="cli")
    except SettingsError as exc:
        return [
            Check("settings", False, p, "see docs/operating.md#configure (or run loopbot doctor)")
            for p in exc.problems
        ]
    github_web = web_url(settings.api_url)
    manifest = load_manifest()
    gh = GitHubApp(settings, sleep=lambda s: None)
    try:
        app = gh.app_info()
    except Exception as exc:  # noqa: BLE001 - any failure is the check's answer
        return [
            Check(
                "github app",
                False,
                f"{settings.api_url}: {exc}",
                "check GITHUB_APP_ID and the private key (app settings → private keys)",
            )
        ]
    settings_url = app_settings_url(github_web, app)
    checks = [Check("github app", True, f"'{app.get('slug')}' at {settings.api_url}")]
    try:
        installations = gh.installations()
    except Exception as exc:  # noqa: BLE001 - any failure is the check's answer
        checks.append(Check("github api", False, str(exc), "retry; if it persists, see the log"))
        installations = []
    else:
        checks.extend(installation_checks(installations, app, manifest, github_web))
    for inst in installations:
        if not inst.get("suspended_at"):
            checks.extend(_asked(functools.partial(rules_checks, gh, inst)))
    try:
        config = gh.hook_config()
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("webhook config", False, str(exc), "the App's JWT must be valid"))
        config = {}
    if config:
        checks.extend(hook_config_checks(config, settings_url))
        url = str(config.get("url") or "")
        if url:
            status, why = ping(
                url,
                settings.github_webhook_secret.get_secret_value(),
                list(manifest["default_events"]),
            )
            checks.append(ping_outcome_check(url, status, why))
    checks.extend(_asked(lambda: delivery_checks(gh.recent_deliveries(), settings_url)))
    return checks


def rules_checks(gh: GitHubApp, inst: Mapping[str, Any]) -> list[Check]:
    """One installation's ``workflows`` grant and its repositories' rules (the first
    ``SHOWN_REPOS``), read as the installation (see bot/ops/doctor_rules.py)."""
    where = str((inst.get("account") or {}).get("login") or f"installation {inst['id']}")
    checks = [doctor_rules.workflows_check(where, inst.get("permissions") or {})]
    gi = gh.installation(int(inst["id"]))
    names = gi.repositories()
    for repo in names[: doctor_rules.SHOWN_REPOS]:
        info = gi.repo(repo)
        checks += doctor_rules.repo_checks(
            repo,
            info.model_dump(),
            gi.branch_rules(repo, info.default_branch),
            gi.branch_rules(repo, doctor_rules.LOOP_BRANCH),
            gi.branch_protected(repo, info.default_branch),
        )
    if len(names) > doctor_rules.SHOWN_REPOS:
        checks.append(doctor_rules.more_repos_check(where, len(names)))
    return checks


def _asked(fn: Callable[[], list[Check]]) -> list[Check]:
    """``fn()``'s checks, or one failing check saying what GitHub answered instead."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - any failure is the check's answer
        return [Check("github api", False, str(exc), "retry; if it persists, see the log")]
