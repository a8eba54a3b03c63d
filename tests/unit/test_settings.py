from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.settings import SettingsError, load_settings

KEY = "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----\n"


def base() -> dict[str, str]:
    return {"GITHUB_APP_ID": "12", "GITHUB_PRIVATE_KEY": KEY, "GITHUB_WEBHOOK_SECRET": "s"}


def test_defaults_from_the_contract() -> None:
    s = load_settings(base(), role="web")
    assert s.redis_url == "redis://localhost:6379/0"
    assert s.api_url == "https://api.github.com"
    assert s.github_app_id == 12


def test_missing_variables_are_named() -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings({}, role="web")
    text = str(exc.value)
    assert "GITHUB_APP_ID: is required" in text
    assert "GITHUB_WEBHOOK_SECRET: is required" in text


def test_malformed_variables_are_named() -> None:
    env = {**base(), "GITHUB_APP_ID": "twelve", "GITHUB_API_URL": "not a url"}
    with pytest.raises(SettingsError) as exc:
        load_settings(env, role="web")
    assert "GITHUB_APP_ID" in str(exc.value) and "GITHUB_API_URL" in str(exc.value)


def test_private_key_must_be_given_once_and_be_pem(tmp_path: Path) -> None:
    env = base()
    del env["GITHUB_PRIVATE_KEY"]
    with pytest.raises(SettingsError, match="GITHUB_PRIVATE_KEY or GITHUB_PRIVATE_KEY_PATH"):
        load_settings(env)
    with pytest.raises(SettingsError, match=r"GITHUB_PRIVATE_KEY_PATH: .*no such file"):
        load_settings({**env, "GITHUB_PRIVATE_KEY_PATH": str(tmp_path / "nope.pem")})
    with pytest.raises(SettingsError, match="not a PEM key"):
        load_settings({**env, "GITHUB_PRIVATE_KEY": "hunter2"})
    path = tmp_path / "key.pem"
    path.write_text(KEY)
    s = load_settings({**env, "GITHUB_PRIVATE_KEY_PATH": str(path)})
    assert s.private_key_pem() == KEY


def test_escaped_newlines_in_key_are_unescaped() -> None:
    s = load_settings({**base(), "GITHUB_PRIVATE_KEY": KEY.replace("\n", "\\n")})
    assert s.private_key_pem() == KEY


def test_worker_needs_the_model_key() -> None:
    with pytest.raises(SettingsError, match="ANTHROPIC_API_KEY"):
        load_settings(base(), role="worker")
    assert load_settings({**base(), "ANTHROPIC_API_KEY": "k"}, role="worker")


def test_the_env_file_fills_what_the_environment_leaves_unset(tmp_path: Path) -> None:
    from bot.core.settings import environment

    env_file = tmp_path / "loopbot.env"
    key = KEY.replace("\n", "\\n")
    env_file.write_text(
        f'GITHUB_APP_ID=99\nGITHUB_PRIVATE_KEY="{key}"\nGITHUB_WEBHOOK_SECRET=from-file\n'
        "# a comment\nexport REDIS_URL=redis://file:6379/1\n"
    )
    process = {"LOOPBOT_ENV_FILE": str(env_file), "GITHUB_WEBHOOK_SECRET": "from-env"}
    merged = environment(process)
    s = load_settings(merged, role="web")
    assert s.github_app_id == 99  # from the file
    assert s.github_webhook_secret.get_secret_value() == "from-env"  # the environment wins
    assert s.redis_url == "redis://file:6379/1"  # `export` lines too
    assert s.private_key_pem() == KEY  # the double-quoted \n became newlines


def test_no_env_file_is_no_variables_and_an_unreadable_one_is_named(tmp_path: Path) -> None:
    from bot.core.settings import environment

    assert environment({"LOOPBOT_ENV_FILE": str(tmp_path / "absent")}) == {
        "LOOPBOT_ENV_FILE": str(tmp_path / "absent")
    }
    bad = tmp_path / "bad.env"
    bad.write_bytes(b"GITHUB_APP_ID=\xff\xfe\n")
    with pytest.raises(SettingsError) as exc:
        environment({"LOOPBOT_ENV_FILE": str(bad)})
    assert "LOOPBOT_ENV_FILE" in str(exc.value) and str(bad) in str(exc.value)


def test_an_env_file_line_that_does_not_parse_is_named_not_skipped(tmp_path: Path) -> None:
    """python-dotenv skips such a line with a warning: the process would start with the
    other values. A red team's file: an unclosed quote, then a colon for an equals sign."""
    from bot.core.settings import environment

    bad = tmp_path / "bad.env"
    bad.write_text('GITHUB_APP_ID=12\nLOOPBOT_MAX_PARALLEL="0\nLOOPBOT_TRUSTED_PROXY: 1\n')
    with pytest.raises(SettingsError, match=r"LOOPBOT_ENV_FILE \(.*bad\.env\): cannot parse line"):
        environment({"LOOPBOT_ENV_FILE": str(bad)})


def test_an_unreadable_key_file_is_named(tmp_path: Path) -> None:
    env = base()
    del env["GITHUB_PRIVATE_KEY"]
    binary = tmp_path / "key.der"
    binary.write_bytes(b"\x30\x82\xff\xfe")
    with pytest.raises(SettingsError, match=r"GITHUB_PRIVATE_KEY_PATH: cannot be read"):
        load_settings({**env, "GITHUB_PRIVATE_KEY_PATH": str(binary)})
    # /proc/self/mem is a file that is there and cannot be read from its start.
    with pytest.raises(SettingsError, match=r"GITHUB_PRIVATE_KEY_PATH: cannot be read"):
        load_settings({**env, "GITHUB_PRIVATE_KEY_PATH": "/proc/self/mem"})


@pytest.mark.parametrize(("value", "ok"), [("-1", False), ("0", True), ("2", True), ("true", True)])
def test_a_negative_trusted_proxy_count_is_refused_with_the_settings(value: str, ok: bool) -> None:
    env = {**base(), "LOOPBOT_TRUSTED_PROXY": value}
    if ok:
        load_settings(env, role="web")
    else:
        with pytest.raises(SettingsError, match="LOOPBOT_TRUSTED_PROXY: must be true, false"):
            load_settings(env, role="web")
