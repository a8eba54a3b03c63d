"""Checks and statuses: check runs (created and updated by the App), commit statuses and
their combined state, and ``check_suite.completed`` as another CI App would send it."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, abort, g, jsonify, request

from bot.standins import gitrepo
from bot.standins.github.merging import merge_queue
from bot.standins.github.shapes import event_base
from bot.standins.github.state import State
from bot.standins.github.wire import Json, add_routes, error, page


def register(app: Flask, state: State) -> None:
    add_routes(
        app,
        state,
        [
            ("POST", "/repos/<owner>/<name>/check-runs", create_check_run),
            ("PATCH", "/repos/<owner>/<name>/check-runs/<int:rid>", update_check_run),
            ("GET", "/repos/<owner>/<name>/commits/<path:ref>/check-runs", list_check_runs),
            ("GET", "/repos/<owner>/<name>/commits/<path:ref>/status", combined_status),
            ("POST", "/repos/<owner>/<name>/statuses/<sha>", create_status),
        ],
    )


def send_suite_completed(state: State, full_name: str, sha: str, conclusion: str) -> None:
    """Send ``check_suite.completed`` for ``sha`` as another CI App would."""
    repo = state.repos[full_name]
    state.emit(
        "check_suite",
        {
            "action": "completed",
            "check_suite": {
                "head_branch": repo.branch_at(sha),
                "head_sha": sha,
                "conclusion": conclusion,
                "app": {"id": 1, "slug": "ci"},
            },
            **event_base(state, repo, state.add_user("ci-bot")),
        },
    )


# -- check runs -------------------------------------------------------------------------------


STATUSES = frozenset({"queued", "in_progress", "completed", "waiting", "requested", "pending"})
CONCLUSIONS = frozenset(
    {"action_required", "cancelled", "failure", "neutral", "success", "skipped", "stale",
     "timed_out"}
)  # fmt: skip


def _invalid(body: dict[str, Any], run: dict[str, Any] | None = None) -> Response | None:
    """GitHub's 422s for a check run's status and conclusion: the values it documents,
    and a ``completed`` status only with its conclusion ("Required if you provide
    completed_at or a status of completed").
    https://docs.github.com/en/rest/checks/runs#create-a-check-run"""
    status, conclusion = body.get("status"), body.get("conclusion")
    if status is not None and status not in STATUSES:
        return error(422, f"Invalid request.\n\n{status} is not a member of status.")
    if conclusion is not None and conclusion not in CONCLUSIONS:
        return error(422, f"Invalid request.\n\n{conclusion} is not a member of conclusion.")
    had = (run or {}).get("conclusion")
    if status == "completed" and not conclusion and not had:
        return error(422, "Invalid request.\n\nconclusion is required when status is completed.")
    return None


def create_check_run(state: State, owner: str, name: str) -> tuple[Response, int]:
    repo = state.find_repo(owner, name)
    body = request.get_json(force=True)
    if (refused := _invalid(body)) is not None:
        abort(refused)
    with state.lock:
        run = {
            "id": state.next_id(),
            "name": body["name"],
            "head_sha": body["head_sha"],
            # "Providing conclusion will automatically set the status parameter to completed."
            "status": "completed" if body.get("conclusion") else body.get("status", "queued"),
            "conclusion": body.get("conclusion"),
            "output": body.get("output") or {},
            "details_url": body.get("details_url"),
            "app": {
                "id": state.app_id if g.auth[0] == "installation" else None,
                "slug": state.app_slug,
            },
            "check_suite": {"head_branch": repo.branch_at(body["head_sha"])},
        }
        repo.check_runs[run["id"]] = run
        merge_queue.on_check(state, repo, run["head_sha"])  # a merge group's required check
    return jsonify(run), 201


def update_check_run(state: State, owner: str, name: str, rid: int) -> Response:
    repo = state.find_repo(owner, name)
    run = repo.check_runs.get(rid)
    if run is None:
        abort(error(404, "Not Found"))
    body = request.get_json(force=True)
    if (refused := _invalid(body, run)) is not None:
        abort(refused)
    for key in ("status", "conclusion", "output", "details_url"):
        if key in body:
            run[key] = body[key]
    if body.get("conclusion"):
        run["status"] = "completed"
    with state.lock:
        merge_queue.on_check(state, repo, run["head_sha"])
    return jsonify(run)


def list_check_runs(state: State, owner: str, name: str, ref: str) -> Response:
    repo = state.find_repo(owner, name)
    sha = gitrepo.resolve(repo.path, ref) or ref
    runs = [r for r in repo.check_runs.values() if r["head_sha"] == sha]
    return jsonify({"total_count": len(runs), "check_runs": page(runs)})


# -- statuses ---------------------------------------------------------------------------------


def combined_status(state: State, owner: str, name: str, ref: str) -> Response:
    repo = state.find_repo(owner, name)
    sha = gitrepo.resolve(repo.path, ref) or ref
    latest: dict[str, Json] = {}
    for s in repo.statuses.get(sha, []):
        latest[s["context"]] = s
    states = [s["state"] for s in latest.values()]
    combined = (
        "failure"
        if any(s in ("failure", "error") for s in states)
        else "pending"
        if any(s == "pending" for s in states) or not states
        else "success"
    )
    return jsonify(
        {
            "state": combined,
            "sha": sha,
            "total_count": len(latest),
            "statuses": page(list(latest.values())),  # 30 a page, as GitHub
        }
    )


def create_status(state: State, owner: str, name: str, sha: str) -> tuple[Response, int]:
    repo = state.find_repo(owner, name)
    body = request.get_json(force=True)
    status = {
        "id": state.next_id(),
        "state": body["state"],
        "context": body.get("context", "default"),
        "description": body.get("description"),
    }
    with state.lock:
        repo.statuses.setdefault(sha, []).append(status)
        merge_queue.on_check(state, repo, sha)  # a merge group's required check
    return jsonify(status), 201
