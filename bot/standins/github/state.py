"""The stand-in's in-memory world: users, installations, repositories and what is in them,
tokens, injected faults, and the record of requests and webhook deliveries.

``State`` also holds the lookups every resource module needs inside a request: who is
calling, and the repository, issue or pull request the URL names (or GitHub's 404).
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import queue
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from flask import abort, g

from bot.standins import gitrepo
from bot.standins.github.wire import Json, error
from bot.standins.receive_hook import REFUSED_FILE

APP_YML = Path(__file__).resolve().parents[2] / "ops" / "app.yml"


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
    # Who changed the title or body, and when ({"field", "editor", "type", "at"}): what
    # GitHub's GraphQL API shows as userContentEdits and RenamedTitleEvent.
    edits: list[Json] = field(default_factory=list)
    created_at: str = ""


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
class ReviewRule:
    """What a base branch asks of a pull request before it merges: a ruleset's
    ``pull_request`` rule (``source="ruleset"``) or classic branch protection's
    ``required_pull_request_reviews`` and ``required_conversation_resolution``
    (``source="classic"``), with GitHub's parameter names."""

    required_approving_review_count: int = 0
    require_code_owner_review: bool = False
    dismiss_stale_reviews_on_push: bool = False
    require_last_push_approval: bool = False
    required_review_thread_resolution: bool = False
    allowed_merge_methods: tuple[str, ...] = ("merge", "squash", "rebase")
    source: str = "ruleset"


@dataclass
class MergeQueueRule:
    """A ruleset's ``merge_queue`` rule, with GitHub's parameter names and defaults
    (``GET rules/branches/{branch}`` lists it so). The stand-in builds one merge group
    at a time (``max_entries_to_build`` and the grouping settings are shown, not used)."""

    merge_method: str = "MERGE"  # MERGE, SQUASH or REBASE: how the queue lands a group
    max_entries_to_build: int = 5
    min_entries_to_merge: int = 1
    max_entries_to_merge: int = 5
    min_entries_to_merge_wait_minutes: int = 5
    grouping_strategy: str = "ALLGREEN"
    check_response_timeout_minutes: int = 60
    # "ruleset": listed by GET rules/branches; "classic": branch protection's "Require
    # merge queue", which an App without administration permission cannot read.
    source: str = "ruleset"


@dataclass
class QueueEntry:
    """A pull request in a base branch's merge queue, and its merge group once built."""

    number: int
    head: str  # the pull request's head when it was enqueued
    enqueuer: str
    enqueued_at: str
    state: str = "QUEUED"  # MergeQueueEntryState: QUEUED, AWAITING_CHECKS, MERGEABLE...
    group_sha: str = ""  # the merge group's commit (base + the pull request's changes)
    group_ref: str = ""  # gh-readonly-queue/<base>/pr-<n>-<base sha>
    base_sha: str = ""


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
    # Reviews and conversations a branch requires before a merge (review_rules.py).
    review_rules: dict[str, ReviewRule] = field(default_factory=dict)
    # The repository's merge buttons (Settings > General > Pull Requests).
    allow_squash_merge: bool = True
    allow_merge_commit: bool = True
    allow_rebase_merge: bool = True
    # "Automatically delete head branches": GitHub deletes a merged pull request's head
    # branch itself (``after_merge``); off by default, as on GitHub.
    delete_branch_on_merge: bool = False
    # Other ruleset rules ``GET rules/branches/{branch}`` lists, as (fnmatch pattern on
    # the branch name, the rule with GitHub's ``type`` and ``parameters``): listed only;
    # what enforces one (receive-pack's refusals, the merge queue) lives elsewhere.
    listed_rules: list[tuple[str, Json]] = field(default_factory=list)
    resolved_threads: set[int] = field(default_factory=set)  # review comment ids
    requested_reviewers: dict[int, list[str]] = field(default_factory=dict)
    # Every merge the server refused: (pull number, status, message).
    merge_refusals: list[tuple[int, int, str]] = field(default_factory=list)
    # Merge queues (merge_queue.py): the rule per base branch, each base's entries in
    # order, what the stand-in's CI reports on a merge group's required checks per base
    # ("success", "failure"; "" reports nothing: the test reports them), every enqueue
    # call (pull number, expectedHeadOid, actor), and each pull request's timeline of
    # added/removed events.
    merge_queues: dict[str, MergeQueueRule] = field(default_factory=dict)
    queue: dict[str, list[QueueEntry]] = field(default_factory=dict)
    queue_ci: dict[str, str] = field(default_factory=dict)
    enqueue_calls: list[tuple[int, str, str]] = field(default_factory=list)
    queue_events: dict[int, list[Json]] = field(default_factory=dict)
    # What receive-pack refuses (bot/standins/receive_hook.py): secret scanning's push
    # protection, and rulesets restricting creation (or deletion) of refs matching these
    # patterns (fnmatch on the full ref name, e.g. ``refs/heads/loop/*``). Large files
    # are always refused, and workflow changes from an installation without
    # ``workflows``. A restricted deletion is refused by REST's DELETE too, and GitHub's
    # "Automatically delete head branches" leaves such a branch.
    push_protection: bool = False
    restrict_creation: list[str] = field(default_factory=list)
    restrict_deletion: list[str] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def deletion_restricted(self, ref: str) -> bool:
        """A ruleset's "Restrict deletions" on ``ref``."""
        return any(fnmatch.fnmatchcase(ref, p) for p in self.restrict_deletion)

    def classic_protected(self, ref: str) -> bool:
        """Classic branch protection on ``ref``: it forbids deletion unless "Allow
        deletions" is on, which is off by default (and not modelled here)."""
        return ref.removeprefix("refs/heads/") in self.protection

    def head_sha(self, pull: Pull) -> str:
        """The pull request's head: its branch, or where the branch was when it merged."""
        if pull.merged and pull.closed_head_sha:
            return pull.closed_head_sha  # a merged pull request no longer follows its branch
        sha = gitrepo.resolve(self.path, f"refs/heads/{pull.head}")
        return sha or pull.closed_head_sha or ""

    def refused_pushes(self) -> list[Json]:
        """Every ref update receive-pack refused, oldest first: ``cause`` (workflows,
        secret, large_file, creation_restricted, deletion_restricted), ``ref``, ``new``,
        ``reason``."""
        log = self.path / REFUSED_FILE
        if not log.is_file():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line]

    def refusals(self, cause: str) -> int:
        return sum(1 for r in self.refused_pushes() if r["cause"] == cause)

    def branch_at(self, sha: str) -> str | None:
        out = gitrepo.git(
            self.path,
            "for-each-ref",
            "--points-at",
            sha,
            "--format=%(refname:short)",
            "refs/heads",
            check=False,
        )
        names = out.split()
        return names[0] if names else None


class State:
    """Everything the server knows; guarded by ``lock`` where threads meet."""

    def __init__(
        self,
        root: Path,
        *,
        app_id: int,
        app_slug: str,
        private_key_pem: str,
        public_key: RSAPublicKey,
    ) -> None:
        self.root = root
        (root / "git").mkdir(parents=True, exist_ok=True)
        self.app_id = app_id
        self.app_slug = app_slug
        self.private_key_pem = private_key_pem
        self.public_key = public_key
        self.lock = threading.RLock()
        self._ids = itertools.count(1000)
        self.users: dict[str, User] = {}
        self.bot = self.new_user(f"{app_slug}[bot]", type="Bot")
        self.installations: dict[int, str] = {}
        # What each installation was granted (its owner accepted): permissions, events,
        # suspended_at, as GET /app/installations shows them; see add_installation.
        self.grants: dict[int, Json] = {}
        self.repos: dict[str, Repo] = {}
        self.tokens: dict[str, tuple[str, Any, float]] = {}  # token -> (kind, who, expires)
        self.faults: list[Fault] = []
        # GitHub's secondary limit on writes per installation (server.py, off when None),
        # the writes in the window by installation, and every request it refused.
        self.write_limit: int | None = None
        self.write_window = 60.0
        self.writes: dict[int, list[float]] = {}
        self.limited: list[tuple[str, str, int, float, int]] = []  # ..., time, Retry-After
        self.write_log: list[tuple[float, str, str, int]] = []  # (time, method, path, iid)
        # GitHub's limit on concurrent requests per installation (off when None): past
        # it, a 403 with the secondary-limit message and no Retry-After. The most seen.
        self.concurrent_limit: int | None = None
        self.inflight: dict[int, int] = {}
        self.peak_inflight = 0
        # How long each installation request takes (a loaded GitHub), while it counts.
        self.request_delay = 0.0
        # How long a push takes once received (github.com: often seconds).
        self.push_delay = 0.0
        # git's smart HTTP unreachable (a 503 to every request): what GitHub's git
        # front ends answer in an outage, while the REST API may still answer.
        self.git_down = False
        # Each push received (receive-pack's POST): (when, repository). Not REST writes:
        # the fleet bench shows them beside them.
        self.git_pushes: list[tuple[float, str]] = []
        self.requests: list[tuple[str, str, str]] = []  # (method, path, auth kind)
        # GitHub's primary rate limit (server.py): REST requests counted per credential
        # (kind, who) since ``rate_reset``, told in X-RateLimit-* headers, never refused.
        # 15,000 an hour, an installation's in an Enterprise Cloud organisation: the
        # fleet bench's 50 loops in one installation stay within it. A 304 to a
        # conditional GET is not counted, as GitHub documents; each one is recorded in
        # ``not_modified`` (method, path, auth kind).
        self.rate_limit = 15000
        self.rate_used: dict[tuple[str, Any], int] = {}
        self.rate_lock = threading.Lock()  # the rate counters' and ``not_modified``'s
        self.rate_reset = int(time.time()) + 3600
        self.not_modified: list[tuple[str, str, str]] = []
        self.webhook_url: str | None = None
        self.webhook_secret = "local-webhook-secret"
        self.webhooks_enabled = True
        self.deliveries: list[Json] = []
        self.token_ttl = timedelta(hours=1)
        self.outbox: queue.Queue[tuple[str, Json] | None] = queue.Queue()
        self.url = ""
        # The manifest flow (manifests.py): code -> (the App's answer, expiry time).
        self.manifest_codes: dict[str, tuple[Json, float]] = {}
        # What the App was registered with (empty: app.yml's, see manifests.py).
        self.app_permissions: dict[str, str] = {}
        self.app_events: list[str] = []
        # Files attached to issues (attachments.py): key -> Upload; how long a signed URL
        # in ``body_html`` lives (GitHub's last a few minutes), and the key that signs them.
        self.uploads: dict[str, Any] = {}
        self.served: list[str] = []  # the keys of the uploads served, in order
        self.served_with_credentials: list[str] = []  # those asked for with any
        self.attachment_ttl = 300.0
        self.attachment_secret = secrets.token_hex(16)

    def replace_app(
        self,
        *,
        app_id: int,
        slug: str,
        private_key_pem: str,
        public_key: RSAPublicKey,
        webhook_secret: str,
        webhook_url: str,
        permissions: dict[str, str],
        events: list[str],
    ) -> None:
        """A newly registered App becomes the one this server knows (manifests.py)."""
        with self.lock:
            self.app_id = app_id
            self.app_slug = slug
            self.private_key_pem = private_key_pem
            self.public_key = public_key
            self.webhook_secret = webhook_secret
            self.webhook_url = webhook_url
            self.app_permissions = dict(permissions)
            self.app_events = list(events)
            self.bot = self.users.get(f"{slug}[bot]") or self.new_user(f"{slug}[bot]", type="Bot")

    def registered(self) -> tuple[dict[str, str], list[str]]:
        """The App's own permissions and events: what it was registered with, else what
        app.yml asks (an App registered by hand with exactly loopbot's manifest)."""
        with self.lock:
            if self.app_permissions:
                return dict(self.app_permissions), list(self.app_events)
        # The packaged file, read as data: the stand-in does not import bot.ops.
        manifest = yaml.safe_load(APP_YML.read_text())
        return dict(manifest["default_permissions"]), list(manifest["default_events"])

    def next_id(self) -> int:
        """One counter for every id (users, repos, comments, reviews...), as unique as GitHub's."""
        return next(self._ids)

    def new_user(self, login: str, type: str = "User") -> User:
        user = User(login=login, id=self.next_id(), type=type, token=f"ghu_{secrets.token_hex(12)}")
        self.users[login] = user
        if type == "User":
            self.tokens[user.token] = ("user", login, float("inf"))
        return user

    def add_user(self, login: str) -> User:
        with self.lock:
            return self.users.get(login) or self.new_user(login)

    def emit(self, event: str, payload: Json) -> None:
        """Queue a signed webhook delivery (sent in order by one thread, see webhooks.py)."""
        if self.webhooks_enabled and self.webhook_url:
            self.outbox.put((event, payload))

    def match_fault(self, method: str, path: str, accept: str = "") -> Fault | None:
        """The first injected fault this request triggers, counted as used."""
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

    # -- inside a request: g.auth is (kind, who) from auth.authenticate -------------------

    def actor(self) -> User:
        kind, who = g.auth
        if kind == "user":
            return self.users[who]
        return self.bot

    def find_repo(self, owner: str, name: str) -> Repo:
        repo = self.repos.get(f"{owner}/{name}")
        if repo is None:
            abort(error(404, "Not Found"))
        kind, who = g.auth
        if kind == "installation" and repo.installation_id != who:
            abort(error(404, "Not Found"))
        return repo  # users: a public repository, anyone may read, open issues and comment

    def find_issue(self, repo: Repo, number: int) -> Issue:
        issue = repo.issues.get(number)
        if issue is None:
            abort(error(404, "Not Found"))
        return issue

    def find_pull(self, repo: Repo, number: int) -> Pull:
        pull = repo.pulls.get(number)
        if pull is None:
            abort(error(404, "Not Found"))
        return pull

    def need(self, kind: str) -> None:
        if g.auth[0] != kind:
            abort(error(401, f"{kind} authentication required"))

    def need_triage(self, repo: Repo) -> None:
        kind, who = g.auth
        if kind == "user" and repo.permissions.get(who) not in (
            "triage",
            "write",
            "maintain",
            "admin",
        ):
            abort(error(403, "Must have triage access to change labels"))
