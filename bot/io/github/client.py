"""loopbot's GitHub client: githubkit with App auth, timeouts, retries, idempotent writes.

``GitHubApp`` holds the App identity and mints installation tokens (cached until five
minutes before they expire, minted again on a 401). ``Installation`` is the interface
jobs use; it returns small models with only the fields loopbot reads, and every call
goes through ``_call`` which applies ``bot.io.github.failures.classify``.

Writes a retry could repeat (comments, reviews, pull requests, check runs) look for
what an earlier attempt may have written before writing again: a hidden marker in the
body, the branch of a pull request, the name and head of a check run.

Every text loopbot writes goes through ``Installation._text`` (or ``_title``): the
secrets the worker holds and the installation's token of the moment are redacted
(``bot.core.text.redact``, the same redaction as the session log), then the text is
defused (``bot.core.text.defuse``). No caller can forget either.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar, cast

from githubkit import AppAuthStrategy, GitHub, TokenAuthStrategy
from githubkit.cache import MemCacheStrategy
from githubkit.exception import GitHubException, RequestFailed
from httpx import TransportError
from pydantic import BaseModel, ConfigDict
from redis import Redis

from bot.core.settings import Settings
from bot.core.text.defuse import one_line, safe_text
from bot.core.text.redact import Redactor, settings_secrets
from bot.io.github.failures import (
    Fatal,
    Forbidden,
    GitHubError,
    NotFound,
    Reauthenticate,
    RetryAfter,
    Unprocessable,
    classify,
    message_of,
)
from bot.io.github.pace import SharedPace
from bot.io.logs import get_logger
from bot.io.preload import tls

T = TypeVar("T")
log = get_logger("loopbot.github")

WRITE_PERMISSIONS = frozenset({"admin", "write", "maintain"})
TOKEN_MARGIN_SECONDS = 300


def marker(key: str) -> str:
    """A hidden tag that lets loopbot find what it wrote before."""
    return f"<!-- loopbot:{key} -->"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class RepoInfo(_Model):
    full_name: str
    id: int = 0  # GitHub's, which a new repository of the same name does not inherit
    default_branch: str
    clone_url: str
    private: bool = False
    html_url: str = ""


class IssueInfo(_Model):
    number: int
    state: str
    title: str
    body: str | None = None
    labels: tuple[str, ...] = ()
    author: str = ""
    html_url: str = ""
    is_pull: bool = False
    author_type: str = "User"  # "Bot" for an App's issues (find_issue trusts only those)

    @property
    def open(self) -> bool:
        return self.state == "open"


class CommentInfo(_Model):
    id: int
    body: str = ""
    author: str = ""
    author_type: str = "User"
    html_url: str = ""


class PullInfo(_Model):
    number: int
    state: str
    merged: bool = False
    head_ref: str
    head_sha: str
    base_ref: str
    mergeable: bool | None = None
    mergeable_state: str = "unknown"
    html_url: str = ""
    title: str = ""
    body: str | None = None
    # The size of the change (None when GitHub did not say), and the merge commit.
    additions: int | None = None
    deletions: int | None = None
    changed_files: int | None = None
    merge_commit_sha: str | None = None


class ReviewInfo(_Model):
    id: int
    state: str
    body: str | None = ""
    commit_id: str | None = None
    author: str = ""
    author_type: str = "User"


class CheckRunInfo(_Model):
    id: int
    name: str
    head_sha: str
    status: str
    conclusion: str | None = None
    app_id: int | None = None


class MergeResult(_Model):
    sha: str
    merged: bool


def _issue(d: Any) -> IssueInfo:
    return IssueInfo(
        number=d["number"],
        state=d["state"],
        title=d.get("title") or "",
        body=d.get("body"),
        labels=tuple(lb["name"] for lb in d.get("labels") or [] if isinstance(lb, dict)),
        author=(d.get("user") or {}).get("login", ""),
        html_url=d.get("html_url") or "",
        is_pull="pull_request" in d,
        author_type=(d.get("user") or {}).get("type", "User"),
    )


def _comment(d: Any) -> CommentInfo:
    user = d.get("user") or {}
    return CommentInfo(
        id=d["id"],
        body=d.get("body") or "",
        author=user.get("login", ""),
        author_type=user.get("type", "User"),
        html_url=d.get("html_url") or "",
    )


def _pull(d: Any) -> PullInfo:
    return PullInfo(
        number=d["number"],
        state=d["state"],
        merged=bool(d.get("merged")),
        head_ref=d["head"]["ref"],
        head_sha=d["head"]["sha"],
        base_ref=d["base"]["ref"],
        mergeable=d.get("mergeable"),
        mergeable_state=d.get("mergeable_state") or "unknown",
        html_url=d.get("html_url") or "",
        title=d.get("title") or "",
        body=d.get("body"),
        additions=d.get("additions"),
        deletions=d.get("deletions"),
        changed_files=d.get("changed_files"),
        merge_commit_sha=d.get("merge_commit_sha"),
    )


def _review(d: Any) -> ReviewInfo:
    user = d.get("user") or {}
    return ReviewInfo(
        id=d["id"],
        state=d["state"],
        body=d.get("body"),
        commit_id=d.get("commit_id"),
        author=user.get("login", ""),
        author_type=user.get("type", "User"),
    )


def _check_run(d: Any) -> CheckRunInfo:
    return CheckRunInfo(
        id=d["id"],
        name=d["name"],
        head_sha=d["head_sha"],
        status=d["status"],
        conclusion=d.get("conclusion"),
        app_id=(d.get("app") or {}).get("id"),
    )


def convert_manifest_code(api_url: str, code: str, timeout: float = 30.0) -> dict[str, Any]:
    """``POST /app-manifests/{code}/conversions``: the App that GitHub registered from a
    manifest, with its private key and webhook secret. Needs no credentials (the code is
    one; GitHub accepts it once, within an hour). Not retried: a second try of a code the
    first one used up would only hide the first answer."""
    with GitHub(
        base_url=api_url.rstrip("/") + "/",
        timeout=timeout,
        auto_retry=False,
        http_cache=False,
        user_agent="loopbot",
    ) as gh:
        try:
            return cast(dict[str, Any], gh.rest.apps.create_from_manifest(code).json())
        except RequestFailed as exc:
            status = exc.response.status_code
            raise GitHubError(f"GitHub answered {status}: {message_of(exc)}", status) from None
        except (GitHubException, TransportError) as exc:
            raise GitHubError(f"no answer from GitHub: {exc}") from None


# The issue's text and who last changed it: the body's last editor (``editor``, with
# ``lastEditedAt``: no question of how ``userContentEdits`` is ordered) and its latest
# retitling (rename events are in time order: ``last: 1`` is the newest).
EDITORS_QUERY = """
query($owner: String!, $name: String!, $number: Int!) {
  repository(owner: $owner, name: $name) {
    issue(number: $number) {
      title
      body
      lastEditedAt
      editor { __typename login }
      userContentEdits(first: 1) { totalCount }
      timelineItems(last: 1, itemTypes: [RENAMED_TITLE_EVENT]) {
        totalCount
        nodes { ... on RenamedTitleEvent { createdAt actor { __typename login } } }
      }
    }
  }
}
"""


@dataclass(frozen=True)
class Editor:
    """Who made an issue's latest edit of one kind (``what``: body or title), and when."""

    what: str
    login: str  # "" for an account since deleted
    bot: bool  # an App: GraphQL names it by its slug, without "[bot]"
    at: str = ""  # when, to the second
    count: int = 0  # how many such edits there have been: two in one second differ


@dataclass(frozen=True)
class IssueEdits:
    """The issue's text as GraphQL read it, with its latest editors (none: never edited)."""

    title: str
    body: str
    editors: tuple[Editor, ...]

    @property
    def stamp(self) -> str:
        """When the body and the title were last changed: a later edit changes it."""
        return "|".join(f"{e.what}@{e.at}+{e.count}" for e in self.editors)


def _editor(what: str, who: dict[str, Any], at: str, count: int) -> Editor:
    return Editor(what, str(who.get("login") or ""), who.get("__typename") == "Bot", at, count)


def _split(repo: str) -> tuple[str, str]:
    owner, _, name = repo.partition("/")
    return owner, name


class GitHubApp:
    """The App identity: a JWT-authenticated client and the installation token cache."""

    def __init__(
        self,
        settings: Settings,
        sleep: Callable[[float], None] = time.sleep,
        redis: Redis | None = None,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        # With Redis: one pace per installation, shared by every worker (pace.py).
        self.redis = redis
        self._lock = threading.Lock()
        self._tokens: dict[int, tuple[str, float]] = {}
        self._redactor: Redactor | None = None
        self._slug: str | None = None
        self.client = GitHub(
            AppAuthStrategy(settings.github_app_id, settings.private_key_pem()),
            base_url=settings.api_url + "/",
            timeout=settings.github_timeout,
            auto_retry=False,  # retries are decided in bot.io.github.failures, once for all calls
            http_cache=False,
            user_agent="loopbot",
            ssl_verify=tls(),  # one TLS context per process, not one per client
            # githubkit's default cache is one per process, keyed by App id only: a JWT
            # signed with a rotated (or another test's) key would be reused. Own cache.
            cache_strategy=MemCacheStrategy(),
        )

    def installation_token(self, installation_id: int, *, refresh: bool = False) -> str:
        """A token for ``installation_id``; reused until five minutes before it expires."""
        with self._lock:
            cached = self._tokens.get(installation_id)
            if cached and not refresh and cached[1] - time.time() > TOKEN_MARGIN_SECONDS:
                return cached[0]
        data = _with_retries(
            lambda: self.client.rest.apps.create_installation_access_token(installation_id).json(),
            self.settings.github_max_retry_wait,
            self._sleep,
        )
        expires = datetime.strptime(data["expires_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        with self._lock:
            self._tokens[installation_id] = (data["token"], expires.timestamp())
        return str(data["token"])

    def installation(self, installation_id: int) -> Installation:
        return Installation(self, installation_id)

    def redactor(self) -> Redactor:
        """Every secret value of the settings (built once: it reads the private key)."""
        if self._redactor is None:
            self._redactor = Redactor(settings_secrets(self.settings))
        return self._redactor

    def slug(self) -> str:
        """The App's slug (its bot is ``SLUG[bot]``), asked once."""
        if self._slug is None:
            self._slug = str(self.app_info().get("slug") or "")
        return self._slug

    def app_info(self) -> dict[str, Any]:
        """``GET /app``: the App's own record (used by ``loopbot doctor``)."""
        return cast(
            dict[str, Any],
            _with_retries(
                lambda: self.client.rest.apps.get_authenticated().json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            ),
        )

    def installations(self) -> list[dict[str, Any]]:
        """``GET /app/installations``: each with its account and what its owner granted."""

        def page(n: int) -> Any:
            return self.client.rest.apps.list_installations(per_page=100, page=n).json()

        return list(_pages(page, self.settings.github_max_retry_wait))

    def installation_ids(self) -> list[int]:
        return [inst["id"] for inst in self.installations()]

    def hook_config(self) -> dict[str, Any]:
        """``GET /app/hook/config``: the App's webhook URL and content type (the secret
        is never shown back)."""
        return cast(
            dict[str, Any],
            _with_retries(
                lambda: self.client.rest.apps.get_webhook_config_for_app().json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            ),
        )

    def recent_deliveries(self, count: int = 100) -> list[dict[str, Any]]:
        """``GET /app/hook/deliveries``: the newest ``count`` (at most 100) deliveries of
        the App's webhook, newest first, with GitHub's status for each."""
        return cast(
            list[dict[str, Any]],
            _with_retries(
                lambda: self.client.rest.apps.list_webhook_deliveries(per_page=count).json(),
                self.settings.github_max_retry_wait,
                self._sleep,
            ),
        )


def _with_retries(
    fn: Callable[[], Any],
    max_wait: float,
    sleep: Callable[[float], None],
    on_reauth: Callable[[], None] | None = None,
) -> Any:
    attempt = 0
    while True:
        try:
            return fn()
        except (GitHubException, TransportError) as exc:
            decision = classify(exc, attempt, max_wait=max_wait)
        if isinstance(decision, Fatal):
            raise decision.error
        if isinstance(decision, Reauthenticate):
            if on_reauth is None:
                raise GitHubError("401 from GitHub with App credentials", 401)
            on_reauth()
        elif isinstance(decision, RetryAfter):
            log.warning("github.retry", why=decision.why, after=decision.seconds, attempt=attempt)
            sleep(decision.seconds)
        attempt += 1


def _pages(fetch: Callable[[int], Any], max_wait: float) -> Iterator[dict[str, Any]]:
    n = 1
    while True:
        data = _with_retries(partial(fetch, n), max_wait, time.sleep)
        if isinstance(data, dict):  # e.g. {"total_count": .., "repositories": [..]}
            data = next((v for v in data.values() if isinstance(v, list)), [])
        yield from data
        if len(data) < 100:
            return
        n += 1


class Installation:
    """GitHub as one installation of the App sees it; what the jobs talk to."""

    def __init__(self, app: GitHubApp, installation_id: int) -> None:
        self.app = app
        self.installation_id = installation_id
        s = app.settings
        self.pace = (
            SharedPace(
                app.redis,
                installation_id,
                gap=s.github_write_gap,
                max_wait=s.github_max_retry_wait,
                queue_wait=s.github_max_queue_wait,
                concurrent=s.github_max_concurrent,
                # Longer than a request may take (its timeout, for the headers and again
                # for the body), so only a request that never ended lapses.
                token_ttl=2 * s.github_timeout + 5,
                sleep=app._sleep,
            )
            if app.redis is not None
            else None
        )
        self._clients: dict[int, tuple[str, GitHub[Any]]] = {}
        self._redactor: tuple[str, Redactor] | None = None  # (token, redactor knowing it)

    # -- plumbing -------------------------------------------------------------------

    def token(self) -> str:
        return self.app.installation_token(self.installation_id)

    def _gh(self) -> GitHub[Any]:
        """A githubkit client for the current token, kept open for connection reuse.

        githubkit opens (and closes) a new HTTP client per request unless it is used as
        a context manager; that costs ~25 ms a call. The open client lives in a
        ContextVar, i.e. per thread, so clients are kept per thread.
        """
        token = self.token()
        key = threading.get_ident()
        held = self._clients.get(key)
        if held is not None and held[0] == token:
            return held[1]
        if held is not None:
            with contextlib.suppress(Exception):
                held[1].__exit__(None, None, None)
        s = self.app.settings
        client: GitHub[Any] = GitHub(
            TokenAuthStrategy(token),
            base_url=s.api_url + "/",
            timeout=s.github_timeout,
            auto_retry=False,
            http_cache=False,
            user_agent="loopbot",
            ssl_verify=tls(),
            # Every request of the installation, retries included, keeps its shared pace.
            event_hooks=self.pace.hooks() if self.pace is not None else None,
        )
        client.__enter__()  # type: ignore[no-untyped-call]
        self._clients[key] = (token, client)
        return client

    def _reauth(self) -> None:
        self.app.installation_token(self.installation_id, refresh=True)

    def redact(self, text: str) -> str:
        """``text`` without the secrets of the settings and this installation's token:
        what every write here sends, and what loopbot pushes by git (commit messages)."""
        token = self.token()
        held = self._redactor
        if held is None or held[0] != token:  # built once per token: it compiles a pattern
            held = self._redactor = (token, self.app.redactor().with_secrets(token))
        return held[1](text)

    def _text(self, text: str) -> str:
        """``text`` as loopbot may post it: secrets redacted first (an exact secret with an
        ``@`` or a ``#`` in it would no longer match once defused), then defused."""
        return safe_text(self.redact(text))

    def _title(self, text: str) -> str:
        """A title: ``_text`` on one line."""
        return one_line(self.redact(text))

    def _call(self, fn: Callable[[GitHub[Any]], Any]) -> Any:
        """Run a read or an idempotent write (GET, PUT, PATCH, DELETE) with retries."""
        return _with_retries(
            lambda: self._attempt(fn),
            self.app.settings.github_max_retry_wait,
            self.app._sleep,
            self._reauth,
        )

    def _attempt(self, fn: Callable[[GitHub[Any]], Any]) -> Any:
        """One try of ``fn``; its place among the requests in flight is given back
        however it ends (a timeout or a reset never reaches the response hook)."""
        try:
            return fn(self._gh())
        finally:
            if self.pace is not None:
                self.pace.give_back()

    def _create(self, create: Callable[[GitHub[Any]], T], find: Callable[[], T | None]) -> T:
        """A POST that must happen once: after a failed attempt, look before trying again.

        A 5xx or a timeout does not say whether GitHub applied the write, so before
        each retry ``find`` looks for what the earlier attempt may have created.
        """
        first = True

        def attempt(gh: GitHub[Any]) -> T:
            nonlocal first
            if not first and (existing := find()) is not None:
                return existing
            first = False
            return create(gh)

        return cast(T, self._call(attempt))

    def _list(self, fetch: Callable[[GitHub[Any], int], Any]) -> Iterator[dict[str, Any]]:
        wait = self.app.settings.github_max_retry_wait
        return _pages(lambda n: self._attempt(lambda gh: fetch(gh, n)), wait)

    # -- repositories and permissions ----------------------------------------------

    def repo(self, repo: str) -> RepoInfo:
        d = self._call(lambda gh: gh.rest.repos.get(*_split(repo)).json())
        return RepoInfo.model_validate(d)

    def permission(self, repo: str, user: str) -> str:
        """``admin``, ``maintain``, ``write``, ``triage``, ``read`` or ``none``."""
        try:
            d = self._call(
                lambda gh: gh.rest.repos.get_collaborator_permission_level(
                    *_split(repo), user
                ).json()
            )
        except NotFound:
            return "none"  # not a collaborator at all
        role = d.get("role_name") or ""
        return str(role if role in ("maintain", "triage") else d.get("permission", "none"))

    def can_write(self, repo: str, user: str) -> bool:
        return self.permission(repo, user) in WRITE_PERMISSIONS

    def latest_edits(self, repo: str, number: int) -> IssueEdits:
        """The issue's title and body, who last edited the body and who last retitled it,
        in one read (GraphQL: REST does not say who edited an issue). An edit that never
        happened is left out; an account since deleted has an empty login."""
        owner, name = _split(repo)
        data = self._call(
            lambda gh: gh.graphql.request(
                EDITORS_QUERY, {"owner": owner, "name": name, "number": number}
            )
        )
        issue = ((data or {}).get("repository") or {}).get("issue") or {}
        found: list[Editor] = []
        if issue.get("lastEditedAt"):
            who = issue.get("editor") or {}
            count = int((issue.get("userContentEdits") or {}).get("totalCount") or 0)
            found.append(_editor("body", who, str(issue["lastEditedAt"]), count))
        timeline = issue.get("timelineItems") or {}
        renames = timeline.get("nodes") or []
        if renames and renames[-1] is not None:
            who = renames[-1].get("actor") or {}
            at = str(renames[-1].get("createdAt") or "")
            found.append(_editor("title", who, at, int(timeline.get("totalCount") or 0)))
        return IssueEdits(str(issue.get("title") or ""), str(issue.get("body") or ""), tuple(found))

    def repositories(self) -> list[str]:
        return [
            r["full_name"]
            for r in self._list(
                lambda gh, n: gh.rest.apps.list_repos_accessible_to_installation(
                    per_page=100, page=n
                ).json()
            )
        ]

    def file(self, repo: str, path: str, ref: str | None = None) -> str | None:
        """A file's text at ``ref`` (default branch when None); None when absent."""
        owner, name = _split(repo)
        try:
            d = self._call(
                lambda gh: (
                    gh.rest.repos.get_content(owner, name, path, ref=ref)
                    if ref
                    else gh.rest.repos.get_content(owner, name, path)
                ).json()
            )
        except NotFound:
            return None
        if not isinstance(d, dict) or d.get("type") != "file":
            return None
        return base64.b64decode(str(d.get("content") or "")).decode("utf-8", "replace")

    # -- issues and comments --------------------------------------------------------

    def issue(self, repo: str, number: int) -> IssueInfo:
        return _issue(self._call(lambda gh: gh.rest.issues.get(*_split(repo), number).json()))

    def open_issues_with_label(self, repo: str, label: str) -> list[IssueInfo]:
        items = self._list(
            lambda gh, n: gh.rest.issues.list_for_repo(
                *_split(repo), state="open", labels=label, per_page=100, page=n
            ).json()
        )
        return [i for i in map(_issue, items) if not i.is_pull]

    def last_labeler(self, repo: str, number: int, label: str) -> str | None:
        """Who last added ``label`` to the issue (from its event timeline)."""
        who = None
        for ev in self._list(
            lambda gh, n: gh.rest.issues.list_events(
                *_split(repo), number, per_page=100, page=n
            ).json()
        ):
            if ev.get("event") == "labeled" and (ev.get("label") or {}).get("name") == label:
                who = (ev.get("actor") or {}).get("login")
        return who

    def add_labels(self, repo: str, number: int, labels: list[str]) -> None:
        self._call(lambda gh: gh.rest.issues.add_labels(*_split(repo), number, labels=labels))

    def remove_label(self, repo: str, number: int, label: str) -> None:
        with contextlib.suppress(NotFound):  # already gone: the wanted end state
            self._call(lambda gh: gh.rest.issues.remove_label(*_split(repo), number, label))

    # -- triage: issues loopbot writes (jobs/intake/triage.py) --------------------------------

    def find_issue(self, repo: str, key: str) -> IssueInfo | None:
        """The issue (open or closed) a bot opened whose body carries ``key``'s hidden
        marker. Only a bot's: anyone can open an issue with a marker in it, and one
        planted for a sub-issue would be adopted as that sub-issue on a retried create."""
        tag = marker(key)
        items = self._list(
            lambda gh, n: gh.rest.issues.list_for_repo(
                *_split(repo), state="all", per_page=100, page=n
            ).json()
        )
        for issue in map(_issue, items):
            if not issue.is_pull and issue.author_type == "Bot" and tag in (issue.body or ""):
                return issue
        return None

    def create_issue(self, repo: str, key: str, title: str, body: str) -> IssueInfo:
        """Open an issue once: its body carries ``key``'s hidden marker, looked for before
        a retry (a 5xx or a timeout does not say whether GitHub created it)."""
        title, text = self._title(title), f"{self._text(body)}\n\n{marker(key)}"
        return self._create(
            lambda gh: _issue(gh.rest.issues.create(*_split(repo), title=title, body=text).json()),
            lambda: self.find_issue(repo, key),
        )

    def append_to_issue(
        self, repo: str, number: int, key: str, addition: str, base: IssueInfo | None = None
    ) -> IssueInfo:
        """The issue with ``addition`` (redacted and defused) appended to its body, once:
        the addition carries ``key``'s hidden marker, and a body that has it already is
        left alone. The body's own text is the author's and is kept as it is.

        ``base``: the issue as the caller read and checked it; the addition goes after
        that body, not after one read again here, so an edit landing in between is not
        folded into the text the caller goes on to approve (the write replaces it)."""
        current = base if base is not None else self.issue(repo, number)
        tag = marker(key)
        if tag in (current.body or ""):
            return current
        before = (current.body or "").rstrip()
        body = (before + "\n\n" if before else "") + f"{self._text(addition)}\n\n{tag}"
        return _issue(
            self._call(lambda gh: gh.rest.issues.update(*_split(repo), number, body=body).json())
        )

    def comments(self, repo: str, number: int) -> list[CommentInfo]:
        items = self._list(
            lambda gh, n: gh.rest.issues.list_comments(
                *_split(repo), number, per_page=100, page=n
            ).json()
        )
        return [_comment(c) for c in items]

    def find_comment(self, repo: str, number: int, key: str) -> CommentInfo | None:
        tag = marker(key)
        for c in self.comments(repo, number):
            if c.author_type == "Bot" and tag in c.body:
                return c
        return None

    def upsert_comment(
        self, repo: str, number: int, key: str, body: str, known_id: int | None = None
    ) -> CommentInfo:
        """The comment tagged ``key`` on the issue, created once and edited after.

        ``known_id`` (the id from an earlier upsert) skips the search; if that comment
        is gone, the search runs as usual.
        """
        text = f"{self._text(body)}\n\n{marker(key)}"
        if known_id is not None:
            with contextlib.suppress(NotFound):
                return _comment(
                    self._call(
                        lambda gh: gh.rest.issues.update_comment(
                            *_split(repo), known_id, body=text
                        ).json()
                    )
                )
        existing = self.find_comment(repo, number, key)
        if existing is not None:
            if existing.body != text:
                d = self._call(
                    lambda gh: gh.rest.issues.update_comment(
                        *_split(repo), existing.id, body=text
                    ).json()
                )
                return _comment(d)
            return existing
        return self._create(
            lambda gh: _comment(
                gh.rest.issues.create_comment(*_split(repo), number, body=text).json()
            ),
            lambda: self.find_comment(repo, number, key),
        )

    def react(self, repo: str, comment_id: int, content: str) -> None:
        # GitHub answers 200 for a reaction that already exists: naturally idempotent.
        self._call(
            lambda gh: gh.rest.reactions.create_for_issue_comment(
                *_split(repo), comment_id, content=cast(Any, content)
            )
        )

    # -- pull requests ----------------------------------------------------------------

    def find_pull(self, repo: str, branch: str, state: str = "open") -> PullInfo | None:
        owner, _ = _split(repo)
        items = self._call(
            lambda gh: gh.rest.pulls.list(
                *_split(repo), head=f"{owner}:{branch}", state=cast(Any, state), per_page=10
            ).json()
        )
        return _pull(items[0]) if items else None

    def pull(self, repo: str, number: int) -> PullInfo:
        return _pull(self._call(lambda gh: gh.rest.pulls.get(*_split(repo), number).json()))

    def pull_diff(self, repo: str, number: int) -> str:
        return str(
            self._call(
                lambda gh: (
                    gh.rest.pulls.get(
                        *_split(repo), number, headers={"Accept": "application/vnd.github.diff"}
                    ).text
                )
            )
        )

    def compare_diff(self, repo: str, base: str, head: str) -> str:
        """The diff from ``base`` to ``head`` (GitHub's three-dot compare)."""
        return str(
            self._call(
                lambda gh: (
                    gh.rest.repos.compare_commits(
                        *_split(repo),
                        f"{base}...{head}",
                        headers={"Accept": "application/vnd.github.diff"},
                    ).text
                )
            )
        )

    def compare_status(self, repo: str, base: str, head: str) -> tuple[str, str]:
        """GitHub's compare of ``base...head``: (status, base sha). ``ahead`` or
        ``identical`` means ``head`` contains ``base``; ``behind`` or ``diverged`` not."""
        d = self._call(
            lambda gh: gh.rest.repos.compare_commits(
                *_split(repo), f"{base}...{head}", per_page=1
            ).json()
        )
        return str(d.get("status") or ""), str((d.get("base_commit") or {}).get("sha") or "")

    def compare_counts(self, repo: str, base: str, head: str) -> tuple[str, int, int]:
        """GitHub's compare of ``base...head``: (status, ahead by, behind by). The merge
        gate's check that a post-action head is one commit on top of the reviewed sha."""
        d = self._call(
            lambda gh: gh.rest.repos.compare_commits(
                *_split(repo), f"{base}...{head}", per_page=1
            ).json()
        )
        return (
            str(d.get("status") or ""),
            int(d.get("ahead_by") or 0),
            int(d.get("behind_by") or 0),
        )

    def pull_files(self, repo: str, number: int) -> list[str]:
        """Every path the pull request touches, renamed-from paths included."""
        paths: list[str] = []
        for f in self._list(
            lambda gh, n: gh.rest.pulls.list_files(
                *_split(repo), number, per_page=100, page=n
            ).json()
        ):
            paths.append(str(f.get("filename")))
            if f.get("previous_filename"):
                paths.append(str(f["previous_filename"]))
        return paths

    def open_pull(
        self, repo: str, branch: str, base: str, title: str, body: str, *, closes: int
    ) -> PullInfo:
        """The open PR for ``branch``: found, or created once; its title and body updated.

        The body starts with ``Closes #closes`` (the loop's own issue); the rest is defused,
        so it names no other issue to close and pings no one.
        """
        existing = self.find_pull(repo, branch)
        if existing is not None:
            return self.update_pull(
                repo, existing.number, body=body, closes=closes, title=title, current=existing
            )
        title, body = self._title(title), self._pull_body(body, closes)
        try:
            return self._create(
                lambda gh: _pull(
                    gh.rest.pulls.create(
                        *_split(repo), title=title, head=branch, base=base, body=body
                    ).json()
                ),
                lambda: self.find_pull(repo, branch),
            )
        except Unprocessable:
            # "A pull request already exists": another worker won the race.
            found = self.find_pull(repo, branch)
            if found is None:
                raise
            return found

    def update_pull(
        self,
        repo: str,
        number: int,
        *,
        body: str,
        closes: int,
        title: str | None = None,
        current: PullInfo | None = None,
    ) -> PullInfo:
        """Edit the pull request's body (and ``title``), written as ``open_pull`` writes
        them: ``Closes #closes`` first, the rest redacted and defused. ``current``: the
        pull request as just read; nothing is written when it says this already. A PATCH
        sets the same text however often a retry sends it."""
        fields = {"body": self._pull_body(body, closes)}
        if title is not None:
            fields["title"] = self._title(title)
        if current is not None and all(getattr(current, k) == v for k, v in fields.items()):
            return current
        return _pull(
            self._call(
                lambda gh: gh.rest.pulls.update(
                    *_split(repo), number, data=cast(Any, fields)
                ).json()
            )
        )

    def _pull_body(self, body: str, closes: int) -> str:
        """The loop's own issue first, so GitHub closes it on merge; the agent's words
        after it, defused, name no other issue to close."""
        return f"Closes #{closes}\n\n{self._text(body)}"

    def reviews(self, repo: str, number: int) -> list[ReviewInfo]:
        items = self._list(
            lambda gh, n: gh.rest.pulls.list_reviews(
                *_split(repo), number, per_page=100, page=n
            ).json()
        )
        return [_review(r) for r in items]

    def find_review(self, repo: str, number: int, key: str) -> ReviewInfo | None:
        tag = marker(key)
        for r in self.reviews(repo, number):
            if r.author_type == "Bot" and tag in (r.body or ""):
                return r
        return None

    def post_review(
        self,
        repo: str,
        number: int,
        key: str,
        commit_id: str,
        body: str,
        comments: list[dict[str, Any]],
    ) -> ReviewInfo:
        """One COMMENT review tagged ``key``: never posted twice, even across retries."""
        text = f"{self._text(body)}\n\n{marker(key)}"
        comments = [{**c, "body": self._text(str(c.get("body", "")))} for c in comments]
        existing = self.find_review(repo, number, key)
        if existing is not None:
            return existing
        return self._create(
            lambda gh: _review(
                gh.rest.pulls.create_review(
                    *_split(repo),
                    number,
                    commit_id=commit_id,
                    body=text,
                    event="COMMENT",
                    comments=cast(Any, comments),
                ).json()
            ),
            lambda: self.find_review(repo, number, key),
        )

    def merge_pull(
        self,
        repo: str,
        number: int,
        sha: str,
        method: str,
        title: str,
        message: str,
        *,
        closes: int,
    ) -> MergeResult:
        """Merge with ``sha`` pinned. ``message`` is given, never GitHub's default, which
        may copy the PR body or the branch's commit messages onto the default branch.
        It starts with ``Closes #closes``; the title and the rest are defused, and the
        title ends with `` (#number)``, GitHub's own convention for a squash commit."""
        title = f"{self._title(title)} (#{number})"
        message = f"Closes #{closes}.\n\n{self._text(message)}"
        d = self._call(
            lambda gh: gh.rest.pulls.merge(
                *_split(repo),
                number,
                sha=sha,
                merge_method=cast(Any, method),
                commit_title=title,
                commit_message=message,
            ).json()
        )
        return MergeResult(sha=d.get("sha") or "", merged=bool(d.get("merged")))

    def delete_branch(self, repo: str, branch: str) -> None:
        with contextlib.suppress(NotFound, Unprocessable):  # already deleted
            self._call(lambda gh: gh.rest.git.delete_ref(*_split(repo), f"heads/{branch}"))

    # -- checks -------------------------------------------------------------------------

    def check_runs(self, repo: str, ref: str) -> list[CheckRunInfo]:
        items = self._list(
            lambda gh, n: gh.rest.checks.list_for_ref(
                *_split(repo), ref, per_page=100, page=n
            ).json()
        )
        return [_check_run(c) for c in items]

    def commit_statuses(self, repo: str, ref: str) -> list[tuple[str, str]]:
        """The legacy commit statuses on ``ref``, latest per context: (context, state).

        The combined status is paginated (``total_count``): every page is read, and if
        they cannot all be read, an entry with the state ``unknown`` is added, which the
        gate refuses, so a failing status on a page not read can never pass."""
        found: list[tuple[str, str]] = []

        def fetch(page: int) -> Callable[[GitHub[Any]], Any]:
            return lambda gh: gh.rest.repos.get_combined_status_for_ref(
                *_split(repo), ref, per_page=100, page=page
            ).json()

        for page in range(1, 11):
            d = self._call(fetch(page))
            batch = d.get("statuses") or []
            found += [(str(st.get("context")), str(st.get("state"))) for st in batch]
            total = d.get("total_count")
            if not isinstance(total, int) or len(found) >= total or not batch:
                return found
        return [*found, ("(statuses beyond 1,000 not read)", "unknown")]

    def required_checks(self, repo: str, branch: str) -> frozenset[str] | None:
        """The check names ``branch`` requires, from rulesets and branch protection.

        ``None`` when neither requires any (or neither can be read: rulesets are missing
        on older GitHub Enterprise Server, and protection may be hidden), which the gate
        reads as "every check on the head counts".
        """
        owner, name = _split(repo)
        names: set[str] = set()
        with contextlib.suppress(NotFound, Forbidden):
            for rule in self._list(
                lambda gh, n: gh.rest.repos.get_branch_rules(
                    owner, name, branch, per_page=100, page=n
                ).json()
            ):
                if rule.get("type") == "required_status_checks":
                    params = rule.get("parameters") or {}
                    for check in params.get("required_status_checks") or []:
                        names.add(str(check.get("context")))
        with contextlib.suppress(NotFound, Forbidden):
            d = self._call(lambda gh: gh.rest.repos.get_branch(owner, name, branch).json())
            protection = d.get("protection") or {}
            checks = protection.get("required_status_checks") or {}
            if protection.get("enabled", True) and checks.get("enforcement_level") != "off":
                names.update(str(c) for c in checks.get("contexts") or [])
                names.update(str(c.get("context")) for c in checks.get("checks") or [])
        return frozenset(names) or None

    def upsert_check_run(
        self,
        repo: str,
        name: str,
        head_sha: str,
        *,
        status: str,
        conclusion: str | None = None,
        title: str = "",
        summary: str = "",
        text: str | None = None,
        annotations: list[dict[str, Any]] | None = None,
        details_url: str | None = None,
        known_id: int | None = None,
        new_head: bool = False,
    ) -> CheckRunInfo:
        """The check run ``name`` on ``head_sha``: created once, then updated."""
        title, summary = self._title(title or name), self._text(summary or title or name)
        output: dict[str, Any] = {"title": title, "summary": summary}
        if text:
            output["text"] = self._text(text)
        if annotations:
            output["annotations"] = [  # 50: GitHub's limit per request
                {
                    **a,
                    **{f: self._text(str(a[f])) for f in ("message", "title") if a.get(f)},
                }
                for a in annotations[:50]
            ]
        fields: dict[str, Any] = {"status": status, "output": output}
        if conclusion:
            fields["conclusion"] = conclusion
        if details_url:
            fields["details_url"] = details_url

        def find() -> CheckRunInfo | None:
            mine = [
                c
                for c in self.check_runs(repo, head_sha)
                if c.name == name
                and c.head_sha == head_sha
                and (c.app_id is None or c.app_id == self.app.settings.github_app_id)
            ]
            return mine[0] if mine else None

        if known_id is not None:
            with contextlib.suppress(NotFound):
                return _check_run(
                    self._call(
                        lambda gh: gh.rest.checks.update(*_split(repo), known_id, **fields).json()
                    )
                )
        # A head loopbot has just pushed can have no check run of ours yet: skip the search.
        existing = None if new_head else find()
        if existing is not None:
            return _check_run(
                self._call(
                    lambda gh: gh.rest.checks.update(*_split(repo), existing.id, **fields).json()
                )
            )
        return self._create(
            lambda gh: _check_run(
                gh.rest.checks.create(*_split(repo), name=name, head_sha=head_sha, **fields).json()
            ),
            find,
        )
