"""Repositories and their git data: the repository, a branch and its protection, branch
rules (rulesets), a collaborator's permission, file contents, compare, and deleting a ref."""

from __future__ import annotations

import base64

from flask import Flask, Response, abort, jsonify, request

from bot.standins import gitrepo
from bot.standins.github.shapes import repo_json
from bot.standins.github.state import State
from bot.standins.github.wire import Json, add_routes, error, page


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("GET", "/repos/<owner>/<name>", get_repo),
            ("GET", "/repos/<owner>/<name>/branches/<path:branch>", get_branch),
            ("GET", "/repos/<owner>/<name>/rules/branches/<path:branch>", branch_rules),
            ("GET", "/repos/<owner>/<name>/collaborators/<user>/permission", permission),
            ("GET", "/repos/<owner>/<name>/contents/<path:path>", contents),
            ("GET", "/repos/<owner>/<name>/compare/<path:basehead>", compare),
            ("DELETE", "/repos/<owner>/<name>/git/refs/<path:ref>", delete_ref),
        ],
    )


def get_repo(state: State, owner: str, name: str) -> Response:
    return jsonify(repo_json(state, state.find_repo(owner, name)))


def get_branch(state: State, owner: str, name: str, branch: str) -> Response:
    repo = state.find_repo(owner, name)
    sha = gitrepo.resolve(repo.path, f"refs/heads/{branch}")
    if sha is None:
        abort(error(404, "Branch not found"))
    contexts = repo.protection.get(branch)
    protection: Json = {
        "enabled": contexts is not None,
        "required_status_checks": {
            "enforcement_level": "off" if contexts is None else "non_admins",
            "contexts": contexts or [],
            "checks": [{"context": c, "app_id": None} for c in contexts or []],
        },
    }
    base = f"{state.url}/repos/{owner}/{name}"
    return jsonify(
        {
            "name": branch,
            "commit": {"sha": sha, "url": f"{base}/commits/{sha}"},
            "protected": contexts is not None,
            "protection": protection,
            "protection_url": f"{base}/branches/{branch}/protection",
        }
    )


def branch_rules(state: State, owner: str, name: str, branch: str) -> Response:
    repo = state.find_repo(owner, name)
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
    return jsonify(page(rules))


def permission(state: State, owner: str, name: str, user: str) -> Response:
    repo = state.find_repo(owner, name)
    if user not in state.users:
        abort(error(404, f"{user} is not a user"))
    perm = repo.permissions.get(user, "none")
    legacy = {"maintain": "write", "triage": "read"}.get(perm, perm)
    return jsonify({"permission": legacy, "role_name": perm, "user": state.users[user].json()})


def contents(state: State, owner: str, name: str, path: str) -> Response:
    repo = state.find_repo(owner, name)
    ref = request.args.get("ref") or repo.default_branch
    data = gitrepo.show(repo.path, ref, path)
    if data is None:
        abort(error(404, "Not Found"))
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


def compare(state: State, owner: str, name: str, basehead: str) -> Response:
    repo = state.find_repo(owner, name)
    base, _, head = basehead.partition("...")
    if not (gitrepo.resolve(repo.path, base) and gitrepo.resolve(repo.path, head)):
        abort(error(404, "Not Found"))
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


def delete_ref(state: State, owner: str, name: str, ref: str) -> tuple[str, int]:
    repo = state.find_repo(owner, name)
    if not gitrepo.resolve(repo.path, f"refs/{ref}"):
        abort(error(422, "Reference does not exist"))
    gitrepo.git(repo.path, "update-ref", "-d", f"refs/{ref}")
    return "", 204
