"""An installation's issues: reading them and their labels, the issues triage opens
(jobs/intake), comments (created once, edited after) and reactions; and the one GraphQL
read, who last edited an issue (REST does not say)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast

from bot.io.github.failures import NotFound
from bot.io.github.plumbing import InstallationBase, _Model, _split, marker


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


class Issues(InstallationBase):
    """Issues, their labels and comments, and who last edited them."""

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

    # -- issues and comments --------------------------------------------------------

    def issue(self, repo: str, number: int) -> IssueInfo:
        return _issue(self._call(lambda gh: gh.rest.issues.get(*_split(repo), number).json()))

    def issue_rendered(self, repo: str, number: int) -> tuple[str, str, str]:
        """The issue's title, Markdown body and ``body_html`` as the ``full`` media type
        renders it: the HTML names each attachment at a signed URL that lives minutes."""
        d = self._call(
            lambda gh: gh.rest.issues.get(
                *_split(repo), number, headers={"Accept": "application/vnd.github.full+json"}
            ).json()
        )
        return str(d.get("title") or ""), str(d.get("body") or ""), str(d.get("body_html") or "")

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

    def rewrite_issue(self, repo: str, number: int, key: str, title: str, body: str) -> IssueInfo:
        """Set an issue loopbot opened to a new title and body (redacted and defused, with
        ``key``'s marker), as ``create_issue`` would have written them: a scheduled task's
        next run on the issue its last run left open (a PATCH: repeating it is harmless)."""
        title, text = self._title(title), f"{self._text(body)}\n\n{marker(key)}"
        return _issue(
            self._call(
                lambda gh: gh.rest.issues.update(
                    *_split(repo), number, title=title, body=text
                ).json()
            )
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

    def comment_rendered(self, repo: str, comment_id: int) -> tuple[str, str]:
        """A comment's Markdown body and its ``body_html`` in the ``full`` media type (its
        attachments at signed URLs, as for an issue: ``issue_rendered``)."""
        d = self._call(
            lambda gh: gh.rest.issues.get_comment(
                *_split(repo), comment_id, headers={"Accept": "application/vnd.github.full+json"}
            ).json()
        )
        return str(d.get("body") or ""), str(d.get("body_html") or "")

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
