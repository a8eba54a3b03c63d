"""An installation's repositories: each one's record, a user's permission on it, the
repositories it may reach, and a file's text."""

from __future__ import annotations

import base64

from bot.io.github.failures import NotFound
from bot.io.github.plumbing import InstallationBase, _Model, _split

WRITE_PERMISSIONS = frozenset({"admin", "write", "maintain"})


class RepoInfo(_Model):
    full_name: str
    id: int = 0  # GitHub's, which a new repository of the same name does not inherit
    default_branch: str
    clone_url: str
    private: bool = False
    html_url: str = ""
    # The merge buttons; GitHub's default (true) when a response leaves them out.
    allow_squash_merge: bool = True
    allow_merge_commit: bool = True
    allow_rebase_merge: bool = True
    # "Automatically delete head branches": GitHub deletes a merged head branch itself
    # (absent on servers too old to have it: loopbot deletes it then).
    delete_branch_on_merge: bool = False


class Repos(InstallationBase):
    """Repositories and permissions."""

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

    def repositories(self) -> list[str]:
        return [
            r["full_name"]
            for r in self._list(
                lambda gh, n: gh.rest.apps.list_repos_accessible_to_installation(
                    per_page=100, page=n
                ).json()
            )
        ]

    def branch_head(self, repo: str, branch: str) -> str:
        """The commit ``branch`` points at now (a scheduled run reads its files there)."""
        owner, name = _split(repo)
        d = self._call(lambda gh: gh.rest.repos.get_branch(owner, name, branch).json())
        return str(d["commit"]["sha"])

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
