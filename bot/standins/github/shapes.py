"""The JSON GitHub answers with for repositories, issues and pull requests, and the
fields every webhook payload carries."""

from __future__ import annotations

from bot.standins import gitrepo
from bot.standins.github.merging.review_rules import merge_state_status
from bot.standins.github.state import Issue, Pull, Repo, State, User
from bot.standins.github.wire import Json, now


def repo_json(state: State, repo: Repo) -> Json:
    return {
        "id": repo.id,
        "name": repo.name,
        "full_name": repo.full_name,
        "private": True,
        "owner": state.users[repo.owner].json(),
        "default_branch": repo.default_branch,
        "clone_url": f"{state.url}/git/{repo.full_name}.git",
        "html_url": f"{state.url}/{repo.full_name}",
        "url": f"{state.url}/repos/{repo.full_name}",
        "allow_squash_merge": repo.allow_squash_merge,
        "allow_merge_commit": repo.allow_merge_commit,
        "allow_rebase_merge": repo.allow_rebase_merge,
        "delete_branch_on_merge": repo.delete_branch_on_merge,
    }


def issue_json(state: State, repo: Repo, issue: Issue) -> Json:
    d: Json = {
        "id": issue.number + repo.id * 10000,
        "number": issue.number,
        "title": issue.title,
        "body": issue.body,
        "state": issue.state,
        "labels": [{"name": n} for n in issue.labels],
        "user": issue.user.json(),
        "html_url": f"{state.url}/{repo.full_name}/issues/{issue.number}",
        "comments": sum(1 for c in repo.comments.values() if c["_issue"] == issue.number),
        # As on GitHub, to the second: two events on one issue within the same second
        # can have byte-identical payloads.
        "updated_at": now(),
    }
    if issue.is_pull:
        d["pull_request"] = {"url": f"{state.url}/repos/{repo.full_name}/pulls/{issue.number}"}
    return d


def pull_json(state: State, repo: Repo, pull: Pull) -> Json:
    issue = repo.issues[pull.number]
    head = repo.head_sha(pull)
    base = gitrepo.resolve(repo.path, f"refs/heads/{pull.base}") or ""
    mergeable: bool | None = None
    mergeable_state = "unknown"
    if issue.state == "open" and head and base:
        mergeable = gitrepo.merge_tree(repo.path, base, head) is not None
        # GitHub's mergeable_state: the lowercase of GraphQL's mergeStateStatus.
        mergeable_state = merge_state_status(repo, pull).lower()
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
        "mergeable_state": mergeable_state,
        "additions": sum(int(str(f["additions"])) for f in files),
        "deletions": sum(int(str(f["deletions"])) for f in files),
        "changed_files": len(files),
        "html_url": f"{state.url}/{repo.full_name}/pull/{pull.number}",
        "head": {"ref": pull.head, "sha": head, "repo": repo_json(state, repo)},
        "base": {"ref": pull.base, "sha": base, "repo": repo_json(state, repo)},
    }


def event_base(state: State, repo: Repo, sender: User) -> Json:
    return {
        "repository": repo_json(state, repo),
        "sender": sender.json(),
        "installation": {"id": repo.installation_id},
    }
