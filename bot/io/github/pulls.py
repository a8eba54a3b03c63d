"""An installation's pull requests: found or opened once, their diffs and files, the
compares of two commits, reviews (posted once), the merge with its sha pinned, and the
branch deleted after."""

from __future__ import annotations

from typing import Any, cast

from bot.io.github.failures import NotFound, Unprocessable
from bot.io.github.plumbing import InstallationBase, _Model, _split, marker


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


class MergeResult(_Model):
    sha: str
    merged: bool


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


class Pulls(InstallationBase):
    """Pull requests, their reviews and their merge."""

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

    def delete_branch(self, repo: str, branch: str) -> str:
        """Delete ``branch``: "" when it is gone (deleted now, or already); else GitHub's
        words for its refusal (a rule forbids it: a 422 other than "Reference does not
        exist")."""
        try:
            self._call(lambda gh: gh.rest.git.delete_ref(*_split(repo), f"heads/{branch}"))
        except NotFound:
            return ""
        except Unprocessable as exc:
            return "" if "reference does not exist" in str(exc).lower() else str(exc)
        return ""
