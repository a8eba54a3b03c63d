"""What a ``REDIS_URL`` may be, and how it is shown: pure string rules, no connection.

Settings validate the URL with ``check_url`` at start-up; every message an operator sees
goes through ``mask_url`` or ``scrub`` so a password never reaches a log line.

Redis Sentinel is one more form of the same URL (``bot.io.redis.connect`` reads it)::

    redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER_NAME[/DB]
        [?sentinel_password=...&sentinel_username=...]

The hosts are the sentinels (port 26379 when left out); ``USER``/``PASSWORD`` and ``DB``
are the Redis master's (and its replicas'), ``sentinel_*`` the sentinels' own. The
environment may say the same in parts: ``REDIS_SENTINELS`` (the sentinels' host:port
list), ``REDIS_SENTINEL_MASTER`` (default ``mymaster``) and a ``redis://`` ``REDIS_URL``
for the password and db; ``effective_url`` turns them into this one URL, so that every
process, and everything that shows or redacts the URL, deals with one string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from redis.connection import parse_url

SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
MASK = "***"
DEFAULT_URL = "redis://localhost:6379/0"
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_SENTINEL_MASTER = "mymaster"
SENTINEL_PARAMS = ("sentinel_password", "sentinel_username")
_SENTINEL_FORM = (
    "expected redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]"
)
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._-]{0,252})?$")
_MASTER_NAME = re.compile(r"^[^\s/\x00-\x1f\x7f]{1,200}$")


def scheme_of(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def is_sentinel(url: str) -> bool:
    return scheme_of(url) == SENTINEL_SCHEME


def check_url(url: str) -> None:
    """Raise ``ValueError`` (without the password in it) unless redis-py can use ``url``."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        shown = f"'{scheme}://'" if scheme else "none"
        raise ValueError(
            f"scheme must be redis://, rediss:// or unix:// (or redis+sentinel:// for "
            f"Redis Sentinel; got {shown})"
        )
    if scheme == SENTINEL_SCHEME:
        parse_sentinel_url(url)
        return
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
    given = [k for k, _ in _query(_split(url)[2].partition("?")[2]) if k in SENTINEL_PARAMS]
    if given:
        raise ValueError(f"{given[0]} is for Sentinel only (a redis+sentinel:// URL)")
    try:
        # redis-py's own reading: the query parameters (db=, ssl_*=, ...)
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(scrub(str(exc), url).rstrip(".")) from None


# -- Sentinel -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SentinelSpec:
    """A ``redis+sentinel://`` URL, read: where the sentinels are and what to ask them."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def parse_hosts(text: str, what: str = "sentinel") -> tuple[tuple[str, int], ...]:
    """``HOST[:PORT],HOST[:PORT]...`` (IPv6 as ``[::1]:26379``); port 26379 when left out.

    The message of a ``ValueError`` names the bad entry (hosts are not secret)."""
    if not text.strip():
        raise ValueError(f"no {what} host")
    hosts: list[tuple[str, int]] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"an empty {what} address in the list (a stray comma?)")
        if item.startswith("["):
            host, close, tail = item[1:].partition("]")
            if not close or not host or (tail and not tail.startswith(":")):
                raise ValueError(f"{what} address {item!r}: expected [IPv6]:PORT")
            port_text = tail[1:] if tail else None
            if not re.fullmatch(r"[0-9A-Fa-f:.]+", host):
                raise ValueError(f"{what} address {item!r}: not an IPv6 address")
        else:
            host, colon, port_part = item.rpartition(":")
            if not colon:
                host, port_text = item, None
            else:
                port_text = port_part
            if not host:
                raise ValueError(f"{what} address {item!r}: no host")
            if not _HOSTNAME.match(host):
                raise ValueError(f"{what} address {item!r}: not a host name or IPv4 address")
        port = DEFAULT_SENTINEL_PORT
        if port_text is not None:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"{what} address {item!r}: bad port (expected 1-65535)")
            port = int(port_text)
        hosts.append((host, port))
    return tuple(hosts)


def parse_sentinel_url(url: str) -> SentinelSpec:
    """Read a ``redis+sentinel://`` URL; ``ValueError`` (never with a secret) if malformed."""
    if not is_sentinel(url):
        raise ValueError("not a redis+sentinel:// URL")
    _, userinfo, rest = _split(url)
    if "#" in rest:
        raise ValueError(f"a '#' in the URL ({_SENTINEL_FORM}; percent-encode it in a password)")
    where, _, query = rest.partition("?")
    hosts_text, slash, path = where.partition("/")
    if not hosts_text:
        raise ValueError(f"no sentinel host ({_SENTINEL_FORM})")
    sentinels = parse_hosts(hosts_text)
    segments = path.split("/") if slash else []
    if segments and segments[-1] == "":
        segments.pop()  # a trailing slash
    if not segments or not segments[0]:
        raise ValueError(f"no master name ({_SENTINEL_FORM})")
    master = unquote(segments[0])
    if not _MASTER_NAME.match(master):
        raise ValueError(f"master name {master!r} is not a Sentinel master name")
    if len(segments) > 2:
        raise ValueError(f"too many path parts after the master name ({_SENTINEL_FORM})")
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"db {segments[1]!r} is not a number ({_SENTINEL_FORM})")
        db = int(segments[1])
    params: dict[str, str] = {}
    for key, value in _query(query):
        if key not in SENTINEL_PARAMS:
            # Not echoed unless it looks like a name: it may be a password's tail.
            shown = repr(key) if _PARAM_NAME.match(key) else "(percent-encode & # in a password)"
            raise ValueError(
                f"unknown parameter {shown} (a redis+sentinel:// URL takes only "
                f"{' and '.join(SENTINEL_PARAMS)})"
            )
        params[key] = value
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return SentinelSpec(
        sentinels=sentinels,
        master=master,
        db=db,
        username=username,
        password=password,
        sentinel_username=params.get("sentinel_username") or None,
        sentinel_password=params.get("sentinel_password") or None,
    )


def sentinel_url(spec: SentinelSpec) -> str:
    """The ``redis+sentinel://`` URL that ``parse_sentinel_url`` reads back as ``spec``."""
    auth = ""
    if spec.username is not None or spec.password is not None:
        auth = quote(spec.username or "", safe="")
        if spec.password is not None:
            auth += ":" + quote(spec.password, safe="")
        auth += "@"
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in spec.sentinels)
    params = [
        f"{name}={quote(value, safe='')}"
        for name, value in (
            ("sentinel_username", spec.sentinel_username),
            ("sentinel_password", spec.sentinel_password),
        )
        if value
    ]
    query = "?" + "&".join(params) if params else ""
    return f"{SENTINEL_SCHEME}://{auth}{hosts}/{quote(spec.master, safe='')}/{spec.db}{query}"


def effective_url(env: Mapping[str, str]) -> str:
    """The one Redis URL an environment means: ``REDIS_URL``, or with ``REDIS_SENTINELS``
    the ``redis+sentinel://`` URL made of it, ``REDIS_SENTINEL_MASTER`` and ``REDIS_URL``'s
    user, password, db and ``sentinel_*`` parameters (its host and port are not used: the
    sentinels say where the master is). ``ValueError`` names the variables; no secret."""
    url = (env.get("REDIS_URL") or "").strip() or DEFAULT_URL
    sentinels = (env.get("REDIS_SENTINELS") or "").strip()
    master = (env.get("REDIS_SENTINEL_MASTER") or "").strip() or None
    if not sentinels:
        if master is not None:
            if not is_sentinel(url):
                raise ValueError(
                    "REDIS_SENTINEL_MASTER is set but REDIS_SENTINELS is not (nor a "
                    "redis+sentinel:// REDIS_URL): set REDIS_SENTINELS too, or unset it"
                )
            named = parse_sentinel_url(url).master
            if named != master:
                raise ValueError(
                    f"REDIS_SENTINEL_MASTER ({master!r}) and the master name in REDIS_URL "
                    f"({named!r}) differ: set one of them"
                )
        check_url(url)
        return url
    try:
        hosts = parse_hosts(sentinels)
    except ValueError as exc:
        raise ValueError(f"REDIS_SENTINELS: {exc}") from None
    if master is not None and not _MASTER_NAME.match(master):
        raise ValueError(f"REDIS_SENTINEL_MASTER: {master!r} is not a Sentinel master name")
    scheme = scheme_of(url)
    if scheme == SENTINEL_SCHEME:
        raise ValueError(
            "REDIS_SENTINELS is set and REDIS_URL is a redis+sentinel:// URL: name the "
            "sentinels in one of them only"
        )
    if scheme != "redis":
        raise ValueError(
            f"with REDIS_SENTINELS, REDIS_URL may only be redis:// (for the password and db; "
            f"its host is not used); {scheme or 'no scheme'}:// cannot be used through "
            "Sentinel here (no TLS or unix socket with Sentinel)"
        )
    # REDIS_URL may carry the sentinels' own credentials as parameters too.
    prefix, userinfo, rest = _split(url)
    where, _, query = rest.partition("?")
    pairs = _query(query)
    params = {k: v for k, v in pairs if k in SENTINEL_PARAMS}
    kept = "&".join(
        f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs if k not in SENTINEL_PARAMS
    )
    plain = prefix + (userinfo + "@" if userinfo else "") + where + ("?" + kept if kept else "")
    check_url(plain)
    read = parse_url(plain)  # type: ignore[no-untyped-call]
    unused = sorted(set(read) - {"host", "port", "username", "password", "db"})
    if unused:
        raise ValueError(
            f"REDIS_URL's parameters {', '.join(unused)} are not used with REDIS_SENTINELS "
            f"(only its user, password and db are)"
        )
    return sentinel_url(
        SentinelSpec(
            sentinels=hosts,
            master=master or DEFAULT_SENTINEL_MASTER,
            db=int(read.get("db") or 0),
            username=read.get("username") or None,
            password=read.get("password"),
            sentinel_username=params.get("sentinel_username") or None,
            sentinel_password=params.get("sentinel_password") or None,
        )
    )


# -- showing a URL ----------------------------------------------------------------------------

_SECRET_PARAM = re.compile(r"(?i)([?&][^=&#]*password[^=&#]*=)([^&#]*)")
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
# What follows the userinfo of a redis+sentinel:// URL: its hosts, then the master's path.
_SENTINEL_HOSTS = re.compile(r"[A-Za-z0-9._\-\[\]:,]+/")


def _query(query: str) -> list[tuple[str, str]]:
    """``a=1&b=2`` as pairs, percent-decoded (not ``+`` as space: a password may hold one)."""
    pairs = []
    for part in query.split("&"):
        if part:
            key, _, value = part.partition("=")
            pairs.append((unquote(key), unquote(value)))
    return pairs


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


def _split(url: str) -> tuple[str, str, str]:
    """``_userinfo``, but an ``@`` in a query parameter's value (an unescaped sentinel
    password, say) is not taken for the end of the userinfo."""
    if is_sentinel(url):
        # The userinfo ends at the last "@" that is followed by the hosts and a path.
        prefix, _, rest = url.partition("://")
        prefix += "://"
        at = len(rest)
        while (at := rest.rfind("@", 0, at)) >= 0:
            if _SENTINEL_HOSTS.match(rest, at + 1) and not _SECRET_PARAM.search(rest, 0, at):
                return prefix, rest[:at], rest[at + 1 :]
    masked = _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, url)
    prefix, userinfo, _ = _userinfo(masked)
    if not userinfo or url[: len(prefix) + len(userinfo)] != prefix + userinfo:
        if userinfo:  # a parameter inside the userinfo itself: read it as written
            return _userinfo(url)
        return prefix, "", url[len(prefix) :]
    return prefix, userinfo, url[len(prefix) + len(userinfo) + 1 :]


def _pieces(rest: str) -> tuple[str, list[tuple[str, str | None]], str | None]:
    """``rest`` (what follows the userinfo) as (hosts and path, query pieces, fragment).

    A piece is ``(name, value)``, or ``(piece, None)`` when it is no ``name=value`` at
    all: the tail of a password with an unescaped ``&``, which is secret too."""
    rest, hash_, fragment = rest.partition("#")
    where, _, query = rest.partition("?")
    pieces: list[tuple[str, str | None]] = []
    for part in query.split("&") if query else []:
        name, eq, value = part.partition("=")
        pieces.append((name, value) if eq and _PARAM_NAME.match(name) else (part, None))
    return where, pieces, fragment if hash_ else None


def _secret_piece(name: str, value: str | None) -> bool:
    return value is None or "password" in name.lower()


def _secrets(url: str) -> list[str]:
    """The secret parts of ``url``: its password (as written and decoded), the value of
    any ``*password*`` query parameter (``sentinel_password`` too), and whatever in the
    query or a fragment cannot be read as a parameter."""
    _, userinfo, rest = _split(url)
    found = []
    if ":" in userinfo:
        password = userinfo.partition(":")[2]
        found += [password, unquote(password)]
    elif userinfo:  # ``redis://TOKEN@host``: treat a lone userinfo as secret too
        found += [userinfo, unquote(userinfo)]
    for match in _SECRET_PARAM.finditer(url):
        found += [match.group(2), unquote(match.group(2))]
    _, pieces, fragment = _pieces(rest)
    for name, value in pieces:
        if _secret_piece(name, value):
            secret = name if value is None else value
            found += [secret, unquote(secret)]
    if fragment:
        found += [fragment, unquote(fragment)]
    # Longest first, so a decoded form inside a longer one is replaced whole.
    return sorted({s for s in found if s}, key=len, reverse=True)


def mask_url(url: str) -> str:
    """``url`` as an operator may see it: the password, ``*password*`` params and anything
    in the query that is no ``name=value`` (a password's unescaped tail) masked."""
    prefix, userinfo, rest = _split(url)
    where, pieces, fragment = _pieces(rest)
    shown = [
        MASK if value is None else f"{name}={MASK if _secret_piece(name, value) else value}"
        for name, value in pieces
    ]
    rest = where + ("?" + "&".join(shown) if pieces else "") + ("#" + MASK if fragment else "")
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
