"""The Models API through the real anthropic SDK, against the local model server: the
catalogue loopbot keeps (jobs.models) and what `loopbot doctor` says of the configured
models (bot.ops.doctor.model_checks)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import pytest
from flask import Response, jsonify, request
from structlog.testing import capture_logs

from bot.core.models import ModelSpec as Spec
from bot.core.settings import Settings, load_settings
from bot.ops.doctor import Check, model_checks
from bot.standins.anthropic import AnthropicServer, ModelSpec
from jobs.models import ModelCatalog, UnknownModel

NOW = datetime(2026, 11, 23, tzinfo=UTC)
KEY = "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----\n"
LOOPBOT = str(Path(sys.executable).parent / "loopbot")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Failing:
    """Makes the local server answer the Models API with ``status`` while ``on``."""

    def __init__(self, server: AnthropicServer, status: int = 500) -> None:
        self.on = False
        self.status = status
        self.calls = 0
        self.lock = threading.Lock()

        @server.app.before_request
        def fail() -> tuple[Response, int] | None:
            if not request.path.startswith("/v1/models"):
                return None
            with self.lock:
                self.calls += 1
                if not self.on:
                    return None
            body = {"type": "error", "error": {"type": "api_error", "message": "down"}}
            return jsonify(body), self.status


@pytest.fixture
def failing(model: AnthropicServer) -> Failing:
    # Registered before the server's first request, as Flask requires.
    return Failing(model)


@pytest.fixture
def client(model: AnthropicServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-local-test", base_url=model.url, max_retries=0)


class Fallback:
    context_window = 150_000
    max_output = 32_000


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def catalog(client: anthropic.Anthropic, clock: Clock, failing: Failing) -> ModelCatalog:
    return ModelCatalog(client, Fallback(), ttl=3600, clock=clock)


# -- the catalogue ---------------------------------------------------------------------------


def test_a_spec_is_what_the_models_api_says(catalog: ModelCatalog) -> None:
    assert catalog.spec("claude-sonnet-5-5") == Spec(
        "claude-sonnet-5-5",
        window=1_000_000,
        max_output=128_000,
        adaptive=True,
        efforts=frozenset({"low", "medium", "high", "xhigh", "max"}),
    )
    haiku = catalog.spec("claude-haiku-4-5")  # extended (budget) thinking only: no adaptive
    assert (haiku.window, haiku.max_output, haiku.adaptive, haiku.efforts) == (
        200_000,
        64_000,
        False,
        frozenset(),
    )
    old = catalog.spec("claude-sonnet-4-5")
    assert old.lifecycle == "deprecated" and old.retires_at == datetime(2026, 11, 30, tzinfo=UTC)
    assert catalog.spec("claude-3-5-haiku-20241022").lifecycle == "retired"


def test_a_spec_is_kept_for_its_ttl_then_asked_again(
    catalog: ModelCatalog, model: AnthropicServer, clock: Clock, failing: Failing
) -> None:
    first = catalog.spec("claude-test")
    model.add_model(ModelSpec("claude-test", "Claude Test", window=90_000))
    clock.now += 3599
    assert catalog.spec("claude-test") is first  # from the cache: the API was not asked
    assert failing.calls == 1
    clock.now += 2
    assert catalog.spec("claude-test").window == 90_000
    assert failing.calls == 2


def test_an_unknown_model_is_an_error_not_a_guess(catalog: ModelCatalog, failing: Failing) -> None:
    with pytest.raises(UnknownModel) as exc:
        catalog.spec("claude-nonesuch-9")
    assert exc.value.model == "claude-nonesuch-9" and "claude-nonesuch-9" in str(exc.value)


def test_the_api_down_gives_the_operators_fallback_for_a_minute(
    catalog: ModelCatalog, failing: Failing, clock: Clock
) -> None:
    failing.on = True
    with capture_logs() as logs:
        guess = catalog.spec("claude-sonnet-5-5")
    assert guess == Spec(
        "claude-sonnet-5-5", 150_000, 32_000, adaptive=False, efforts=frozenset(), known=False
    )
    assert [(e["event"], e["log_level"], e["window"]) for e in logs] == [
        ("models.fallback", "warning", 150_000)
    ]
    asked = failing.calls
    assert asked == 2  # the catalogue's own client retries once
    failing.on = False
    clock.now += 30
    assert catalog.spec("claude-sonnet-5-5") is guess  # not asked again at once
    assert failing.calls == asked
    clock.now += 31  # past the fallback's minute: the API is asked, and answers
    assert catalog.spec("claude-sonnet-5-5").known


def test_a_network_failure_also_falls_back() -> None:
    dead = anthropic.Anthropic(api_key="k", base_url="http://127.0.0.1:1", max_retries=0)
    spec = ModelCatalog(dead, Fallback()).spec("claude-sonnet-5-5")
    assert not spec.known and (spec.window, spec.max_output) == (150_000, 32_000)


def test_the_catalogue_is_safe_across_threads(catalog: ModelCatalog) -> None:
    out: list[Spec] = []

    def ask() -> None:
        out.append(catalog.spec("claude-sonnet-5-5"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 8 and len(set(out)) == 1


def test_active_lists_only_active_models(catalog: ModelCatalog, model: AnthropicServer) -> None:
    for i in range(120):  # more than one page of the list
        model.add_model(ModelSpec(f"claude-extra-{i:03d}", created_at="2020-01-01T00:00:00Z"))
    active = catalog.active()
    assert "claude-sonnet-5-5" in active and "claude-extra-119" in active
    assert "claude-sonnet-4-5" not in active and "claude-3-5-haiku-20241022" not in active


# -- loopbot doctor ------------------------------------------------------------------------


def settings_for(model: AnthropicServer, **more: str) -> Settings:
    env = {
        "GITHUB_APP_ID": "1",
        "GITHUB_PRIVATE_KEY": KEY,
        "GITHUB_WEBHOOK_SECRET": "s",
        "ANTHROPIC_API_KEY": "sk-ant-local-test",
        "ANTHROPIC_BASE_URL": model.url,
        "LOOPBOT_MODEL": "claude-sonnet-5-5",
        "LOOPBOT_CRITIC_MODEL": "claude-test",
        **more,
    }
    return load_settings(env, role="worker")


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_doctor_shows_each_models_window_and_output(model: AnthropicServer) -> None:
    checks = by_name(model_checks(settings_for(model), NOW))
    assert checks["model endpoint"].ok
    agent = checks["model LOOPBOT_MODEL"]
    assert agent.ok and not agent.warn
    assert "claude-sonnet-5-5: active; window 1,000,000 tokens, max output 128,000" in agent.detail
    assert "adaptive thinking, effort low, medium, high, xhigh, max" in agent.detail
    critic = checks["model LOOPBOT_CRITIC_MODEL"]
    assert critic.ok and "window 200,000 tokens, max output 64,000" in critic.detail
    assert "model LOOPBOT_FALLBACK_MODEL" not in checks
    assert checks["allowed models"].ok


def test_doctor_fails_an_unknown_model_naming_the_active_ones(model: AnthropicServer) -> None:
    checks = by_name(model_checks(settings_for(model, LOOPBOT_MODEL="claude-sonet-5-5"), NOW))
    bad = checks["model LOOPBOT_MODEL"]
    assert not bad.ok and "claude-sonet-5-5: unknown to" in bad.detail
    assert bad.fix.startswith("set LOOPBOT_MODEL to one of: ")
    assert "claude-sonnet-5-5" in bad.fix and "claude-test" in bad.fix
    assert "claude-sonnet-4-5" not in bad.fix  # deprecated: not one to move to
    assert "→ set LOOPBOT_MODEL to one of" in bad.line()
    assert checks["model LOOPBOT_CRITIC_MODEL"].ok


def test_doctor_fails_a_retired_model(model: AnthropicServer) -> None:
    s = settings_for(model, LOOPBOT_FALLBACK_MODEL="claude-3-5-haiku-20241022")
    fallback = by_name(model_checks(s, NOW))["model LOOPBOT_FALLBACK_MODEL"]
    assert not fallback.ok and "retired" in fallback.detail
    assert fallback.line().startswith("[FAIL] model LOOPBOT_FALLBACK_MODEL")


def test_doctor_warns_of_a_deprecated_model_with_its_retirement_date(
    model: AnthropicServer,
) -> None:
    s = settings_for(model, LOOPBOT_CRITIC_MODEL="claude-sonnet-4-5")
    critic = by_name(model_checks(s, NOW))["model LOOPBOT_CRITIC_MODEL"]
    assert critic.ok and critic.warn
    assert "deprecated, retires 2026-11-30" in critic.detail
    assert critic.line().startswith("[warn] model LOOPBOT_CRITIC_MODEL")


def test_doctor_warns_of_a_retirement_within_60_days(model: AnthropicServer) -> None:
    soon = (NOW + timedelta(days=45)).strftime("%Y-%m-%dT00:00:00Z")
    later = (NOW + timedelta(days=90)).strftime("%Y-%m-%dT00:00:00Z")
    model.add_model(ModelSpec("claude-soon", retires_at=soon))
    model.add_model(ModelSpec("claude-later", retires_at=later))
    checks = by_name(
        model_checks(
            settings_for(model, LOOPBOT_MODEL="claude-soon", LOOPBOT_CRITIC_MODEL="claude-later"),
            NOW,
        )
    )
    agent = checks["model LOOPBOT_MODEL"]
    assert agent.ok and agent.warn and f"retires {soon[:10]}" in agent.detail
    assert not checks["model LOOPBOT_CRITIC_MODEL"].warn


def test_doctor_warns_of_a_default_effort_the_model_does_not_take(
    model: AnthropicServer,
) -> None:
    s = settings_for(model, LOOPBOT_EFFORT="xhigh", LOOPBOT_MAX_EFFORT="max")
    checks = by_name(model_checks(s, NOW))
    assert not checks["model LOOPBOT_MODEL"].warn  # Sonnet 5.5 takes xhigh
    critic = checks["model LOOPBOT_CRITIC_MODEL"]  # the test model: low to high
    assert critic.ok and critic.warn and "LOOPBOT_EFFORT=xhigh is not a level" in critic.detail
    # A model without adaptive thinking is sent no effort at all.
    haiku = by_name(model_checks(settings_for(model, LOOPBOT_MODEL="claude-haiku-4-5"), NOW))
    assert haiku["model LOOPBOT_MODEL"].warn is False  # no LOOPBOT_EFFORT: nothing to drop
    s = settings_for(model, LOOPBOT_MODEL="claude-haiku-4-5", LOOPBOT_EFFORT="low")
    agent = by_name(model_checks(s, NOW))["model LOOPBOT_MODEL"]
    assert agent.warn and "LOOPBOT_EFFORT=low is not a level it takes" in agent.detail
    assert "no adaptive thinking" in agent.detail


def test_doctor_fails_an_allowed_model_the_api_cannot_run(model: AnthropicServer) -> None:
    s = settings_for(
        model, LOOPBOT_ALLOWED_MODELS="claude-haiku-4-5,claude-gone,claude-3-5-haiku-20241022"
    )
    allowed = by_name(model_checks(s, NOW))["allowed models"]
    assert not allowed.ok
    assert "claude-gone (unknown)" in allowed.detail
    assert "claude-3-5-haiku-20241022 (retired)" in allowed.detail
    assert "claude-haiku-4-5" not in allowed.detail


def test_doctor_without_a_model_endpoint_says_so_once() -> None:
    env: dict[str, Any] = {
        "GITHUB_APP_ID": "1",
        "GITHUB_PRIVATE_KEY": KEY,
        "GITHUB_WEBHOOK_SECRET": "s",
        "ANTHROPIC_API_KEY": "k",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:1",
    }
    checks = model_checks(load_settings(env, role="worker"), NOW)
    assert [c.name for c in checks] == ["model endpoint"]
    assert not checks[0].ok and "network path" in checks[0].fix


def test_loopbot_doctor_fails_on_an_unknown_model(
    env: dict[str, str], github: Any, tmp_path: Path
) -> None:
    github.add_installation("acme")
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    out = subprocess.run(
        [LOOPBOT, "doctor"],
        env={**base, **env, "LOOPBOT_CRITIC_MODEL": "claude-nope"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout
    assert "[FAIL] model LOOPBOT_CRITIC_MODEL: claude-nope: unknown to" in out.stdout
    assert "→ set LOOPBOT_CRITIC_MODEL to one of: " in out.stdout
    assert "[ok  ] model LOOPBOT_MODEL: claude-test: active; window 200,000 tokens" in out.stdout
