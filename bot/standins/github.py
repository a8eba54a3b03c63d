"""A local server that speaks enough of GitHub's REST API for loopbot, over HTTP.

Backed by real bare git repositories: ``clone_url`` is served by ``git http-backend``
(token auth through HTTP Basic, like github.com), pull requests read their heads from
the real refs, and a squash merge writes a real commit onto the default branch.

State changes made by users (a label added, a comment, an issue closed) are sent as
signed webhooks to ``webhook_url``, in order, from one sender thread. Faults can be
injected per route: a status (5xx, 403 with ``Retry-After``), a delay, and "after"
faults that apply the write and then fail, which is what makes idempotency testable.

Used by the tests and by ``loopbot demo``. Not a security boundary.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import queue
import re
import secrets
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from flask import Flask, Response, abort, g, jsonify, request
from werkzeug.serving import BaseWSGIServer, make_server

from bot.core.diffmap import right_side_lines
from bot.core.signature import sign
from bot.standins import gitrepo

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise

Json = dict[str, Any]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int = 500
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    body: Json = field(default_factory=lambda: {"message": "injected fault"})
    delay: float = 0.0
    after: bool = False  # apply the request, then answer with the fault
    hits: int = 0
    accept: str = ""  # only requests whose Accept header contains this (e.g. "diff")


@dataclass
class User:
    login: str
    id: int
    type: str = "User"
    token: str = ""

    def json(self) -> Json:
        return {"login": self.login, "id": self.id, "type": self.type}


@dataclass
class Issue:
    number: int
    title: str
    body: str
    user: User
    state: str = "open"
    labels: list[str] = field(default_factory=list)
    is_pull: bool = False
    events: list[Json] = field(default_factory=list)


@dataclass
class Pull:
    number: int
    head: str
    base: str
    user: User
    merged: bool = False
    merge_commit_sha: str | None = None
    closed_head_sha: str | None = None


@dataclass
class Repo:
    owner: str
    name: str
    id: int
    default_branch: str
    path: Path
    installation_id: int | None
    permissions: dict[str, str] = field(default_factory=dict)
    issues: dict[int, Issue] = field(default_factory=dict)
    pulls: dict[int, Pull] = field(default_factory=dict)
    comments: dict[int, Json] = field(default_factory=dict)  # id -> comment (with "_issue")
    reviews: dict[int, list[Json]] = field(default_factory=dict)
    review_comments: dict[int, list[Json]] = field(default_factory=dict)
    check_runs: dict[int, Json] = field(default_factory=dict)
    statuses: dict[str, list[Json]] = field(default_factory=dict)
    reactions: list[Json] = field(default_factory=list)
    # Required status checks per branch: classic branch protection, and rulesets.
    protection: dict[str, list[str]] = field(default_factory=dict)
    ruleset_checks: dict[str, list[str]] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


class GitHubServer:
    """Run with ``start()``; ``url`` is the API base to give ``GITHUB_API_URL``."""

    def __init__(self, root: Path, *, app_id: int = 4242, app_slug: str = "loopbot-test") -> None:
        self.root = root
        (root / "git").mkdir(parents=True, exist_ok=True)
        self.app_id = app_id
        self.app_slug = app_slug
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ).decode()
        self._public_key = key.public_key()
        self.lock = threading.RLock()
        self._ids = itertools.count(1000)
        self.users: dict[str, User] = {}
        self.bot = self._user(f"{app_slug}[bot]", type="Bot")
        self.installations: dict[int, str] = {}
        self.repos: dict[str, Repo] = {}
        self.tokens: dict[str, tuple[str, Any, float]] = {}  # token -> (kind, who, expires)
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, auth kind)
        self.webhook_url: str | None = None
        self.webhook_secret = "local-webhook-secret"
        self.webhooks_enabled = True
        self.deliveries: list[Json] = []
        self.token_ttl = timedelta(hours=1)
        self._hooks: queue.Queue[tuple[str, Json] | None] = queue.Queue()
        self._server: BaseWSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self.app = self._build_app()
        self.url = ""

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> GitHubServer:
        self._server = make_server(host, port, self.app, threaded=True)
        self.url = f"http://{host}:{self._server.server_port}"
        for target in (self._server.serve_forever, self._send_hooks):
            t = threading.Thread(target=target, daemon=True, name="github-server")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._hooks.put(None)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def wait_for_webhooks(self, timeout: float = 10.0) -> None:
        """Block until every webhook queued so far has been sent."""
        deadline = time.monotonic() + timeout
        while self._hooks.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- setup helpers (the test's hands) ----------------------------------------------------

    def _user(self, login: str, type: str = "User") -> User:
        user = User(
            login=login, id=next(self._ids), type=type, token=f"ghu_{secrets.token_hex(12)}"
        )
        self.users[login] = user
        if type == "User":
            self.tokens[user.token] = ("user", login, float("inf"))
        return user

    def add_user(self, login: str) -> User:
        with self.lock:
            return self.users.get(login) or self._user(login)

    def add_installation(self, account: str) -> int:
        with self.lock:
            iid = next(self._ids)
            self.installations[iid] = account
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
            repo = Repo(owner, name, next(self._ids), default_branch, path, installation_id)
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
        token = f"ghs_{secrets.token_hex(16)}"
        expires = (datetime.now(UTC) + self.token_ttl).timestamp()
        with self.lock:
            self.tokens[token] = ("installation", installation_id, expires)
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
            base_url=self.url, headers={"Authorization": f"token {user.token}"}, timeout=30
        )

    def repo(self, full_name: str) -> Repo:
        return self.repos[full_name]

    def ref(self, full_name: str, branch: str) -> str | None:
        return gitrepo.resolve(self.repos[full_name].path, f"refs/heads/{branch}")

    def file_at(self, full_name: str, ref: str, path: str) -> str | None:
        data = gitrepo.show(self.repos[full_name].path, ref, path)
        return None if data is None else data.decode()

    # -- auth ------------------------------------------------------------------------------

    def _auth(self) -> tuple[str, Any]:
        header = request.headers.get("Authorization", "")
        scheme, _, cred = header.partition(" ")
        if scheme.lower() == "bearer" and cred.count(".") == 2:
            try:
                claims = jwt.decode(cred, self._public_key, algorithms=["RS256"])
            except jwt.PyJWTError as exc:
                abort(_error(401, f"A JSON web token could not be decoded: {exc}"))
            if str(claims.get("iss")) != str(self.app_id):
                abort(_error(401, "JWT issuer is not this App"))
            return ("app", self.app_id)
        if scheme.lower() in ("token", "bearer") and cred:
            with self.lock:
                entry = self.tokens.get(cred)
            if entry is None or entry[2] < time.time():
                abort(_error(401, "Bad credentials"))
            return (entry[0], entry[1])
        abort(_error(401, "Requires authentication"))

    def _actor(self) -> User:
        kind, who = g.auth
        if kind == "user":
            return self.users[who]
        return self.bot

    def _repo(self, owner: str, name: str) -> Repo:
        repo = self.repos.get(f"{owner}/{name}")
        if repo is None:
            abort(_error(404, "Not Found"))
        kind, who = g.auth
        if kind == "installation" and repo.installation_id != who:
            abort(_error(404, "Not Found"))
        return repo  # users: a public repository, anyone may read, open issues and comment

    def _need_triage(self, repo: Repo) -> None:
        kind, who = g.auth
        if kind == "user" and repo.permissions.get(who) not in (
            "triage",
            "write",
            "maintain",
            "admin",
        ):
            abort(_error(403, "Must have triage access to change labels"))

    # -- JSON shapes ------------------------------------------------------------------------

    def _repo_json(self, repo: Repo) -> Json:
        return {
            "id": repo.id,
            "name": repo.name,
            "full_name": repo.full_name,
            "private": True,
            "owner": self.users[repo.owner].json(),
            "default_branch": repo.default_branch,
            "clone_url": f"{self.url}/git/{repo.full_name}.git",
            "html_url": f"{self.url}/{repo.full_name}",
            "url": f"{self.url}/repos/{repo.full_name}",
        }

    def _issue_json(self, repo: Repo, issue: Issue) -> Json:
        d: Json = {
            "id": issue.number + repo.id * 10000,
            "number": issue.number,
            "title": issue.title,
            "body": issue.body,
            "state": issue.state,
            "labels": [{"name": n} for n in issue.labels],
            "user": issue.user.json(),
            "html_url": f"{self.url}/{repo.full_name}/issues/{issue.number}",
            "comments": sum(1 for c in repo.comments.values() if c["_issue"] == issue.number),
            # As on GitHub, to the second: two events on one issue within the same second
            # can have byte-identical payloads.
            "updated_at": _now(),
        }
        if issue.is_pull:
            d["pull_request"] = {"url": f"{self.url}/repos/{repo.full_name}/pulls/{issue.number}"}
        return d

    def _head_sha(self, repo: Repo, pull: Pull) -> str:
        sha = gitrepo.resolve(repo.path, f"refs/heads/{pull.head}")
        return sha or pull.closed_head_sha or ""

    def _pull_json(self, repo: Repo, pull: Pull) -> Json:
        issue = repo.issues[pull.number]
        head = self._head_sha(repo, pull)
        base = gitrepo.resolve(repo.path, f"refs/heads/{pull.base}") or ""
        mergeable: bool | None = None
        state = "unknown"
        if issue.state == "open" and head and base:
            mergeable = gitrepo.merge_tree(repo.path, base, head) is not None
            state = "clean" if mergeable else "dirty"
        files = gitrepo.changed_files(repo.path, pull.base, head) if head else []
        return {
            "id": pull.number + repo.id * 10000,
            "number": pull.number,
            "state": issue.state,
            "title": issue.title,
            "body": issue.body,
            "user": pull.user.json(),
            "merged": pull.merged,
            "merge_commit_sha": pull.merge_commit_sha,
            "mergeable": mergeable,
            "mergeable_state": state,
            "additions": sum(int(str(f["additions"])) for f in files),
            "deletions": sum(int(str(f["deletions"])) for f in files),
            "changed_files": len(files),
            "html_url": f"{self.url}/{repo.full_name}/pull/{pull.number}",
            "head": {"ref": pull.head, "sha": head, "repo": self._repo_json(repo)},
            "base": {"ref": pull.base, "sha": base, "repo": self._repo_json(repo)},
        }

    def _event_base(self, repo: Repo, sender: User) -> Json:
        return {
            "repository": self._repo_json(repo),
            "sender": sender.json(),
            "installation": {"id": repo.installation_id},
        }

    # -- webhooks ---------------------------------------------------------------------------

    def emit(self, event: str, payload: Json) -> None:
        """Queue a signed webhook delivery (sent in order by one thread)."""
        if self.webhooks_enabled and self.webhook_url:
            self._hooks.put((event, payload))

    def _send_hooks(self) -> None:
        with httpx.Client(timeout=10) as client:
            while True:
                item = self._hooks.get()
                if item is None:
                    self._hooks.task_done()
                    return
                event, payload = item
                body = json.dumps(payload).encode()
                delivery = str(uuid.uuid4())
                headers = {
                    "Content-Type": "application/json",
                    "X-GitHub-Event": event,
                    "X-GitHub-Delivery": delivery,
                    "X-Hub-Signature-256": sign(self.webhook_secret, body),
                    "User-Agent": "GitHub-Hookshot/local",
                }
                record: Json = {
                    "event": event,
                    "delivery": delivery,
                    "action": payload.get("action"),
                }
                try:
                    assert self.webhook_url is not None
                    resp = client.post(self.webhook_url, content=body, headers=headers)
                    record["status"] = resp.status_code
                except httpx.HTTPError as exc:
                    record["error"] = repr(exc)
                with self.lock:
                    self.deliveries.append(record)
                self._hooks.task_done()

    # -- the app ------------------------------------------------------------------------------

    def _build_app(self) -> Flask:
        app = Flask("local-github")
        app.config["MAX_CONTENT_LENGTH"] = 200 * 1024 * 1024
        srv = self

        @app.before_request
        def _before() -> Response | None:
            if request.path.startswith("/git/"):
                return None
            fault = srv._match_fault(
                request.method, request.path, request.headers.get("Accept", "")
            )
            g.fault = None
            if fault is not None:
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.after:
                    g.fault = fault
                elif fault.status:
                    return _fault_response(fault)
            g.auth = srv._auth()
            with srv.lock:
                srv.requests.append((request.method, request.path, g.auth[0]))
            return None

        @app.after_request
        def _after(resp: Response) -> Response:
            fault = getattr(g, "fault", None)
            if fault is not None and fault.after and 200 <= resp.status_code < 300:
                return _fault_response(fault)
            return resp

        # App endpoints (JWT)
        @app.get("/app")
        def get_app() -> Response:
            srv._need("app")
            return jsonify(
                {
                    "id": srv.app_id,
                    "slug": srv.app_slug,
                    "name": srv.app_slug,
                    "owner": {"login": "local"},
                    "permissions": {},
                    "events": [],
                }
            )

        @app.get("/app/installations")
        def list_installations() -> Response:
            srv._need("app")
            return jsonify(
                [{"id": i, "account": {"login": a}} for i, a in srv.installations.items()]
            )

        @app.post("/app/installations/<int:iid>/access_tokens")
        def access_token(iid: int) -> tuple[Response, int]:
            srv._need("app")
            if iid not in srv.installations:
                abort(_error(404, "Not Found"))
            token = f"ghs_{secrets.token_hex(16)}"
            expires = datetime.now(UTC) + srv.token_ttl
            with srv.lock:
                srv.tokens[token] = ("installation", iid, expires.timestamp())
            return jsonify(
                {
                    "token": token,
                    "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "permissions": {},
                    "repository_selection": "all",
                }
            ), 201

        @app.get("/installation/repositories")
        def installation_repos() -> Response:
            kind, iid = g.auth
            if kind != "installation":
                abort(_error(403, "installation token required"))
            repos = [srv._repo_json(r) for r in srv.repos.values() if r.installation_id == iid]
            return jsonify({"total_count": len(repos), "repositories": _page(repos)})

        # Repositories
        @app.get("/repos/<owner>/<name>")
        def get_repo(owner: str, name: str) -> Response:
            return jsonify(srv._repo_json(srv._repo(owner, name)))

        @app.get("/repos/<owner>/<name>/branches/<path:branch>")
        def get_branch(owner: str, name: str, branch: str) -> Response:
            repo = srv._repo(owner, name)
            sha = gitrepo.resolve(repo.path, f"refs/heads/{branch}")
            if sha is None:
                abort(_error(404, "Branch not found"))
            contexts = repo.protection.get(branch)
            protection: Json = {
                "enabled": contexts is not None,
                "required_status_checks": {
                    "enforcement_level": "off" if contexts is None else "non_admins",
                    "contexts": contexts or [],
                    "checks": [{"context": c, "app_id": None} for c in contexts or []],
                },
            }
            base = f"{srv.url}/repos/{owner}/{name}"
            return jsonify(
                {
                    "name": branch,
                    "commit": {"sha": sha, "url": f"{base}/commits/{sha}"},
                    "protected": contexts is not None,
                    "protection": protection,
                    "protection_url": f"{base}/branches/{branch}/protection",
                }
            )

        @app.get("/repos/<owner>/<name>/rules/branches/<path:branch>")
        def branch_rules(owner: str, name: str, branch: str) -> Response:
            repo = srv._repo(owner, name)
            contexts = repo.ruleset_checks.get(branch)
            rules: list[Json] = []
            if contexts is not None:
                rules.append(
                    {
                        "type": "required_status_checks",
                        "ruleset_source_type": "Repository",
                        "ruleset_source": repo.full_name,
                        "ruleset_id": 1,
                        "parameters": {
                            "strict_required_status_checks_policy": False,
                            "required_status_checks": [{"context": c} for c in contexts],
                        },
                    }
                )
            return jsonify(_page(rules))

        @app.get("/repos/<owner>/<name>/collaborators/<user>/permission")
        def permission(owner: str, name: str, user: str) -> Response:
            repo = srv._repo(owner, name)
            if user not in srv.users:
                abort(_error(404, f"{user} is not a user"))
            perm = repo.permissions.get(user, "none")
            legacy = {"maintain": "write", "triage": "read"}.get(perm, perm)
            return jsonify(
                {"permission": legacy, "role_name": perm, "user": srv.users[user].json()}
            )

        @app.get("/repos/<owner>/<name>/contents/<path:path>")
        def contents(owner: str, name: str, path: str) -> Response:
            repo = srv._repo(owner, name)
            ref = request.args.get("ref") or repo.default_branch
            data = gitrepo.show(repo.path, ref, path)
            if data is None:
                abort(_error(404, "Not Found"))
            return jsonify(
                {
                    "type": "file",
                    "path": path,
                    "name": path.rsplit("/", 1)[-1],
                    "encoding": "base64",
                    "size": len(data),
                    "content": base64.b64encode(data).decode(),
                }
            )

        # Issues
        @app.get("/repos/<owner>/<name>/issues")
        def list_issues(owner: str, name: str) -> Response:
            repo = srv._repo(owner, name)
            state = request.args.get("state", "open")
            labels = [x for x in request.args.get("labels", "").split(",") if x]
            items = [
                srv._issue_json(repo, i)
                for i in sorted(repo.issues.values(), key=lambda i: -i.number)
                if (state == "all" or i.state == state) and all(lb in i.labels for lb in labels)
            ]
            return jsonify(_page(items))

        @app.post("/repos/<owner>/<name>/issues")
        def create_issue(owner: str, name: str) -> tuple[Response, int]:
            repo = srv._repo(owner, name)
            body = request.get_json(force=True)
            with srv.lock:
                number = len(repo.issues) + 1
                issue = Issue(number, body["title"], body.get("body") or "", srv._actor())
                repo.issues[number] = issue
            srv.emit(
                "issues",
                {
                    "action": "opened",
                    "issue": srv._issue_json(repo, issue),
                    **srv._event_base(repo, srv._actor()),
                },
            )
            for label in body.get("labels") or []:
                srv._label(repo, issue, label)
            return jsonify(srv._issue_json(repo, issue)), 201

        @app.get("/repos/<owner>/<name>/issues/<int:number>")
        def get_issue(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            return jsonify(srv._issue_json(repo, srv._issue(repo, number)))

        @app.patch("/repos/<owner>/<name>/issues/<int:number>")
        def update_issue(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            issue = srv._issue(repo, number)
            body = request.get_json(force=True)
            kind, who = g.auth
            text_keys = [k for k in ("title", "body") if k in body]
            if (
                text_keys
                and kind == "user"
                and who != issue.user.login
                and repo.permissions.get(who) not in ("write", "maintain", "admin")
            ):
                abort(_error(403, "Must have write access or be the author to edit an issue"))
            changes: Json = {}
            with srv.lock:
                for key in text_keys:
                    if body[key] != getattr(issue, key):
                        changes[key] = {"from": getattr(issue, key)}
                        setattr(issue, key, body[key])
            if changes:
                srv.emit(
                    "issues",
                    {
                        "action": "edited",
                        "changes": changes,
                        "issue": srv._issue_json(repo, issue),
                        **srv._event_base(repo, srv._actor()),
                    },
                )
            if body.get("state") in ("open", "closed") and body["state"] != issue.state:
                srv._set_state(repo, issue, body["state"], srv._actor())
            return jsonify(srv._issue_json(repo, issue))

        @app.post("/repos/<owner>/<name>/issues/<int:number>/labels")
        def add_labels(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            srv._need_triage(repo)
            issue = srv._issue(repo, number)
            body = request.get_json(force=True)
            labels = body.get("labels", body) if isinstance(body, dict) else body
            for label in labels:
                srv._label(repo, issue, label if isinstance(label, str) else label["name"])
            return jsonify([{"name": n} for n in issue.labels])

        @app.delete("/repos/<owner>/<name>/issues/<int:number>/labels/<label>")
        def remove_label(owner: str, name: str, number: int, label: str) -> Response:
            repo = srv._repo(owner, name)
            srv._need_triage(repo)
            issue = srv._issue(repo, number)
            if label not in issue.labels:
                abort(_error(404, "Label does not exist"))
            issue.labels.remove(label)
            srv.emit(
                "issues",
                {
                    "action": "unlabeled",
                    "label": {"name": label},
                    "issue": srv._issue_json(repo, issue),
                    **srv._event_base(repo, srv._actor()),
                },
            )
            return jsonify([{"name": n} for n in issue.labels])

        @app.get("/repos/<owner>/<name>/issues/<int:number>/events")
        def issue_events(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            return jsonify(_page(srv._issue(repo, number).events))

        @app.get("/repos/<owner>/<name>/issues/<int:number>/comments")
        def list_comments(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            srv._issue(repo, number)
            items = [_public(c) for c in repo.comments.values() if c["_issue"] == number]
            return jsonify(_page(items))

        @app.post("/repos/<owner>/<name>/issues/<int:number>/comments")
        def create_comment(owner: str, name: str, number: int) -> tuple[Response, int]:
            repo = srv._repo(owner, name)
            issue = srv._issue(repo, number)
            actor = srv._actor()
            with srv.lock:
                cid = next(srv._ids)
                comment = {
                    "id": cid,
                    "_issue": number,
                    "body": request.get_json(force=True)["body"],
                    "user": actor.json(),
                    "html_url": f"{srv.url}/{repo.full_name}/issues/{number}#issuecomment-{cid}",
                    "created_at": _now(),
                    "updated_at": _now(),
                }
                repo.comments[cid] = comment
            srv.emit(
                "issue_comment",
                {
                    "action": "created",
                    "comment": _public(comment),
                    "issue": srv._issue_json(repo, issue),
                    **srv._event_base(repo, actor),
                },
            )
            return jsonify(_public(comment)), 201

        @app.get("/repos/<owner>/<name>/issues/comments/<int:cid>")
        def get_comment(owner: str, name: str, cid: int) -> Response:
            repo = srv._repo(owner, name)
            if cid not in repo.comments:
                abort(_error(404, "Not Found"))
            return jsonify(_public(repo.comments[cid]))

        @app.patch("/repos/<owner>/<name>/issues/comments/<int:cid>")
        def update_comment(owner: str, name: str, cid: int) -> Response:
            repo = srv._repo(owner, name)
            comment = repo.comments.get(cid)
            if comment is None:
                abort(_error(404, "Not Found"))
            if comment["user"]["login"] != srv._actor().login:
                abort(_error(403, "Resource not accessible by integration"))
            comment["body"] = request.get_json(force=True)["body"]
            comment["updated_at"] = _now()
            return jsonify(_public(comment))

        @app.post("/repos/<owner>/<name>/issues/comments/<int:cid>/reactions")
        def react(owner: str, name: str, cid: int) -> tuple[Response, int]:
            repo = srv._repo(owner, name)
            if cid not in repo.comments:
                abort(_error(404, "Not Found"))
            content = request.get_json(force=True)["content"]
            actor = srv._actor()
            for r in repo.reactions:
                if r["comment_id"] == cid and r["content"] == content and r["user"] == actor.login:
                    return jsonify(r), 200
            reaction = {
                "id": next(srv._ids),
                "comment_id": cid,
                "content": content,
                "user": actor.login,
            }
            repo.reactions.append(reaction)
            return jsonify(reaction), 201

        # Pull requests
        @app.get("/repos/<owner>/<name>/pulls")
        def list_pulls(owner: str, name: str) -> Response:
            repo = srv._repo(owner, name)
            state = request.args.get("state", "open")
            head = request.args.get("head", "")
            branch = head.split(":", 1)[1] if ":" in head else head
            items = [
                srv._pull_json(repo, p)
                for p in sorted(repo.pulls.values(), key=lambda p: -p.number)
                if (state == "all" or repo.issues[p.number].state == state)
                and (not branch or p.head == branch)
            ]
            return jsonify(_page(items))

        @app.post("/repos/<owner>/<name>/pulls")
        def create_pull(owner: str, name: str) -> tuple[Response, int]:
            repo = srv._repo(owner, name)
            body = request.get_json(force=True)
            head, base = body["head"].split(":")[-1], body["base"]
            if not gitrepo.resolve(repo.path, f"refs/heads/{head}"):
                abort(_error(422, "Validation Failed: head does not exist"))
            with srv.lock:
                for p in repo.pulls.values():
                    if p.head == head and repo.issues[p.number].state == "open":
                        abort(_error(422, f"A pull request already exists for {owner}:{head}."))
                number = len(repo.issues) + 1
                actor = srv._actor()
                repo.issues[number] = Issue(
                    number, body["title"], body.get("body") or "", actor, is_pull=True
                )
                repo.pulls[number] = Pull(number, head, base, actor)
            return jsonify(srv._pull_json(repo, repo.pulls[number])), 201

        @app.get("/repos/<owner>/<name>/pulls/<int:number>")
        def get_pull(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            pull = srv._pull(repo, number)
            if "diff" in request.headers.get("Accept", ""):
                text = gitrepo.diff(repo.path, pull.base, srv._head_sha(repo, pull))
                return Response(text, mimetype="text/x-diff")
            return jsonify(srv._pull_json(repo, pull))

        @app.patch("/repos/<owner>/<name>/pulls/<int:number>")
        def update_pull(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            pull = srv._pull(repo, number)
            body = request.get_json(force=True)
            issue = repo.issues[number]
            for key in ("title", "body"):
                if key in body:
                    setattr(issue, key, body[key])
            if body.get("state") == "closed":
                issue.state = "closed"
            return jsonify(srv._pull_json(repo, pull))

        @app.get("/repos/<owner>/<name>/compare/<path:basehead>")
        def compare(owner: str, name: str, basehead: str) -> Response:
            repo = srv._repo(owner, name)
            base, _, head = basehead.partition("...")
            if not (gitrepo.resolve(repo.path, base) and gitrepo.resolve(repo.path, head)):
                abort(_error(404, "Not Found"))
            if "diff" in request.headers.get("Accept", ""):
                return Response(gitrepo.diff(repo.path, base, head), mimetype="text/x-diff")
            base_sha = gitrepo.resolve(repo.path, base) or base
            head_sha = gitrepo.resolve(repo.path, head) or head
            ahead = int(gitrepo.git(repo.path, "rev-list", "--count", f"{base_sha}..{head_sha}"))
            behind = int(gitrepo.git(repo.path, "rev-list", "--count", f"{head_sha}..{base_sha}"))
            status = (
                "identical"
                if not ahead and not behind
                else "ahead"
                if not behind
                else "behind"
                if not ahead
                else "diverged"
            )
            return jsonify(
                {
                    "status": status,
                    "ahead_by": ahead,
                    "behind_by": behind,
                    "base_commit": {"sha": base_sha},
                }
            )

        @app.get("/repos/<owner>/<name>/pulls/<int:number>/files")
        def pull_files(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            pull = srv._pull(repo, number)
            return jsonify(
                _page(gitrepo.changed_files(repo.path, pull.base, srv._head_sha(repo, pull)))
            )

        @app.get("/repos/<owner>/<name>/pulls/<int:number>/reviews")
        def list_reviews(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            srv._pull(repo, number)
            return jsonify(_page(repo.reviews.get(number, [])))

        @app.get("/repos/<owner>/<name>/pulls/<int:number>/comments")
        def list_review_comments(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            srv._pull(repo, number)
            return jsonify(_page(repo.review_comments.get(number, [])))

        @app.post("/repos/<owner>/<name>/pulls/<int:number>/reviews")
        def create_review(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            pull = srv._pull(repo, number)
            body = request.get_json(force=True)
            actor = srv._actor()
            event = body.get("event", "COMMENT")
            if event in ("APPROVE", "REQUEST_CHANGES") and actor.login == pull.user.login:
                verb = "approve" if event == "APPROVE" else "request changes on"
                abort(_error(422, f"Unprocessable Entity: Can not {verb} your own pull request"))
            head = srv._head_sha(repo, pull)
            commit = body.get("commit_id") or head
            lines = right_side_lines(gitrepo.diff(repo.path, pull.base, commit))
            comments = body.get("comments") or []
            for c in comments:
                if c.get("line") not in lines.get(c.get("path", ""), set()):
                    abort(_error(422, "Unprocessable Entity: Line could not be resolved"))
            state = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED"}.get(
                event, "COMMENTED"
            )
            with srv.lock:
                review = {
                    "id": next(srv._ids),
                    "user": actor.json(),
                    "body": body.get("body") or "",
                    "state": state,
                    "commit_id": commit,
                    "submitted_at": _now(),
                }
                repo.reviews.setdefault(number, []).append(review)
                for c in comments:
                    repo.review_comments.setdefault(number, []).append(
                        {
                            "id": next(srv._ids),
                            "pull_request_review_id": review["id"],
                            "path": c["path"],
                            "line": c["line"],
                            "side": c.get("side", "RIGHT"),
                            "body": c["body"],
                            "user": actor.json(),
                            "commit_id": commit,
                        }
                    )
            srv.emit(
                "pull_request_review",
                {
                    "action": "submitted",
                    "review": review,
                    "pull_request": srv._pull_json(repo, pull),
                    **srv._event_base(repo, actor),
                },
            )
            return jsonify(review)

        @app.put("/repos/<owner>/<name>/pulls/<int:number>/merge")
        def merge(owner: str, name: str, number: int) -> Response:
            repo = srv._repo(owner, name)
            pull = srv._pull(repo, number)
            body = request.get_json(silent=True) or {}
            with srv.lock:
                if pull.merged or repo.issues[number].state != "open":
                    abort(_error(405, "Pull Request is not mergeable"))
                head = srv._head_sha(repo, pull)
                if body.get("sha") and body["sha"] != head:
                    abort(_error(409, "Head branch was modified. Review and try the merge again."))
                method = body.get("merge_method", "merge")
                if method != "squash":
                    abort(_error(405, f"{method} merges are not supported by the local server"))
                issue = repo.issues[number]
                title = body.get("commit_title") or f"{issue.title} (#{number})"
                message = title + (
                    "\n\n" + body["commit_message"] if body.get("commit_message") else ""
                )
                result = gitrepo.squash_merge(repo.path, pull.base, head, message)
                if result.conflict:
                    abort(_error(405, "Pull Request is not mergeable"))
                pull.merged = True
                pull.merge_commit_sha = result.sha
                pull.closed_head_sha = head
                issue.state = "closed"
            # As GitHub does: closing keywords in the PR body and in the commit that lands.
            for target_repo, closed in srv._closing_references(repo, f"{issue.body}\n{message}"):
                target = target_repo.issues.get(closed)
                if target is not None and target.state == "open":
                    srv._set_state(target_repo, target, "closed", srv._actor())
            return jsonify(
                {"sha": result.sha, "merged": True, "message": "Pull Request successfully merged"}
            )

        @app.delete("/repos/<owner>/<name>/git/refs/<path:ref>")
        def delete_ref(owner: str, name: str, ref: str) -> tuple[str, int]:
            repo = srv._repo(owner, name)
            if not gitrepo.resolve(repo.path, f"refs/{ref}"):
                abort(_error(422, "Reference does not exist"))
            gitrepo.git(repo.path, "update-ref", "-d", f"refs/{ref}")
            return "", 204

        # Checks and statuses
        @app.post("/repos/<owner>/<name>/check-runs")
        def create_check_run(owner: str, name: str) -> tuple[Response, int]:
            repo = srv._repo(owner, name)
            body = request.get_json(force=True)
            with srv.lock:
                run = {
                    "id": next(srv._ids),
                    "name": body["name"],
                    "head_sha": body["head_sha"],
                    "status": body.get("status", "queued"),
                    "conclusion": body.get("conclusion"),
                    "output": body.get("output") or {},
                    "details_url": body.get("details_url"),
                    "app": {
                        "id": srv.app_id if g.auth[0] == "installation" else None,
                        "slug": srv.app_slug,
                    },
                    "check_suite": {"head_branch": srv._branch_of(repo, body["head_sha"])},
                }
                repo.check_runs[run["id"]] = run
            return jsonify(run), 201

        @app.patch("/repos/<owner>/<name>/check-runs/<int:rid>")
        def update_check_run(owner: str, name: str, rid: int) -> Response:
            repo = srv._repo(owner, name)
            run = repo.check_runs.get(rid)
            if run is None:
                abort(_error(404, "Not Found"))
            body = request.get_json(force=True)
            for key in ("status", "conclusion", "output", "details_url"):
                if key in body:
                    run[key] = body[key]
            if body.get("conclusion"):
                run["status"] = "completed"
            return jsonify(run)

        @app.get("/repos/<owner>/<name>/commits/<path:ref>/check-runs")
        def list_check_runs(owner: str, name: str, ref: str) -> Response:
            repo = srv._repo(owner, name)
            sha = gitrepo.resolve(repo.path, ref) or ref
            runs = [r for r in repo.check_runs.values() if r["head_sha"] == sha]
            return jsonify({"total_count": len(runs), "check_runs": _page(runs)})

        @app.get("/repos/<owner>/<name>/commits/<path:ref>/status")
        def combined_status(owner: str, name: str, ref: str) -> Response:
            repo = srv._repo(owner, name)
            sha = gitrepo.resolve(repo.path, ref) or ref
            latest: dict[str, Json] = {}
            for s in repo.statuses.get(sha, []):
                latest[s["context"]] = s
            states = [s["state"] for s in latest.values()]
            state = (
                "failure"
                if any(s in ("failure", "error") for s in states)
                else "pending"
                if any(s == "pending" for s in states) or not states
                else "success"
            )
            return jsonify(
                {
                    "state": state,
                    "sha": sha,
                    "total_count": len(latest),
                    "statuses": _page(list(latest.values())),  # 30 a page, as GitHub
                }
            )

        @app.post("/repos/<owner>/<name>/statuses/<sha>")
        def create_status(owner: str, name: str, sha: str) -> tuple[Response, int]:
            repo = srv._repo(owner, name)
            body = request.get_json(force=True)
            status = {
                "id": next(srv._ids),
                "state": body["state"],
                "context": body.get("context", "default"),
                "description": body.get("description"),
            }
            repo.statuses.setdefault(sha, []).append(status)
            return jsonify(status), 201

        # git smart HTTP
        @app.route("/git/<owner>/<path:rest>", methods=["GET", "POST"])
        def git_http(owner: str, rest: str) -> Response:
            return srv._git_http(owner, rest)

        @app.errorhandler(404)
        def not_found(exc: Exception) -> tuple[Response, int]:
            return jsonify({"message": "Not Found"}), 404

        return app

    # -- helpers used by routes --------------------------------------------------------------

    def _need(self, kind: str) -> None:
        if g.auth[0] != kind:
            abort(_error(401, f"{kind} authentication required"))

    def _match_fault(self, method: str, path: str, accept: str = "") -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if (
                    fault.hits < fault.times
                    and fault.method in (method, "*")
                    and fault.path.search(path)
                    and fault.accept in accept
                ):
                    fault.hits += 1
                    return fault
        return None

    def _closing_references(self, repo: Repo, text: str) -> list[tuple[Repo, int]]:
        """The issues GitHub closes for ``text`` landing in ``repo``: a closing keyword
        (close/fix/resolve and their forms, any case, an optional colon) directly before
        ``#N``, ``owner/repo#N`` or an issue URL, on this server."""
        found = []
        for ref in _CLOSING_REF.finditer(text):
            owner, name, number = ref.group("owner"), ref.group("name"), ref.group("number")
            if owner is None:
                owner, name = ref.group("uowner"), ref.group("uname")
            if owner is None or name is None:
                target: Repo | None = repo
            else:
                target = self.repos.get(f"{owner}/{name}")
            if number is None:
                number = ref.group("unumber")
            if target is not None:
                found.append((target, int(number)))
        return found

    def _issue(self, repo: Repo, number: int) -> Issue:
        issue = repo.issues.get(number)
        if issue is None:
            abort(_error(404, "Not Found"))
        return issue

    def _pull(self, repo: Repo, number: int) -> Pull:
        pull = repo.pulls.get(number)
        if pull is None:
            abort(_error(404, "Not Found"))
        return pull

    def _branch_of(self, repo: Repo, sha: str) -> str | None:
        out = gitrepo.git(
            repo.path,
            "for-each-ref",
            "--points-at",
            sha,
            "--format=%(refname:short)",
            "refs/heads",
            check=False,
        )
        names = out.split()
        return names[0] if names else None

    def _label(self, repo: Repo, issue: Issue, label: str) -> None:
        if label in issue.labels:
            return
        issue.labels.append(label)
        issue.events.append(
            {
                "id": next(self._ids),
                "event": "labeled",
                "label": {"name": label},
                "actor": self._actor().json(),
                "created_at": _now(),
            }
        )
        self.emit(
            "issues",
            {
                "action": "labeled",
                "label": {"name": label},
                "issue": self._issue_json(repo, issue),
                **self._event_base(repo, self._actor()),
            },
        )

    def _set_state(self, repo: Repo, issue: Issue, state: str, actor: User) -> None:
        issue.state = state
        action = "closed" if state == "closed" else "reopened"
        self.emit(
            "issues",
            {
                "action": action,
                "issue": self._issue_json(repo, issue),
                **self._event_base(repo, actor),
            },
        )

    def require_checks(
        self, full_name: str, branch: str, contexts: list[str], *, ruleset: bool = False
    ) -> None:
        """Make ``branch`` require these status checks, by branch protection or a ruleset."""
        repo = self.repos[full_name]
        with self.lock:
            (repo.ruleset_checks if ruleset else repo.protection)[branch] = list(contexts)

    def complete_check_suite(self, full_name: str, sha: str, conclusion: str = "success") -> None:
        """Send ``check_suite.completed`` for ``sha`` as another CI App would."""
        repo = self.repos[full_name]
        self.emit(
            "check_suite",
            {
                "action": "completed",
                "check_suite": {
                    "head_branch": self._branch_of(repo, sha),
                    "head_sha": sha,
                    "conclusion": conclusion,
                    "app": {"id": 1, "slug": "ci"},
                },
                **self._event_base(repo, self.add_user("ci-bot")),
            },
        )

    def _git_http(self, owner: str, rest: str) -> Response:
        name, sep, tail = rest.partition(".git/")
        repo = self.repos.get(f"{owner}/{name}")
        if not sep or repo is None:
            return Response("not found", status=404)
        creds = request.authorization
        with self.lock:
            entry = self.tokens.get(creds.password or "") if creds else None
        allowed = (
            entry is not None
            and entry[2] >= time.time()
            and (
                (entry[0] == "installation" and entry[1] == repo.installation_id)
                or (entry[0] == "user" and entry[1] in repo.permissions)
            )
        )
        if not allowed:
            return Response(
                "auth required", status=401, headers={"WWW-Authenticate": 'Basic realm="GitHub"'}
            )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root / "git"),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": f"/{owner}/{name}.git/{tail}",
            "REQUEST_METHOD": request.method,
            "QUERY_STRING": request.query_string.decode(),
            "CONTENT_TYPE": request.headers.get("Content-Type", ""),
            "REMOTE_USER": creds.username if creds and creds.username else "x-access-token",
            "REMOTE_ADDR": request.remote_addr or "127.0.0.1",
            "GIT_HTTP_MAX_REQUEST_BUFFER": "200M",
        }
        if request.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = request.headers["Content-Encoding"]
        if request.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = request.headers["Git-Protocol"]
        data = request.get_data()
        env["CONTENT_LENGTH"] = str(len(data))
        proc = subprocess.run(
            ["git", "http-backend"], input=data, capture_output=True, env=env, timeout=300
        )
        head, _, body = proc.stdout.partition(b"\r\n\r\n")
        status = 200
        headers: dict[str, str] = {}
        for line in head.decode(errors="replace").split("\r\n"):
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers[key.strip()] = value.strip()
        return Response(body, status=status, headers=headers)


_CLOSING_REF = re.compile(
    r"(?i)\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?):?\s+"
    r"(?:(?:(?P<owner>[\w.-]+)/(?P<name>[\w.-]+))?#(?P<number>\d+)"
    r"|https?://[^\s/]+/(?P<uowner>[\w.-]+)/(?P<uname>[\w.-]+)/issues/(?P<unumber>\d+))\b"
)


def _error(status: int, message: str) -> Response:
    resp = jsonify({"message": message, "documentation_url": "https://docs.github.com/rest"})
    resp.status_code = status
    return resp


def _fault_response(fault: Fault) -> Response:
    resp = jsonify(fault.body)
    resp.status_code = fault.status
    for k, v in fault.headers.items():
        resp.headers[k] = v
    return resp


def _public(d: Json) -> Json:
    return {k: v for k, v in d.items() if not k.startswith("_")}


def _page(items: list[Any]) -> list[Any]:
    per_page = int(request.args.get("per_page", 30))
    page = int(request.args.get("page", 1))
    return items[(page - 1) * per_page : page * per_page]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
