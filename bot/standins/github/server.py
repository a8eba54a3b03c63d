"""``GitHubServer``: the state, a Flask app with every resource's routes, the thread that
serves it and the one that sends webhooks, and the test's hands (add a repository, a
user, a fault...)."""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import time
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric import rsa
from flask import Flask, Response, g, jsonify, request
from werkzeug.serving import BaseWSGIServer

from bot.standins import gitrepo, serving
from bot.standins.github import (
    app_hooks,
    attachments,
    auth,
    checks,
    git_http,
    graphql,
    issues,
    manifests,
    pulls,
    repos,
    shapes,
    webhooks,
)
from bot.standins.github.merging import merge_queue
from bot.standins.github.state import Fault, MergeQueueRule, Repo, State
from bot.standins.github.wire import Json, now

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise

# Each registers its own routes; together they are the API the server speaks.
RESOURCES = (
    auth,
    app_hooks,
    repos,
    issues,
    pulls,
    checks,
    git_http,
    graphql,
    manifests,
    attachments,
)


class GitHubServer(State):
    """Run with ``start()``; ``url`` is the API base to give ``GITHUB_API_URL``."""

    def __init__(
        self,
        root: Path,
        *,
        app_id: int = 4242,
        app_slug: str = "loopbot-test",
        app_key: tuple[str, rsa.RSAPublicKey] | None = None,
    ) -> None:
        # ``app_key``: a key made earlier (auth.new_app_key), for a test suite that starts
        # a server per test (an RSA key takes about 0.1 s to make); a fresh one otherwise.
        private_key_pem, public_key = app_key or auth.new_app_key()
        super().__init__(
            root,
            app_id=app_id,
            app_slug=app_slug,
            private_key_pem=private_key_pem,
            public_key=public_key,
        )
        self._server: BaseWSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self.app = self._build_app()

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> GitHubServer:
        self._server, self.url = serving.serve(self.app, host, port, "github-server")
        sender = threading.Thread(target=self._send_webhooks, daemon=True, name="github-hooks")
        sender.start()
        self._threads.append(sender)
        return self

    def stop(self) -> None:
        self.outbox.put(None)
        serving.stop(self._server)

    def wait_for_webhooks(self, timeout: float = 10.0) -> None:
        """Block until every webhook queued so far has been sent."""
        deadline = time.monotonic() + timeout
        while self.outbox.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _send_webhooks(self) -> None:
        webhooks.send_forever(self)

    # -- the app ------------------------------------------------------------------------

    def _build_app(self) -> Flask:
        app = Flask("local-github")
        app.config["MAX_CONTENT_LENGTH"] = 200 * 1024 * 1024
        app.before_request(self._before_request)
        app.after_request(self._after_request)
        app.teardown_request(self._request_done)
        for resource in RESOURCES:
            resource.register(app, self)
        app.register_error_handler(404, _not_found)
        return app

    def _before_request(self) -> Response | None:
        """Injected faults first (they can stand in for an auth failure), then auth, then
        the request is recorded. git's smart HTTP has its own auth and takes no faults."""
        if request.path.startswith("/git/") or manifests.is_web_page(request.path):
            return None
        if attachments.is_attachment(request.path):  # a signed URL is its own credential
            return None
        fault = self.match_fault(request.method, request.path, request.headers.get("Accept", ""))
        g.fault = None
        if fault is not None:
            if fault.delay:
                time.sleep(fault.delay)
            if fault.after:
                g.fault = fault
            elif fault.status:
                return _fault_response(fault)
        anonymous = request.path.startswith("/app-manifests/")
        if anonymous and not request.headers.get("Authorization"):
            g.auth = ("anonymous", None)  # the code is the credential
        else:
            g.auth = auth.authenticate(self)
        with self.lock:
            self.requests.append((request.method, request.path, g.auth[0]))
        if (limited := self._concurrency_limit()) is not None:
            return limited
        if (limited := self._secondary_limit()) is not None:
            return limited
        return None

    def _concurrency_limit(self) -> Response | None:
        """GitHub's limit on concurrent requests (REST and GraphQL together), per
        installation, when ``concurrent_limit`` is set: one past it is a 403 with the
        secondary-limit message and, as GitHub may, no ``Retry-After``."""
        kind, who = g.auth
        if kind != "installation":
            return None
        with self.lock:
            n = self.inflight[who] = self.inflight.get(who, 0) + 1
            g.inflight = who
            self.peak_inflight = max(self.peak_inflight, n)
            refused = self.concurrent_limit is not None and n > self.concurrent_limit
            if refused:
                self.limited.append((request.method, request.path, who, time.time(), 0))
        if refused:
            return _secondary_refusal(None)
        if self.request_delay:
            time.sleep(self.request_delay)
        return None

    def _request_done(self, exc: BaseException | None) -> None:
        who = g.pop("inflight", None)
        if who is not None:
            with self.lock:
                self.inflight[who] -= 1

    def _secondary_limit(self) -> Response | None:
        """GitHub's secondary limit on content-creating requests, per installation, when
        ``write_limit`` is set: more than ``write_limit`` writes (POST, PATCH, PUT, DELETE)
        in ``write_window`` seconds is a 403 with GitHub's message and a ``Retry-After``
        (until the oldest write leaves the window), and the write is not applied.
        https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api"""
        kind, who = g.auth
        if self.write_limit is None or kind != "installation" or not _content_creating():
            return None
        now = time.monotonic()
        with self.lock:
            self.write_log.append((time.time(), request.method, request.path, who))
            window = self.writes.setdefault(who, [])
            window[:] = [t for t in window if now - t < self.write_window]
            if len(window) < self.write_limit:
                window.append(now)
                return None
            wait = max(1, math.ceil(self.write_window - (now - window[0])))
            self.limited.append((request.method, request.path, who, time.time(), wait))
        return _secondary_refusal(wait)

    def _after_request(self, resp: Response) -> Response:
        """An "after" fault first (the request has been applied; now answer as if it
        failed); then, as GitHub: a JSON GET's ETag and caching headers, a 304 for a
        matching ``If-None-Match``, and the primary rate limit, which a 304 does not
        spend. https://docs.github.com/en/rest/using-the-rest-api/best-practices-for-using-the-rest-api#use-conditional-requests-if-appropriate"""
        fault = getattr(g, "fault", None)
        if fault is not None and fault.after and 200 <= resp.status_code < 300:
            return _fault_response(fault)
        who = g.get("auth")
        if who is None or request.path.rstrip("/").endswith("/graphql"):
            return resp  # not a REST request of a credential (GraphQL has its own limit)
        cacheable = (
            request.method == "GET"
            and resp.status_code == 200
            and resp.mimetype == "application/json"
            and not resp.is_streamed
        )
        if cacheable:
            # Of the body AND the credential: GitHub's ETags are reported to be per token
            # (GitHub support, quoted in eclipse-csi/otterdog#201): another token's ETag
            # gets the whole body again, never a 304.
            credential = request.headers.get("Authorization", "").encode()
            digest = hashlib.sha256(credential + b"\0" + resp.get_data()).hexdigest()
            tag = f'W/"{digest}"'
            resp.headers["ETag"] = tag
            resp.headers["Cache-Control"] = "private, max-age=60, s-maxage=60"
            resp.headers["Vary"] = "Accept, Authorization, Cookie"
            if _matches(request.headers.get("If-None-Match", ""), tag):
                resp.status_code = 304
                resp.set_data(b"")
                resp.headers.pop("Content-Type", None)
        # Its own lock, not the server's: the server's is held through git work (a merge),
        # and every response waiting for it made the whole fleet wait (issue 43's bench).
        with self.rate_lock:
            if time.time() >= self.rate_reset:  # a new hour: every budget is whole again
                self.rate_used.clear()
                self.rate_reset = int(time.time()) + 3600
            if resp.status_code == 304:
                self.not_modified.append((request.method, request.path, who[0]))
            else:
                self.rate_used[who] = self.rate_used.get(who, 0) + 1
            used = self.rate_used.get(who, 0)
        resp.headers["X-RateLimit-Limit"] = str(self.rate_limit)
        resp.headers["X-RateLimit-Remaining"] = str(max(self.rate_limit - used, 0))
        resp.headers["X-RateLimit-Used"] = str(used)
        resp.headers["X-RateLimit-Reset"] = str(self.rate_reset)
        resp.headers["X-RateLimit-Resource"] = "core"
        return resp

    # -- setup helpers (the test's hands) -------------------------------------------------

    def upload(
        self,
        name: str,
        data: bytes,
        *,
        image: bool,
        content_type: str = "",
        ttl: float | None = None,
    ) -> str:
        """A file attached as a person's browser does: the Markdown GitHub writes for it."""
        return attachments.upload(self, name, data, image=image, content_type=content_type, ttl=ttl)

    def add_installation(
        self,
        account: str,
        *,
        permissions: dict[str, str] | None = None,
        events: list[str] | None = None,
    ) -> int:
        """An installation on ``account``, granted the App's permissions and events unless
        told otherwise (an owner who has not accepted an App's new permissions)."""
        perms, evs = self.registered()
        with self.lock:
            iid = self.next_id()
            self.installations[iid] = account
            self.grants[iid] = {
                "permissions": perms if permissions is None else dict(permissions),
                "events": evs if events is None else list(events),
                "created_at": now(),
                "suspended_at": None,
            }
            return iid

    def add_repo(
        self,
        full_name: str,
        files: dict[str, str] | None = None,
        *,
        installation_id: int | None = None,
        default_branch: str = "main",
        collaborators: dict[str, str] | None = None,
    ) -> Repo:
        owner, name = full_name.split("/")
        path = self.root / "git" / owner / f"{name}.git"
        gitrepo.init_bare(path, default_branch)
        if files:
            gitrepo.seed(path, default_branch, files)
        with self.lock:
            repo = Repo(owner, name, self.next_id(), default_branch, path, installation_id)
            self.add_user(owner)
            repo.permissions[owner] = "admin"
            for login, perm in (collaborators or {}).items():
                self.add_user(login)
                repo.permissions[login] = perm
            self.repos[full_name] = repo
            return repo

    def inject(
        self,
        method: str,
        path: str,
        status: int = 500,
        *,
        times: int = 1,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        after: bool = False,
        body: Json | None = None,
        accept: str = "",
    ) -> Fault:
        """Fail the next ``times`` requests whose path matches the regex ``path``."""
        fault = Fault(
            method.upper(),
            re.compile(path),
            status,
            times,
            headers or {},
            body or {"message": "injected fault"},
            delay,
            after,
            accept=accept,
        )
        with self.lock:
            self.faults.append(fault)
        return fault

    def app_token_for(self, installation_id: int) -> str:
        """An installation token, as if minted through the API (benchmarks, demos)."""
        token, _ = auth.mint_installation_token(self, installation_id)
        return token

    def revoke_tokens(self) -> None:
        """Invalidate every installation token, as if they had expired or been revoked."""
        with self.lock:
            for t in [t for t, v in self.tokens.items() if v[0] == "installation"]:
                del self.tokens[t]

    def as_user(self, login: str) -> httpx.Client:
        """An HTTP client acting as ``login`` (a person clicking in GitHub's UI)."""
        user = self.add_user(login)
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"token {user.token}"},
            timeout=30,
            verify=serving.client_tls(),
        )

    def repo(self, full_name: str) -> Repo:
        return self.repos[full_name]

    def ref(self, full_name: str, branch: str) -> str | None:
        return gitrepo.resolve(self.repos[full_name].path, f"refs/heads/{branch}")

    def file_at(self, full_name: str, ref: str, path: str) -> str | None:
        data = gitrepo.show(self.repos[full_name].path, ref, path)
        return None if data is None else data.decode()

    def require_checks(
        self, full_name: str, branch: str, contexts: list[str], *, ruleset: bool = False
    ) -> None:
        """Make ``branch`` require these status checks, by branch protection or a ruleset."""
        repo = self.repos[full_name]
        with self.lock:
            (repo.ruleset_checks if ruleset else repo.protection)[branch] = list(contexts)

    def require_merge_queue(
        self,
        full_name: str,
        branch: str,
        rule: MergeQueueRule | None = None,
        *,
        ci: str = "success",
    ) -> None:
        """A ruleset's ``merge_queue`` rule on ``branch``. ``ci``: what the stand-in, as
        the CI, reports on each merge group's required checks ("" reports nothing: the
        test calls ``report_queue_checks``)."""
        repo = self.repos[full_name]
        with self.lock:
            repo.merge_queues[branch] = rule or MergeQueueRule()
            repo.queue_ci[branch] = ci

    def report_queue_checks(self, full_name: str, branch: str, conclusion: str) -> str:
        """The CI reports every required check on ``branch``'s front merge group (the
        queue then merges it or dequeues it); the group's commit."""
        return merge_queue.report_group_checks(self, self.repos[full_name], branch, conclusion)

    def push_files(
        self, full_name: str, branch: str, files: dict[str, str], message: str, pusher: str
    ) -> str:
        """``pusher`` pushes one commit of ``files`` onto ``branch`` (as ``git push`` would;
        a new branch from the default branch's head):
        the commit, and the ``push`` webhook GitHub sends for it. Returns the commit."""
        repo = self.repos[full_name]
        before = gitrepo.resolve(repo.path, f"refs/heads/{branch}") or "0" * 40
        if before == "0" * 40:  # a new branch starts from the default branch, as a clone's would
            base = gitrepo.resolve(repo.path, f"refs/heads/{repo.default_branch}")
            if base is not None:
                gitrepo.git(repo.path, "update-ref", f"refs/heads/{branch}", base)
        sha = gitrepo.seed(repo.path, branch, files, message)
        with self.lock:
            sender = self.users[pusher]
        self.emit(
            "push",
            {
                "ref": f"refs/heads/{branch}",
                "before": before,
                "after": sha,
                "created": before == "0" * 40,
                "deleted": False,
                "forced": False,
                "commits": [
                    {
                        "id": sha,
                        "message": message,
                        "timestamp": now(),
                        "added": [],
                        "modified": sorted(files),
                        "removed": [],
                    }
                ],
                "head_commit": {"id": sha, "message": message},
                "pusher": {"name": pusher},
                **shapes.event_base(self, repo, sender),
            },
        )
        return sha

    def complete_check_suite(self, full_name: str, sha: str, conclusion: str = "success") -> None:
        """Send ``check_suite.completed`` for ``sha`` as another CI App would."""
        checks.send_suite_completed(self, full_name, sha, conclusion)

    def _closing_references(self, repo: Repo, text: str) -> list[tuple[Repo, int]]:
        """The issues a merge of ``text`` into ``repo`` closes (tests check the rule)."""
        return pulls.closing_references(self, repo, text)


def _content_creating() -> bool:
    """Whether the request counts against the content-creating limit: every REST write
    (harsher than GitHub, which names creating ones), and a GraphQL mutation; a GraphQL
    query is a read to GitHub."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return False
    if request.path.rstrip("/").endswith("/graphql"):
        body = request.get_json(silent=True)
        text = body.get("query") if isinstance(body, dict) else None
        if not isinstance(text, str):
            return True
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        first = next((ln for ln in lines if not ln.startswith("#")), "")
        return not (first.startswith("{") or first.split("(")[0].split()[:1] == ["query"])
    return True


def _secondary_refusal(retry_after: int | None) -> Response:
    """GitHub's answer to a request past a secondary limit."""
    resp = jsonify(
        {
            "message": "You have exceeded a secondary rate limit. Please wait a few "
            "minutes before you try again.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
        }
    )
    resp.status_code = 403
    if retry_after is not None:
        resp.headers["Retry-After"] = str(retry_after)
    return resp


def _matches(if_none_match: str, tag: str) -> bool:
    """Whether an ``If-None-Match`` names ``tag`` (weak comparison, as for a GET)."""
    bare = tag.removeprefix("W/")
    wanted = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return bare in wanted or "*" in wanted


def _fault_response(fault: Fault) -> Response:
    resp = jsonify(fault.body)
    resp.status_code = fault.status
    for k, v in fault.headers.items():
        resp.headers[k] = v
    return resp


def _not_found(exc: Exception) -> tuple[Response, int]:
    return jsonify({"message": "Not Found"}), 404
