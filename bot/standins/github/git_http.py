"""git's smart HTTP protocol at ``clone_url``, served by ``git http-backend`` (CGI).

Like github.com, the password of HTTP Basic auth is a token: an installation token for
the repository's installation, or the token of a user with a permission on it. These
requests skip fault injection and API auth (see server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

from flask import Flask, Response, request

from bot.standins.github.state import Repo, State
from bot.standins.github.wire import add_routes
from bot.standins.receive_hook import RULES_FILE


def register(app: Flask, state: State) -> None:
    add_routes(app, state, [("GET POST", "/git/<owner>/<path:rest>", git_http)])


def git_http(state: State, owner: str, rest: str) -> Response:
    name, sep, tail = rest.partition(".git/")
    repo = state.repos.get(f"{owner}/{name}")
    if not sep or repo is None:
        return Response("not found", status=404)
    if state.git_down:
        return Response("Service Unavailable", status=503)
    if not _allowed(state, repo):
        return Response(
            "auth required", status=401, headers={"WWW-Authenticate": 'Basic realm="GitHub"'}
        )
    data = request.get_data()
    if tail == "git-receive-pack":
        with state.lock:
            state.git_pushes.append((time.time(), repo.full_name))
        _write_rules(state, repo)
        if state.push_delay:
            time.sleep(state.push_delay)
    env = _cgi_env(state, f"/{owner}/{name}.git/{tail}", len(data))
    proc = subprocess.run(
        ["git", "http-backend"], input=data, capture_output=True, env=env, timeout=300
    )
    return _cgi_response(proc.stdout)


def _allowed(state: State, repo: Repo) -> bool:
    creds = request.authorization
    with state.lock:
        entry = state.tokens.get(creds.password or "") if creds else None
    return (
        entry is not None
        and entry[2] >= time.time()
        and (
            (entry[0] == "installation" and entry[1] == repo.installation_id)
            or (entry[0] == "user" and entry[1] in repo.permissions)
        )
    )


def _write_rules(state: State, repo: Repo) -> None:
    """What receive-pack's hook (bot/standins/receive_hook.py) enforces on this push: who
    pushes (an App's installation is held to the ``workflows`` permission it was
    granted) and the repository's switches."""
    creds = request.authorization
    with state.lock:
        entry = state.tokens.get(creds.password or "") if creds else None
        app_push = entry is not None and entry[0] == "installation"
        grant = state.grants.get(entry[1], {}) if app_push and entry else {}
        rules = {
            "repo": repo.full_name,
            "html_url": state.url,
            "app_push": app_push,
            "workflows": grant.get("permissions", {}).get("workflows") == "write",
            "push_protection": repo.push_protection,
            "restrict_creation": list(repo.restrict_creation),
            "restrict_deletion": list(repo.restrict_deletion),
            "classic_protected": sorted(repo.protection),
            "default_branch": repo.default_branch,
        }
    # Written whole or not at all (a new file renamed over the old): a push's hook that
    # read the file while another push wrote it failed on half a file (the fleet bench,
    # 3 pushes of 50 refused). Concurrent pushes of one repository read the same rules
    # unless the rules changed between them.
    tmp = repo.path / f"{RULES_FILE}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(rules))
    os.replace(tmp, repo.path / RULES_FILE)


def _cgi_env(state: State, path_info: str, length: int) -> dict[str, str]:
    """The CGI environment for ``git http-backend``: only what it needs, not ours."""
    creds = request.authorization
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_PROJECT_ROOT": str(state.root / "git"),
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": path_info,
        "REQUEST_METHOD": request.method,
        "QUERY_STRING": request.query_string.decode(),
        "CONTENT_TYPE": request.headers.get("Content-Type", ""),
        "REMOTE_USER": creds.username if creds and creds.username else "x-access-token",
        "REMOTE_ADDR": request.remote_addr or "127.0.0.1",
        "GIT_HTTP_MAX_REQUEST_BUFFER": "200M",
    }
    if request.headers.get("Content-Encoding"):
        env["HTTP_CONTENT_ENCODING"] = request.headers["Content-Encoding"]
    if request.headers.get("Git-Protocol"):
        env["GIT_PROTOCOL"] = request.headers["Git-Protocol"]
    env["CONTENT_LENGTH"] = str(length)
    return env


def _cgi_response(stdout: bytes) -> Response:
    """A Flask response from CGI output: headers (``Status:`` among them), a blank line, body."""
    head, _, body = stdout.partition(b"\r\n\r\n")
    status = 200
    headers: dict[str, str] = {}
    for line in head.decode(errors="replace").split("\r\n"):
        key, _, value = line.partition(":")
        if key.lower() == "status":
            status = int(value.strip().split()[0])
        elif key:
            headers[key.strip()] = value.strip()
    return Response(body, status=status, headers=headers)
