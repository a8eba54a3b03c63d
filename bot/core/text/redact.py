"""Secrets out of text that people will read: the session log (dashboard, CLI, API).

Two nets. Exact values: whatever the worker itself holds secret (``settings_secrets``)
plus what a caller adds (the installation token of the moment). Known shapes: tokens
whose form gives them away wherever they came from (a token the agent found in the
repository, a key it printed from the environment), PEM private key blocks, credentials
in a URL's userinfo and in an ``Authorization`` header.

Each pass replaces what it finds with ``[redacted]``, which no pass matches again, so
redaction is idempotent. Exact values shorter than 8 characters are ignored: a short
value ("admin", "1234") is more likely an ordinary word than a secret, and would blank
out half of a log.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, unquote

from pydantic import SecretStr

from bot.core.redis_url import _secrets as redis_url_secrets
from bot.core.settings import Settings

MARK = "[redacted]"
MIN_SECRET = 8
# A line of a PEM key's base64 body this long is worth redacting alone: a log may show
# a fragment of the key (a cut line, one line of a `cat`) without its BEGIN line.
MIN_KEY_LINE = 20

# Whole PEM private key blocks, also with "\n" written as two characters (one-line env
# files) and without their END line (a cut log): the body runs as far as base64 goes.
_PEM = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"
    r"[A-Za-z0-9+/=\s\\]*"
    r"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----)?"
)
# Token shapes: replaced whole. No word boundary in front: ``GH_TOKEN_ghs_...`` and
# ``--token=ghs_...`` alike.
_TOKENS = re.compile(
    r"gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens (installation: ghs_, user: ghu_, ...)
    r"|github_pat_[A-Za-z0-9_]{20,}"  # fine-grained personal access tokens
    r"|sk-ant-[A-Za-z0-9_-]{20,}"  # Anthropic API keys
)
# Credentials next to what names them: the name stays, so a reader sees what was there.
_KEEP_PREFIX: tuple[re.Pattern[str], ...] = (
    # https://x-access-token:TOKEN@github.com/... (git remotes)
    # (no colon in the token: "x-access-token:" repeated must not make each try rescan
    # the rest of the text, which was quadratic)
    re.compile(r"(?i)(x-access-token:)[^@\s/:]+(?=@)"),
    # Any other URL's password: scheme://user:PASSWORD@host
    # (scheme and user bounded: each try then costs a few characters, even on a long word)
    re.compile(r"(?i)([a-z][a-z0-9+.-]{0,19}://[^:/\s@]{0,64}:)(?!\[redacted\]@)[^@\s/]+(?=@)"),
    # Authorization: Bearer TOKEN / token TOKEN / Basic CREDENTIALS
    re.compile(r"(?i)(authorization:\s*(?:bearer|token|basic)\s+)(?!\[redacted\])[^\s'\"]+"),
)


class Redactor:
    """``redact(text)``: ``text`` with every known secret replaced by ``[redacted]``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        kept = {s for s in secrets if len(s) >= MIN_SECRET and s not in MARK}
        self._secrets = tuple(sorted(kept, key=len, reverse=True))
        # Longest first: a secret that contains another is replaced whole.
        self._exact = (
            re.compile("|".join(re.escape(s) for s in self._secrets)) if self._secrets else None
        )

    def with_secrets(self, *more: str) -> Redactor:
        """A redactor that also knows ``more`` (the installation token of the moment)."""
        return Redactor((*self._secrets, *more))

    def __call__(self, text: str) -> str:
        if not text:
            return text
        # The PEM block first: an exact key line replaced inside it would end its match.
        text = _PEM.sub(MARK, text)
        if self._exact is not None:
            text = self._replace_exact(text)
        text = _TOKENS.sub(MARK, text)
        for pattern in _KEEP_PREFIX:
            text = pattern.sub(_keep_name, text)
        return text

    def _replace_exact(self, text: str) -> str:
        """Every place any secret covers, overlaps merged: with secrets ``AB`` and ``BC``,
        ``ABC`` goes whole (one alternation would leave the ``C``)."""
        assert self._exact is not None
        if self._exact.search(text) is None:
            return text
        spans: list[tuple[int, int]] = []
        for secret in self._secrets:
            at = text.find(secret)
            while at != -1:
                spans.append((at, at + len(secret)))
                at = text.find(secret, at + 1)
        spans.sort()
        merged: list[list[int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out, last = [], 0
        for start, end in merged:
            out += [text[last:start], MARK]
            last = end
        return "".join([*out, text[last:]])


def deep(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` (JSON-like data) with every string in it redacted, dict keys too: a
    finding's title becomes a key (``sev1_rounds``), and a key is shown like a value."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list | tuple):
        return [deep(v, redact) for v in value]
    if isinstance(value, dict):
        return {deep(k, redact): deep(v, redact) for k, v in value.items()}
    return value


def _keep_name(m: re.Match[str]) -> str:
    return m.group(1) + MARK


def settings_secrets(settings: Settings) -> list[str]:
    """Every secret value the worker holds: each ``SecretStr`` setting, the GitHub App's
    private key (whole, as written, and each line of its body), the Redis password."""
    found: list[str] = []
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
    found += _key_secrets(settings.private_key_pem)
    found += url_secrets(settings.redis_url)
    return _unique(found)


def _key_secrets(read_pem: Callable[[], str]) -> list[str]:
    """The private key whole and each base64 line of its body long enough to tell."""
    try:
        pem = read_pem()
    except OSError:  # the key file went away: nothing of it to look for
        return []
    lines = [line.strip() for line in pem.splitlines()]
    body = [line for line in lines if len(line) >= MIN_KEY_LINE and "-----" not in line]
    return [pem, pem.strip(), pem.replace("\n", "\\n"), *body]


def url_secrets(url: str) -> list[str]:
    """The password in ``url``'s userinfo (or a lone token there) and in any
    ``*password*`` query parameter, as written, decoded and encoded: a log may show any."""
    found = redis_url_secrets(url)
    return [*found, *(quote(unquote(s), safe="") for s in found)]


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))
