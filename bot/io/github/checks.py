"""An installation's checks: the check runs and commit statuses on a ref, the checks a
branch requires (rulesets and branch protection), and loopbot's own check run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from githubkit import GitHub

from bot.io.github.failures import Forbidden, NotFound
from bot.io.github.plumbing import InstallationBase, _Model, _split


class CheckRunInfo(_Model):
    id: int
    name: str
    head_sha: str
    status: str
    conclusion: str | None = None
    app_id: int | None = None


def _check_run(d: Any) -> CheckRunInfo:
    return CheckRunInfo(
        id=d["id"],
        name=d["name"],
        head_sha=d["head_sha"],
        status=d["status"],
        conclusion=d.get("conclusion"),
        app_id=(d.get("app") or {}).get("id"),
    )


class Checks(InstallationBase):
    """Check runs, commit statuses and the checks a branch requires."""

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
        return self.required_checks_read(repo, branch)[0] or None

    def required_checks_read(self, repo: str, branch: str) -> tuple[frozenset[str], bool]:
        """The check names ``branch`` requires, and whether both the rulesets and the
        protection could be read (False: a name may be required that is not listed)."""
        owner, name = _split(repo)
        names: set[str] = set()
        read = True
        with contextlib.suppress(NotFound, Forbidden):
            read = False
            for rule in self._list(
                lambda gh, n: gh.rest.repos.get_branch_rules(
                    owner, name, branch, per_page=100, page=n
                ).json()
            ):
                if rule.get("type") == "required_status_checks":
                    params = rule.get("parameters") or {}
                    for check in params.get("required_status_checks") or []:
                        names.add(str(check.get("context")))
            read = True
        rules_read, read = read, False
        with contextlib.suppress(NotFound, Forbidden):
            d = self._call(lambda gh: gh.rest.repos.get_branch(owner, name, branch).json())
            protection = d.get("protection") or {}
            checks = protection.get("required_status_checks") or {}
            if protection.get("enabled", True) and checks.get("enforcement_level") != "off":
                names.update(str(c) for c in checks.get("contexts") or [])
                names.update(str(c.get("context")) for c in checks.get("checks") or [])
            read = True
        return frozenset(names), rules_read and read

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
