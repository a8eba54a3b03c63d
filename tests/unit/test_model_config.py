"""The model and effort a loop runs with: the operator's settings (LOOPBOT_MODEL, …_ALLOWED_
MODELS, …_MAX_EFFORT, …_EFFORT) and what a loop.yml may ask within them."""

from __future__ import annotations

import pytest

from bot.core import repo_config
from bot.core.models import DEFAULT_MODEL
from bot.core.repo_config import Ceilings, ConfigError, ModelPolicy
from bot.core.settings import SettingsError, load_settings

KEY = "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----\n"


def env(**more: str) -> dict[str, str]:
    return {"GITHUB_APP_ID": "12", "GITHUB_PRIVATE_KEY": KEY, "GITHUB_WEBHOOK_SECRET": "s", **more}


POLICY = ModelPolicy(
    model="claude-sonnet-5-5",
    critic_model="claude-opus-5-5",
    allowed=frozenset({"claude-sonnet-5-5", "claude-opus-5-5", "claude-haiku-4-5"}),
    max_effort="high",
    effort="medium",
)
CEILINGS = Ceilings(models=POLICY)


def load(extra: str, ceilings: Ceilings = CEILINGS) -> tuple[repo_config.RepoConfig, list[str]]:
    return repo_config.load("verify: make test\n" + extra, ceilings)


# -- settings ------------------------------------------------------------------------------


def test_defaults() -> None:
    s = load_settings(env(), role="web")
    assert (s.model, s.critic_model) == (DEFAULT_MODEL, DEFAULT_MODEL) == ("claude-sonnet-5-5",) * 2
    assert s.allowed_models == {DEFAULT_MODEL}
    assert (s.max_effort, s.effort) == ("high", None)
    assert (s.context_window, s.max_output, s.context_threshold) == (200_000, 64_000, 0.7)


def test_the_configured_models_are_always_allowed() -> None:
    s = load_settings(
        env(
            LOOPBOT_MODEL="claude-opus-5-5",
            LOOPBOT_FALLBACK_MODEL="claude-haiku-4-5",
            LOOPBOT_ALLOWED_MODELS=" claude-fable-5-1 ,, claude-sonnet-5-5",
        ),
        role="web",
    )
    assert s.allowed_models == {
        "claude-fable-5-1",
        "claude-sonnet-5-5",  # listed, and the critic's default
        "claude-opus-5-5",
        "claude-haiku-4-5",
    }


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("LOOPBOT_MAX_EFFORT", "ultra", "LOOPBOT_MAX_EFFORT"),
        ("LOOPBOT_EFFORT", "HIGH", "LOOPBOT_EFFORT"),
        ("LOOPBOT_CONTEXT_THRESHOLD", "0.99", "LOOPBOT_CONTEXT_THRESHOLD"),
        ("LOOPBOT_CONTEXT_THRESHOLD", "0.1", "LOOPBOT_CONTEXT_THRESHOLD"),
        ("LOOPBOT_CONTEXT_WINDOW", "10", "LOOPBOT_CONTEXT_WINDOW"),
        ("LOOPBOT_MAX_OUTPUT", "0", "LOOPBOT_MAX_OUTPUT"),
        ("LOOPBOT_ALLOWED_MODELS", "claude-x, rm -rf /", "LOOPBOT_ALLOWED_MODELS"),
    ],
)
def test_malformed_model_settings_are_named(var: str, value: str, named: str) -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(env(**{var: value}), role="web")
    assert named in str(exc.value)


def test_the_default_effort_may_not_pass_the_ceiling() -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(env(LOOPBOT_EFFORT="max", LOOPBOT_MAX_EFFORT="high"), role="web")
    assert "LOOPBOT_EFFORT=max is above LOOPBOT_MAX_EFFORT=high" in str(exc.value)
    ok = load_settings(env(LOOPBOT_EFFORT="max", LOOPBOT_MAX_EFFORT="max"), role="web")
    assert ok.effort == "max"
    assert load_settings(env(LOOPBOT_EFFORT=""), role="web").effort is None


def test_the_policy_comes_from_the_settings() -> None:
    s = load_settings(
        env(
            LOOPBOT_CRITIC_MODEL="claude-opus-5-5",
            LOOPBOT_MAX_EFFORT="xhigh",
            LOOPBOT_EFFORT="low",
        ),
        role="web",
    )
    policy = Ceilings.of(s).models
    assert policy == ModelPolicy(
        model=DEFAULT_MODEL,
        critic_model="claude-opus-5-5",
        allowed=frozenset({DEFAULT_MODEL, "claude-opus-5-5"}),
        max_effort="xhigh",
        effort="low",
    )


# -- loop.yml --------------------------------------------------------------------------------


def test_nothing_asked_runs_the_operators_choice() -> None:
    config, notes = load("")
    assert notes == []
    assert config.agent_model(CEILINGS) == "claude-sonnet-5-5"
    assert config.critic_model(CEILINGS) == "claude-opus-5-5"
    assert config.agent_effort(CEILINGS) == config.critic_effort(CEILINGS) == "medium"


def test_an_allowed_model_and_effort_within_the_ceiling_are_kept() -> None:
    config, notes = load(
        "agent:\n  model: claude-haiku-4-5\n  effort: low\ncritic:\n  model: claude-sonnet-5-5\n"
        "  effort: high\n"
    )
    assert notes == []
    assert (config.agent_model(CEILINGS), config.agent_effort(CEILINGS)) == (
        "claude-haiku-4-5",
        "low",
    )
    assert (config.critic_model(CEILINGS), config.critic_effort(CEILINGS)) == (
        "claude-sonnet-5-5",
        "high",
    )


def test_a_model_the_operator_does_not_allow_is_replaced_by_the_default_and_said() -> None:
    config, notes = load("agent:\n  model: claude-fable-5-1\ncritic:\n  model: gpt-9\n")
    assert config.agent_model(CEILINGS) == "claude-sonnet-5-5"
    assert config.critic_model(CEILINGS) == "claude-opus-5-5"
    assert notes[0].startswith("`agent.model`: `claude-fable-5-1` is not one this installation")
    assert "`claude-haiku-4-5`, `claude-opus-5-5`, `claude-sonnet-5-5`" in notes[0]
    assert "`LOOPBOT_ALLOWED_MODELS`" in notes[0] and "`claude-sonnet-5-5` is used" in notes[0]
    assert (
        notes[1].startswith("`critic.model`: `gpt-9`") and "`claude-opus-5-5` is used" in notes[1]
    )
    body = repo_config.clamped_comment(notes)
    assert all(n in body for n in notes)


def test_an_effort_above_the_ceiling_is_lowered_and_said() -> None:
    config, notes = load("agent:\n  effort: max\ncritic:\n  effort: xhigh\n")
    assert (config.agent.effort, config.critic.effort) == ("high", "high")
    assert notes == [
        "`agent.effort`: max asked, lowered to high (the operator's ceiling, `LOOPBOT_MAX_EFFORT`)",
        "`critic.effort`: xhigh asked, lowered to high (the operator's ceiling, "
        "`LOOPBOT_MAX_EFFORT`)",
    ]


def test_a_higher_ceiling_lets_more_effort_through() -> None:
    looser = Ceilings(models=ModelPolicy(max_effort="max"))
    config, notes = load("agent:\n  effort: max\n", looser)
    assert notes == [] and config.agent_effort(looser) == "max"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("agent:\n  effort: ultra\n", "`agent.effort`: Input should be 'low', 'medium'"),
        ("critic:\n  effort: 3\n", "`critic.effort`"),
        ("agent:\n  model: ''\n", "`agent.model`"),
        ("agent:\n  modle: claude-x\n", "`agent.modle`: unknown key"),
    ],
)
def test_a_bad_key_is_a_config_error(extra: str, problem: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(extra)
    assert any(p.startswith(problem) for p in exc.value.problems), exc.value.problems


def test_every_reader_gets_the_default_policy_without_settings() -> None:
    config = repo_config.parse("verify: x\nagent:\n  model: claude-fable-5-1\n  effort: max\n")
    assert config.agent.model is None and config.agent.effort == "high"
    assert config.agent_model(repo_config.DEFAULT_CEILINGS) == DEFAULT_MODEL
