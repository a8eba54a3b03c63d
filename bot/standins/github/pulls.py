"""Pull requests: opening, reading (JSON or diff), editing, changed files, reviews and
review comments, and the squash merge, which writes a real commit and closes the issues
its text references, as GitHub does."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask, Response, abort, jsonify, request

from bot.core.diffmap import right_side_lines
from bot.standins import gitrepo
from bot.standins.github.issues import set_issue_state
from bot.standins.github.merging import review_rules
from bot.standins.github.shapes import event_base, pull_json
from bot.standins.github.state import Issue, Pull, Repo, State, User
from bot.standins.github.wire import Json, add_routes, error, now, page

_PULL = "/repos/<owner>/<name>/pulls/<int:number>"

_REVIEW_STATES = {"APPROVE": "APPROVED", "REQUEST_CHANGES": "CHANGES_REQUESTED"}

_CLOSING_REF = re.compile(
    r"(?i)\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?):?\s+"
    r"(?:(?:(?P<owner>[\w.-]+)/(?P<name>[\w.-]+))?#(?P<number>\d+)"
    r"|https?://[^\s/]+/(?P<uowner>[\w.-]+)/(?P<uname>[\w.-]+)/issues/(?P<unumber>\d+))\b"
)


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("GET", "/repos/<owner>/<name>/pulls", list_pulls),
            ("POST", "/repos/<owner>/<name>/pulls", create_pull),
            ("GET", _PULL, get_pull),
            ("PATCH", _PULL, update_pull),
            ("GET", f"{_PULL}/files", pull_files),
            ("GET", f"{_PULL}/reviews", list_reviews),
            ("GET", f"{_PULL}/comments", list_review_comments),
            ("POST", f"{_PULL}/reviews", create_review),
            ("PUT", f"{_PULL}/merge", merge),
            ("POST", f"{_PULL}/requested_reviewers", request_reviewers),
            ("PUT", f"{_PULL}/reviews/<int:review_id>/dismissals", dismiss_review),
        ],
    )


def closing_references(state: State, repo: Repo, text: str) -> list[tuple[Repo, int]]:
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
            target = state.repos.get(f"{owner}/{name}")
        if number is None:
            number = ref.group("unumber")
        if target is not None:
            found.append((target, int(number)))
    return found


# -- pull requests ----------------------------------------------------------------------------


def list_pulls(state: State, owner: str, name: str) -> Response:
    repo = state.find_repo(owner, name)
    wanted = request.args.get("state", "open")
    head = request.args.get("head", "")
    branch = head.split(":", 1)[1] if ":" in head else head
    items = [
        pull_json(state, repo, p)
        for p in sorted(repo.pulls.values(), key=lambda p: -p.number)
        if (wanted == "all" or repo.issues[p.number].state == wanted)
        and (not branch or p.head == branch)
    ]
    return jsonify(page(items))


def create_pull(state: State, owner: str, name: str) -> tuple[Response, int]:
    repo = state.find_repo(owner, name)
    body = request.get_json(force=True)
    head, base = body["head"].split(":")[-1], body["base"]
    if not gitrepo.resolve(repo.path, f"refs/heads/{head}"):
        abort(error(422, "Validation Failed: head does not exist"))
    with state.lock:
        for p in repo.pulls.values():
            if p.head == head and repo.issues[p.number].state == "open":
                abort(error(422, f"A pull request already exists for {owner}:{head}."))
        number = len(repo.issues) + 1
        actor = state.actor()
        repo.issues[number] = Issue(
            number, body["title"], body.get("body") or "", actor, is_pull=True
        )
        repo.pulls[number] = Pull(number, head, base, actor)
    return jsonify(pull_json(state, repo, repo.pulls[number])), 201


def get_pull(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    if "diff" in request.headers.get("Accept", ""):
        text = gitrepo.diff(repo.path, pull.base, repo.head_sha(pull))
        return Response(text, mimetype="text/x-diff")
    return jsonify(pull_json(state, repo, pull))


def update_pull(state: State, owner: str, name: str, number: int) -> Response:
    """``PATCH pulls/{n}`` as GitHub documents it: any of ``title``, ``body``, ``state``
    (``open`` or ``closed``) and ``base``; the answer is the whole pull request (200).
    An unknown state, a base branch that does not exist, or reopening a merged pull
    request is refused with 422."""
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    body = request.get_json(force=True)
    issue = repo.issues[number]
    wanted = body.get("state")
    if wanted not in (None, "open", "closed"):
        abort(error(422, f"Validation Failed: state is not one of open, closed: {wanted}"))
    if wanted == "open" and pull.merged:
        abort(error(422, "Validation Failed: cannot reopen a merged pull request"))
    if "base" in body and not gitrepo.resolve(repo.path, f"refs/heads/{body['base']}"):
        abort(error(422, f"Validation Failed: base {body['base']} does not exist"))
    with state.lock:
        if body.get("title") is not None:
            issue.title = body["title"]
        if "body" in body:
            issue.body = body["body"] or ""  # null clears it
        if "base" in body:
            pull.base = body["base"]
        if wanted is not None:
            issue.state = wanted
    return jsonify(pull_json(state, repo, pull))


def pull_files(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    return jsonify(page(gitrepo.changed_files(repo.path, pull.base, repo.head_sha(pull))))


# -- reviews ----------------------------------------------------------------------------------


def list_reviews(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    state.find_pull(repo, number)
    return jsonify(page(repo.reviews.get(number, [])))


def list_review_comments(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    state.find_pull(repo, number)
    return jsonify(page(repo.review_comments.get(number, [])))


def create_review(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    body = request.get_json(force=True)
    actor = state.actor()
    event = body.get("event", "COMMENT")
    if event in _REVIEW_STATES and actor.login == pull.user.login:
        verb = "approve" if event == "APPROVE" else "request changes on"
        abort(error(422, f"Unprocessable Entity: Can not {verb} your own pull request"))
    commit = body.get("commit_id") or repo.head_sha(pull)
    comments = body.get("comments") or []
    # As GitHub: a review comment must sit on a line the diff shows (its right side).
    lines = right_side_lines(gitrepo.diff(repo.path, pull.base, commit))
    for c in comments:
        if c.get("line") not in lines.get(c.get("path", ""), set()):
            abort(error(422, "Unprocessable Entity: Line could not be resolved"))
    review = _record_review(state, repo, number, actor, body, commit)
    state.emit(
        "pull_request_review",
        {
            "action": "submitted",
            "review": review,
            "pull_request": pull_json(state, repo, pull),
            **event_base(state, repo, actor),
        },
    )
    return jsonify(review)


def dismiss_review(state: State, owner: str, name: str, number: int, review_id: int) -> Response:
    """``PUT pulls/{n}/reviews/{id}/dismissals``: a writer dismisses an approval or a
    change request (a comment cannot be dismissed: 422); the review's state becomes
    DISMISSED and ``pull_request_review`` ``dismissed`` is sent."""
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    actor = state.actor()
    if repo.permissions.get(actor.login) not in review_rules.WRITERS and actor.type != "Bot":
        abort(error(403, "Must have write access to dismiss a review."))
    with state.lock:
        review = next((r for r in repo.reviews.get(number, []) if r["id"] == review_id), None)
        if review is None:
            abort(error(404, "Not Found"))
        if review["state"] not in ("APPROVED", "CHANGES_REQUESTED"):
            abort(error(422, "Can not dismiss a commented pull request review"))
        review["state"] = "DISMISSED"
    state.emit(
        "pull_request_review",
        {
            "action": "dismissed",
            "review": review | {"state": "dismissed"},
            "pull_request": pull_json(state, repo, pull),
            **event_base(state, repo, actor),
        },
    )
    return jsonify(review)


def _record_review(
    state: State, repo: Repo, number: int, actor: User, body: Json, commit: str
) -> Json:
    """Store the review and its line comments (the checks have passed)."""
    with state.lock:
        review = {
            "id": state.next_id(),
            "user": actor.json(),
            "body": body.get("body") or "",
            "state": _REVIEW_STATES.get(body.get("event", "COMMENT"), "COMMENTED"),
            "commit_id": commit,
            "submitted_at": now(),
        }
        repo.reviews.setdefault(number, []).append(review)
        for c in body.get("comments") or []:
            repo.review_comments.setdefault(number, []).append(
                {
                    "id": state.next_id(),
                    "pull_request_review_id": review["id"],
                    "path": c["path"],
                    "line": c["line"],
                    "side": c.get("side", "RIGHT"),
                    "body": c["body"],
                    "user": actor.json(),
                    "commit_id": commit,
                }
            )
    return review


# -- merge ------------------------------------------------------------------------------------


def merge(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    body = request.get_json(silent=True) or {}
    issue = repo.issues[number]
    with state.lock:
        _refuse_by_rules(repo, pull, issue, body)
        sha, message = _squash(repo, pull, issue, body)
    # As GitHub does: closing keywords in the PR body and in the commit that lands.
    for target_repo, closed in closing_references(state, repo, f"{issue.body}\n{message}"):
        target = target_repo.issues.get(closed)
        if target is not None and target.state == "open":
            set_issue_state(state, target_repo, target, "closed", state.actor())
    return jsonify({"sha": sha, "merged": True, "message": "Pull Request successfully merged"})


def _refuse_by_rules(repo: Repo, pull: Pull, issue: Issue, body: dict[str, Any]) -> None:
    """The base branch's rules (reviews, conversations, required checks) and the
    repository's merge methods, as GitHub refuses a merge they forbid (405, its words);
    every refusal is recorded for the tests."""
    if pull.merged or issue.state != "open":
        return  # _squash answers that
    if pull.base in repo.merge_queues:  # merge_queue.py takes it from here
        repo.merge_refusals.append((pull.number, 405, review_rules.QUEUE_REFUSAL))
        abort(error(405, review_rules.QUEUE_REFUSAL))
    method = body.get("merge_method", "merge")
    why = review_rules.method_refusal(repo, pull, method)
    if why is None and (blockers := review_rules.review_blockers(repo, pull)):
        rule = review_rules.rule_for(repo, pull.base)
        prefix = "Repository rule violations found\n\n" if rule and rule.source == "ruleset" else ""
        why = prefix + blockers[0]
    if why is None and (pending := review_rules.required_checks_pending(repo, pull)):
        # GitHub's 405 for a required check missing, pending or failing on the head
        # (reported: 'Required status check "Codacy/PR Quality Review" is expected.').
        ruleset = pending[0] in repo.ruleset_checks.get(pull.base, [])
        prefix = "Repository rule violations found\n\n" if ruleset else ""
        why = f'{prefix}Required status check "{pending[0]}" is expected.'
    if why is not None:
        repo.merge_refusals.append((pull.number, 405, why))
        abort(error(405, why))


def request_reviewers(state: State, owner: str, name: str, number: int) -> tuple[Response, int]:
    """``POST pulls/{n}/requested_reviewers``: only collaborators, never the author
    (GitHub's 422s); answers the pull request (201)."""
    repo = state.find_repo(owner, name)
    pull = state.find_pull(repo, number)
    body = request.get_json(force=True)
    wanted = [str(r) for r in body.get("reviewers") or []]
    if pull.user.login in wanted:
        abort(error(422, "Review cannot be requested from pull request author."))
    for login in wanted:
        if login not in repo.permissions:
            abort(
                error(
                    422,
                    "Reviews may only be requested from collaborators. One or more of the "
                    f"users or teams you specified is not a collaborator of the "
                    f"{repo.full_name} repository.",
                )
            )
    with state.lock:
        current = repo.requested_reviewers.setdefault(number, [])
        current.extend(w for w in wanted if w not in current)
    return jsonify(pull_json(state, repo, pull)), 201


def _squash(repo: Repo, pull: Pull, issue: Issue, body: dict[str, Any]) -> tuple[str | None, str]:
    """Squash-merge ``pull`` onto its base, or answer as GitHub refuses a merge.
    Returns the new commit and its message."""
    if pull.merged or issue.state != "open":
        abort(error(405, "Pull Request is not mergeable"))
    head = repo.head_sha(pull)
    if body.get("sha") and body["sha"] != head:
        abort(error(409, "Head branch was modified. Review and try the merge again."))
    method = body.get("merge_method", "merge")
    if method != "squash":
        abort(error(405, f"{method} merges are not supported by the local server"))
    title = body.get("commit_title") or f"{issue.title} (#{pull.number})"
    message = title + ("\n\n" + body["commit_message"] if body.get("commit_message") else "")
    result = gitrepo.squash_merge(repo.path, pull.base, head, message)
    if result.conflict:
        abort(error(405, "Pull Request is not mergeable"))
    pull.merged = True
    pull.merge_commit_sha = result.sha
    pull.closed_head_sha = head
    issue.state = "closed"
    after_merge(repo, pull)
    return result.sha, message


def after_merge(repo: Repo, pull: Pull) -> None:
    """What GitHub does once a pull request merged: with "Automatically delete head
    branches" on, its head branch is deleted (a ``DELETE`` of it after that is a 422,
    "Reference does not exist"), unless a rule forbids its deletion or another open pull
    request has it for its head (GitHub's documentation of the setting)."""
    ref = f"refs/heads/{pull.head}"
    if not repo.delete_branch_on_merge or repo.deletion_restricted(ref):
        return
    if repo.classic_protected(ref):
        return
    others = (p for p in repo.pulls.values() if p.number != pull.number and p.head == pull.head)
    if any(repo.issues[p.number].state == "open" for p in others):
        return
    if gitrepo.resolve(repo.path, ref):
        gitrepo.git(repo.path, "update-ref", "-d", ref)
