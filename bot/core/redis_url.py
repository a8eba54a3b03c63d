"""What a ``REDIS_URL`` may be, and how it is shown: pure string rules, no connection.

Settings validate the URL with ``check_url`` at start-up; every message an operator sees
goes through ``mask_url`` or ``scrub`` so a password never reaches a log line.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from redis.connection import parse_url

SCHEMES = ("redis", "rediss", "unix")
MASK = "***"


def check_url(url: str) -> None:
    """Raise ``ValueError`` (without the password in it) unless redis-py can use ``url``."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        shown = f"'{scheme}://'" if scheme else "none"
        raise ValueError(f"scheme must be redis://, rediss:// or unix:// (got {shown})")
    try:
        parts = urlsplit(url)
        _ = parts.port  # a non-numeric port raises here
    except ValueError:
        raise ValueError(
            "not a valid URL (check the host and port; a password with / ? # @ or : "
            "in it must be percent-encoded)"
        ) from None
    if scheme != "unix" and not parts.hostname:
        raise ValueError("no host (expected redis://[[USER]:PASSWORD@]HOST[:PORT][/DB])")
    if scheme == "unix" and not parts.path:
        raise ValueError("no socket path (expected unix:///path/to/redis.sock)")
    try:
        # redis-py's own reading: the query parameters (db=, ssl_*=, ...)
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(scrub(str(exc), url).rstrip(".")) from None


_SECRET_PARAM = re.compile(r"(?i)([?&][^=&#]*password[^=&#]*=)([^&#]*)")


def _userinfo(url: str) -> tuple[str, str, str]:
    """``(scheme://, userinfo, rest)``, split at the *last* ``@``.

    Not ``urlsplit``: an operator's password with an unescaped ``/``, ``#`` or ``@`` makes
    urlsplit misread the host, and the password would then pass as a path.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return scheme + sep, "", rest
    return scheme + sep, userinfo, host


def _secrets(url: str) -> list[str]:
    """The secret parts of ``url``: its password (as written and decoded), and the value
    of any ``*password*`` query parameter."""
    _, userinfo, rest = _userinfo(url)
    found = []
    if ":" in userinfo:
        password = userinfo.partition(":")[2]
        found += [password, unquote(password)]
    elif userinfo:  # ``redis://TOKEN@host``: treat a lone userinfo as secret too
        found += [userinfo, unquote(userinfo)]
    for match in _SECRET_PARAM.finditer(rest):
        found += [match.group(2), unquote(match.group(2))]
    # Longest first, so a decoded form inside a longer one is replaced whole.
    return sorted({s for s in found if s}, key=len, reverse=True)


def mask_url(url: str) -> str:
    """``url`` as an operator may see it: the password (and ``*password*`` params) masked."""
    prefix, userinfo, rest = _userinfo(url)
    rest = _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, rest)
    if not userinfo:
        return prefix + rest
    if ":" not in userinfo:
        return f"{prefix}{MASK}@{rest}"
    return f"{prefix}{userinfo.partition(':')[0]}:{MASK}@{rest}"


def scrub(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` replaced by the mask."""
    for secret in _secrets(url):
        text = text.replace(secret, MASK)
    return text


# A link closed mid-handshake (a server restarting, say) is worth retrying; a rejected
# certificate or protocol is not.
