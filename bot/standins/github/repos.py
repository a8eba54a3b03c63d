"""Repositories and their git data: the repository, a branch and its protection, branch
rules (rulesets), a collaborator's permission, file contents, compare, and deleting a ref."""

from __future__ import annotations

import base64
from fnmatch import fnmatchcase

from flask import Flask, Response, abort, g, jsonify, request

from bot.standins import gitrepo
from bot.standins.github.merging import merge_queue, review_rules
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
            ("GET", "/repos/<owner>/<name>/branches/<path:branch>/protection", get_protection),
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
    rule = review_rules.rule_for(repo, branch)
    classic = contexts is not None or (rule is not None and rule.source == "classic")
    # GET branch's summary says only whether protection is on and which checks it
    # requires; its review rules are in .../protection, which needs administration.
    protection: Json = {
        "enabled": classic,
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
            "protected": classic,
            "protection": protection,
            "protection_url": f"{base}/branches/{branch}/protection",
        }
    )


def get_protection(state: State, owner: str, name: str, branch: str) -> Response:
    """Classic protection in full: GitHub asks for the ``administration`` read permission,
    which loopbot's App does not have, so an installation is refused (403)."""
    repo = state.find_repo(owner, name)
    kind, who = g.auth
    grant = state.grants.get(who, {}) if kind == "installation" else {}
    if kind == "installation" and "administration" not in (grant.get("permissions") or {}):
        abort(error(403, "Resource not accessible by integration"))
    rule = review_rules.rule_for(repo, branch)
    contexts = repo.protection.get(branch)
    if contexts is None and (rule is None or rule.source != "classic"):
        abort(error(404, "Branch not protected"))
    out: Json = {"url": f"{state.url}/repos/{owner}/{name}/branches/{branch}/protection"}
    if contexts is not None:
        out["required_status_checks"] = {"strict": False, "contexts": contexts}
    if rule is not None and rule.source == "classic":
        out["required_pull_request_reviews"] = {
            "dismiss_stale_reviews": rule.dismiss_stale_reviews_on_push,
            "require_code_owner_reviews": rule.require_code_owner_review,
            "required_approving_review_count": rule.required_approving_review_count,
            "require_last_push_approval": rule.require_last_push_approval,
        }
        out["required_conversation_resolution"] = {
            "enabled": rule.required_review_thread_resolution
        }
    return jsonify(out)


def branch_rules(state: State, owner: str, name: str, branch: str) -> Response:
    repo = state.find_repo(owner, name)
    contexts = repo.ruleset_checks.get(branch)
    rules: list[Json] = [
        *review_rules.rules_json(repo, branch),
        *merge_queue.rules_json(repo, branch),
    ]
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
    # What receive-pack enforces is listed too, as GitHub lists a ruleset's rules whether
    # or not the caller may bypass them.
    if any(fnmatchcase(f"refs/heads/{branch}", p) for p in repo.restrict_creation):
        source = {"ruleset_source_type": "Repository", "ruleset_source": repo.full_name}
        rules.append(source | {"ruleset_id": 4, "type": "creation"})
    if repo.deletion_restricted(f"refs/heads/{branch}"):
        source = {"ruleset_source_type": "Repository", "ruleset_source": repo.full_name}
        rules.append(source | {"ruleset_id": 5, "type": "deletion"})
    for pattern, rule in repo.listed_rules:
        if fnmatchcase(branch, pattern):
            source = {"ruleset_source_type": "Repository", "ruleset_source": repo.full_name}
            rules.append(source | {"ruleset_id": 3} | rule)
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
    if repo.deletion_restricted(f"refs/{ref}"):  # GitHub's words, as its users report them
        abort(error(422, "Repository rule violations found\n\nCannot delete this branch\n\n"))
    if repo.classic_protected(f"refs/{ref}"):
        abort(error(422, "Cannot delete this protected branch"))
    if f"refs/{ref}" == f"refs/heads/{repo.default_branch}":
        abort(error(422, "Cannot delete the default branch"))
    gitrepo.git(repo.path, "update-ref", "-d", f"refs/{ref}")
    return "", 204
