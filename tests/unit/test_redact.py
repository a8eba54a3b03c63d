"""Secrets out of the session log: exact values and the shapes that give a token away."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.settings import load_settings
from bot.core.text.redact import MARK, Redactor, settings_secrets

BODY = [
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK",
    "LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo",
]
PEM = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(BODY) + "\n-----END RSA PRIVATE KEY-----\n"
TOKEN = "ghs_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # GitHub tokens of every prefix, and fine-grained personal ones
        (f"token {TOKEN} here", f"token {MARK} here"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123", MARK),
        ("gho_abcdefghijklmnopqrstuvwxyz0123,", f"{MARK},"),
        ("(ghu_abcdefghijklmnopqrstuvwxyz0123)", f"({MARK})"),
        ("ghr_abcdefghijklmnopqrstuvwxyz0123", MARK),
        ("GH_TOKEN_ghs_abcdefghijklmnopqrstuvwxyz0123", f"GH_TOKEN_{MARK}"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", MARK),
        # Anthropic keys
        (
            "ANTHROPIC_API_KEY=sk-ant-api03-AbCdEf_GhIjKlMnOpQrStUv-wxyz",
            f"ANTHROPIC_API_KEY={MARK}",
        ),
        # Credentials in URLs: the user name stays, the password goes
        (
            "remote: https://x-access-token:v1.abc123def456@github.com/o/r.git",
            f"remote: https://x-access-token:{MARK}@github.com/o/r.git",
        ),
        ("redis://:hunter2hunter2@redis:6379/0", f"redis://:{MARK}@redis:6379/0"),
        ("postgres://app:pa55word@db/app", f"postgres://app:{MARK}@db/app"),
        # Authorization headers, whatever the scheme's case
        ("Authorization: Bearer eyJhbGciOi.abc.def", f"Authorization: Bearer {MARK}"),
        ("> authorization: token 0123456789abcdef", f"> authorization: token {MARK}"),
        ("-H 'Authorization: Basic dXNlcjpwYXNz'", f"-H 'Authorization: Basic {MARK}'"),
        # Not secrets: left alone
        ("gh_short ghs_tooshort sk-ant-short", "gh_short ghs_tooshort sk-ant-short"),
        ("http://localhost:8080/path@v2 and user@example.com", None),
        ("Authorization: see the docs", None),
        ("", ""),
    ],
)
def test_token_shapes(text: str, expected: str | None) -> None:
    assert Redactor()(text) == (text if expected is None else expected)


@pytest.mark.parametrize(
    "text",
    [
        PEM,
        "key:\n" + PEM + "done",
        PEM.replace("\n", "\\n"),  # a one-line env file's way of writing it
        PEM.replace("RSA ", ""),  # PKCS#8
        PEM[: PEM.index("-----END")],  # cut before its END line
    ],
)
def test_pem_private_key_blocks(text: str) -> None:
    out = Redactor()(text)
    assert "PRIVATE KEY" not in out and all(line[:20] not in out for line in BODY)
    assert MARK in out


def test_exact_secrets_anywhere_in_the_text() -> None:
    redact = Redactor(["webhook-secret-123", "dashboard-token-xyz"])
    text = "a=webhook-secret-123&b=xdashboard-token-xyzx\nwebhook-secret-123"
    assert redact(text) == f"a={MARK}&b=x{MARK}x\n{MARK}"


def test_short_values_are_not_secrets() -> None:
    # Seven characters and less would blank out ordinary words all over a log.
    redact = Redactor(["", "s", "admin", "1234567"])
    text = "s admin 1234567 stays"
    assert redact(text) == text


def test_the_longest_secret_wins() -> None:
    redact = Redactor(["abcdefgh", "abcdefgh-and-more"])
    assert redact("x abcdefgh-and-more y abcdefgh") == f"x {MARK} y {MARK}"


def test_with_secrets_adds_to_what_it_knew() -> None:
    base = Redactor(["first-secret"])
    more = base.with_secrets("v1.installation-token")
    assert more("first-secret v1.installation-token") == f"{MARK} {MARK}"
    assert base("v1.installation-token") == "v1.installation-token"  # unchanged


def test_secret_with_regex_characters() -> None:
    assert Redactor(["a+b*c?(d)[e]"])("x a+b*c?(d)[e] y") == f"x {MARK} y"


@pytest.mark.parametrize(
    "text",
    [
        f"{TOKEN} Authorization: Bearer abcdefgh https://x-access-token:{TOKEN}@h/ redacted",
        PEM + "\nredis://u:passw0rd!@h/0 sk-ant-api03-AbCdEf_GhIjKlMnOpQrStUv",
        "a [redacted] b",
    ],
)
def test_idempotent(text: str) -> None:
    redact = Redactor(["passw0rd!", "redacted", "[redacted]"])
    once = redact(text)
    assert redact(once) == once


def test_settings_secrets_every_secret_setting() -> None:
    env = {
        "GITHUB_APP_ID": "12",
        "GITHUB_PRIVATE_KEY": PEM.replace("\n", "\\n"),
        "GITHUB_WEBHOOK_SECRET": "webhook-secret-value",
        "ANTHROPIC_API_KEY": "anthropic-key-value",
        "LOOPBOT_DASHBOARD_TOKEN": "dashboard-token-value",
        "REDIS_URL": "redis://default:redis%2Fpassword@redis:6379/0",
    }
    found = settings_secrets(load_settings(env))
    for value in (
        "webhook-secret-value",
        "anthropic-key-value",
        "dashboard-token-value",
        "redis%2Fpassword",  # as written in the URL
        "redis/password",  # and decoded
        PEM,
        *BODY,  # each line of the key's body: a log may show one
    ):
        assert value in found, value
    redact = Redactor(found)
    log = f"$ sed -n 3p key.pem\n{BODY[1]}\nconnecting with redis/password"
    assert redact(log) == f"$ sed -n 3p key.pem\n{MARK}\nconnecting with {MARK}"


def test_settings_secrets_key_from_a_file(tmp_path: Path) -> None:
    key = tmp_path / "app.pem"
    key.write_text(PEM)
    env = {"GITHUB_APP_ID": "12", "GITHUB_PRIVATE_KEY_PATH": str(key)}
    settings = load_settings({**env, "GITHUB_WEBHOOK_SECRET": "whsec-12345"})
    found = settings_secrets(settings)
    assert PEM in found and BODY[0] in found and "whsec-12345" in found
    key.unlink()  # gone since start-up: nothing of it to look for, and nothing raised
    assert settings_secrets(settings) == ["whsec-12345"]
