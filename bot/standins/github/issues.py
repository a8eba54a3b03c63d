"""Issues: opening, editing, closing, labels and their events, comments, and reactions to
comments. Changes made here are sent as ``issues`` and ``issue_comment`` webhooks."""

from __future__ import annotations

from flask import Flask, Response, abort, g, jsonify, request

from bot.standins.github import attachments
from bot.standins.github.shapes import event_base, issue_json
from bot.standins.github.state import Issue, Repo, State, User
from bot.standins.github.wire import Json, add_routes, error, now, page, public

_ISSUE = "/repos/<owner>/<name>/issues/<int:number>"
_COMMENT = "/repos/<owner>/<name>/issues/comments/<int:cid>"


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("GET", "/repos/<owner>/<name>/issues", list_issues),
            ("POST", "/repos/<owner>/<name>/issues", create_issue),
            ("GET", _ISSUE, get_issue),
            ("PATCH", _ISSUE, update_issue),
            ("POST", f"{_ISSUE}/labels", add_labels),
            ("DELETE", f"{_ISSUE}/labels/<label>", remove_label),
            ("GET", f"{_ISSUE}/events", issue_events),
            ("GET", f"{_ISSUE}/comments", list_comments),
            ("POST", f"{_ISSUE}/comments", create_comment),
            ("GET", _COMMENT, get_comment),
            ("PATCH", _COMMENT, update_comment),
            ("POST", f"{_COMMENT}/reactions", react),
        ],
    )


# -- changes shared with pull requests (a merge closes the issues it references) ----------


def add_label(state: State, repo: Repo, issue: Issue, label: str) -> None:
    if label in issue.labels:
        return
    issue.labels.append(label)
    issue.events.append(
        {
            "id": state.next_id(),
            "event": "labeled",
            "label": {"name": label},
            "actor": state.actor().json(),
            "created_at": now(),
        }
    )
    state.emit(
        "issues",
        {
            "action": "labeled",
            "label": {"name": label},
            "issue": issue_json(state, repo, issue),
            **event_base(state, repo, state.actor()),
        },
    )


def set_issue_state(state: State, repo: Repo, issue: Issue, new_state: str, actor: User) -> None:
    issue.state = new_state
    action = "closed" if new_state == "closed" else "reopened"
    state.emit(
        "issues",
        {
            "action": action,
            "issue": issue_json(state, repo, issue),
            **event_base(state, repo, actor),
        },
    )


# -- issues ---------------------------------------------------------------------------------


def list_issues(state: State, owner: str, name: str) -> Response:
    repo = state.find_repo(owner, name)
    wanted = request.args.get("state", "open")
    labels = [x for x in request.args.get("labels", "").split(",") if x]
    items = [
        issue_json(state, repo, i)
        for i in sorted(repo.issues.values(), key=lambda i: -i.number)
        if (wanted == "all" or i.state == wanted) and all(lb in i.labels for lb in labels)
    ]
    return jsonify(page(items))


def create_issue(state: State, owner: str, name: str) -> tuple[Response, int]:
    repo = state.find_repo(owner, name)
    body = request.get_json(force=True)
    with state.lock:
        number = len(repo.issues) + 1
        issue = Issue(
            number, body["title"], body.get("body") or "", state.actor(), created_at=now()
        )
        repo.issues[number] = issue
    state.emit(
        "issues",
        {
            "action": "opened",
            "issue": issue_json(state, repo, issue),
            **event_base(state, repo, state.actor()),
        },
    )
    for label in body.get("labels") or []:
        add_label(state, repo, issue, label)
    return jsonify(issue_json(state, repo, issue)), 201


def get_issue(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    issue = state.find_issue(repo, number)
    d = issue_json(state, repo, issue)
    # The ``full`` media type adds the rendered body, where attachments are signed URLs.
    if "application/vnd.github.full+json" in request.headers.get("Accept", ""):
        d["body_html"] = attachments.body_html(state, issue.body)
    return jsonify(d)


def record_edit(issue: Issue, key: str, login: str, kind: str, before: str) -> None:
    """Who changed the title or body: GitHub keeps the body's versions (the first edit
    also records the original, by its author) and a rename event for the title."""
    at = now()
    if key == "body" and not any(e["field"] == "body" for e in issue.edits):
        issue.edits.append(
            {
                "field": "body",
                "editor": issue.user.login,
                "type": issue.user.type,
                "at": issue.created_at or at,
                "text": before,
            }
        )
    issue.edits.append({"field": key, "editor": login, "type": kind, "at": at, "before": before})


def update_issue(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    issue = state.find_issue(repo, number)
    body = request.get_json(force=True)
    kind, who = g.auth
    text_keys = [k for k in ("title", "body") if k in body]
    if (
        text_keys
        and kind == "user"
        and who != issue.user.login
        and repo.permissions.get(who) not in ("write", "maintain", "admin")
    ):
        abort(error(403, "Must have write access or be the author to edit an issue"))
    changes: Json = {}
    editor = state.actor()
    with state.lock:
        for key in text_keys:
            if body[key] != getattr(issue, key):
                changes[key] = {"from": getattr(issue, key)}
                setattr(issue, key, body[key])
                record_edit(issue, key, editor.login, editor.type, changes[key]["from"])
    if changes:
        state.emit(
            "issues",
            {
                "action": "edited",
                "changes": changes,
                "issue": issue_json(state, repo, issue),
                **event_base(state, repo, state.actor()),
            },
        )
    if body.get("state") in ("open", "closed") and body["state"] != issue.state:
        set_issue_state(state, repo, issue, body["state"], state.actor())
    return jsonify(issue_json(state, repo, issue))


# -- labels and events ------------------------------------------------------------------------


def add_labels(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    state.need_triage(repo)
    issue = state.find_issue(repo, number)
    body = request.get_json(force=True)
    labels = body.get("labels", body) if isinstance(body, dict) else body
    for label in labels:
        add_label(state, repo, issue, label if isinstance(label, str) else label["name"])
    return jsonify([{"name": n} for n in issue.labels])


def remove_label(state: State, owner: str, name: str, number: int, label: str) -> Response:
    repo = state.find_repo(owner, name)
    state.need_triage(repo)
    issue = state.find_issue(repo, number)
    if label not in issue.labels:
        abort(error(404, "Label does not exist"))
    issue.labels.remove(label)
    state.emit(
        "issues",
        {
            "action": "unlabeled",
            "label": {"name": label},
            "issue": issue_json(state, repo, issue),
            **event_base(state, repo, state.actor()),
        },
    )
    return jsonify([{"name": n} for n in issue.labels])


def issue_events(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    return jsonify(page(state.find_issue(repo, number).events))


# -- comments and reactions -----------------------------------------------------------------


def list_comments(state: State, owner: str, name: str, number: int) -> Response:
    repo = state.find_repo(owner, name)
    state.find_issue(repo, number)
    items = [public(c) for c in repo.comments.values() if c["_issue"] == number]
    return jsonify(page(items))


def create_comment(state: State, owner: str, name: str, number: int) -> tuple[Response, int]:
    repo = state.find_repo(owner, name)
    issue = state.find_issue(repo, number)
    actor = state.actor()
    with state.lock:
        cid = state.next_id()
        comment = {
            "id": cid,
            "_issue": number,
            "body": request.get_json(force=True)["body"],
            "user": actor.json(),
            "html_url": f"{state.url}/{repo.full_name}/issues/{number}#issuecomment-{cid}",
            "created_at": now(),
            "updated_at": now(),
        }
        repo.comments[cid] = comment
    state.emit(
        "issue_comment",
        {
            "action": "created",
            "comment": public(comment),
            "issue": issue_json(state, repo, issue),
            **event_base(state, repo, actor),
        },
    )
    return jsonify(public(comment)), 201


def get_comment(state: State, owner: str, name: str, cid: int) -> Response:
    repo = state.find_repo(owner, name)
    if cid not in repo.comments:
        abort(error(404, "Not Found"))
    d = public(repo.comments[cid])
    if "application/vnd.github.full+json" in request.headers.get("Accept", ""):
        d["body_html"] = attachments.body_html(state, str(d.get("body") or ""))
    return jsonify(d)


def update_comment(state: State, owner: str, name: str, cid: int) -> Response:
    repo = state.find_repo(owner, name)
    comment = repo.comments.get(cid)
    if comment is None:
        abort(error(404, "Not Found"))
    if comment["user"]["login"] != state.actor().login:
        abort(error(403, "Resource not accessible by integration"))
    # Every body the comment had, for tests that count what a reader saw change.
    comment.setdefault("_bodies", [comment["body"]])
    comment["body"] = request.get_json(force=True)["body"]
    comment["_bodies"].append(comment["body"])
    comment["updated_at"] = now()
    return jsonify(public(comment))


def react(state: State, owner: str, name: str, cid: int) -> tuple[Response, int]:
    repo = state.find_repo(owner, name)
    if cid not in repo.comments:
        abort(error(404, "Not Found"))
    content = request.get_json(force=True)["content"]
    actor = state.actor()
    for r in repo.reactions:
        if r["comment_id"] == cid and r["content"] == content and r["user"] == actor.login:
            return jsonify(r), 200
    reaction = {
        "id": state.next_id(),
        "comment_id": cid,
        "content": content,
        "user": actor.login,
    }
    repo.reactions.append(reaction)
    return jsonify(reaction), 201
