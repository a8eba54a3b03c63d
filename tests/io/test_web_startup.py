"""The web stops at once on an invalid configuration, and never leaves its port open.

gunicorn starts a worker that exits again, for ever: with the check only in the worker,
the Procfile's web line kept its port open while every worker exited with status 2, so a
load balancer's health check hung instead of failing. Here the real processes (the
Procfile's line as a platform runs it, and ``loopbot web``) get invalid settings and must
exit non-zero within seconds, naming the setting, without ever accepting a connection.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bot.standins.redis_server import RedisServer, free_port
from bot.web.serving import GUNICORN_SETTINGS
from tests.helpers import ROOT, VENV_BIN, procfile_command, serving, stop_group, web_process

# The failure bound, not a wait: a web that loops on its workers never exits by itself.
BOUND = 20.0

LAUNCHERS = ["procfile", "loopbot web"]


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def start_and_watch(how: str, env: dict[str, str], tmp_path: Path) -> tuple[int, str, float, bool]:
    """Start the web on a free port and try to connect to it until it exits (at most
    ``BOUND`` seconds): its status, its stderr, how long it ran, whether the port ever
    accepted a connection (while it ran or after)."""
    port = free_port()
    command, full_env = web_process(how, port, env)
    err = tmp_path / f"{how.replace(' ', '-')}.err"
    started = time.monotonic()
    with open(err, "wb") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=out, stderr=out, start_new_session=True
        )
    accepted = False
    try:
        while proc.poll() is None:
            if time.monotonic() - started > BOUND:
                pytest.fail(
                    f"{how} still running after {BOUND:.0f}s:\n" + err.read_text(errors="replace")
                )
            accepted = accepts(port) or accepted
            time.sleep(0.02)
    finally:
        stop_group(proc)
    ran = time.monotonic() - started
    accepted = accepts(port) or accepted
    return proc.returncode, err.read_text(errors="replace"), ran, accepted


def without(env: dict[str, str], name: str, tmp_path: Path) -> dict[str, str]:
    """``env`` without ``name``, and no env file to find it in."""
    return {
        **{k: v for k, v in env.items() if k != name},
        "LOOPBOT_ENV_FILE": str(tmp_path / "absent.env"),
    }


@pytest.mark.parametrize("how", LAUNCHERS)
@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ("GITHUB_PRIVATE_KEY", "GITHUB_PRIVATE_KEY or GITHUB_PRIVATE_KEY_PATH"),
        ("GITHUB_WEBHOOK_SECRET", "GITHUB_WEBHOOK_SECRET: is required but not set"),
    ],
)
def test_invalid_settings_stop_the_web_at_once_without_opening_the_port(
    how: str, missing: str, named: str, env: dict[str, str], tmp_path: Path
) -> None:
    status, stderr, ran, accepted = start_and_watch(how, without(env, missing, tmp_path), tmp_path)
    assert status != 0, stderr
    assert named in stderr, stderr
    assert "loopbot web: invalid configuration" in stderr, stderr
    assert not accepted, f"{how} accepted connections with invalid settings:\n{stderr}"
    assert "Booting worker" not in stderr, stderr  # stopped before any worker started
    assert ran < BOUND, stderr


def test_refused_redis_credentials_stop_the_procfile_web_before_it_listens(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Not only the settings: what ``loopbot web`` checks before gunicorn starts (a Redis
    that can never be used), the Procfile's line checks before it binds."""
    locked = RedisServer(password="s3cr3t-web").start()
    try:
        bad = {**env, "REDIS_URL": locked.url_with("wrong-password")}
        status, stderr, _, accepted = start_and_watch("procfile", bad, tmp_path)
    finally:
        locked.stop()
    assert status != 0, stderr
    assert "REDIS_URL" in stderr and "credentials" in stderr, stderr
    assert "wrong-password" not in stderr
    assert not accepted and "Booting worker" not in stderr, stderr


def test_gunicorn_without_the_config_halts_when_the_app_cannot_load(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Belt and braces: gunicorn started on the app alone (no config module, so no check
    before it binds) stops when a worker cannot load the app, instead of starting it again
    for ever: ``app_from_env`` raises gunicorn's AppImportError, not SystemExit."""
    port = free_port()
    command = [
        str(VENV_BIN / "gunicorn"),
        "--bind", f"127.0.0.1:{port}", "--workers", "2", "--worker-class", "gevent",
        "bot.web.wsgi:app_from_env()",
    ]  # fmt: skip
    bad = without(env, "GITHUB_PRIVATE_KEY", tmp_path)
    out = subprocess.run(
        command,
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **bad},
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    # gunicorn halts with APP_LOAD_ERROR (4), or 1 when the second worker's exit, reaped
    # while it halts, raises its HaltServer again (gunicorn 27's stop() reaps workers).
    assert out.returncode in (1, 4), out.stderr
    assert "GITHUB_PRIVATE_KEY or GITHUB_PRIVATE_KEY_PATH" in out.stderr
    assert "App failed to load" in out.stderr
    assert not accepts(port)


@pytest.mark.parametrize("how", LAUNCHERS)
def test_valid_settings_serve_healthz(how: str, env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    command, full_env = web_process(how, port, env)
    with serving(command, full_env, tmp_path / "web.log", port) as url:
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    log = (tmp_path / "web.log").read_text(errors="replace")
    # The master imported none of loopbot's modules: gevent patched the workers first.
    if how == "procfile":
        assert "MonkeyPatchWarning" not in log, log


def test_procfile_runs_the_same_gunicorn_settings_as_loopbot_web(
    env: dict[str, str], tmp_path: Path
) -> None:
    """What gunicorn itself makes of the Procfile's line (``--print-config``)."""
    line = procfile_command("web")
    assert line.startswith("gunicorn ") and "--bind 0.0.0.0:$PORT" in line
    assert "--preload" not in line  # gevent must patch a worker before the app's imports
    port = free_port()
    command, full_env = web_process("procfile", port, env)
    command[-1] = line.replace("gunicorn ", "gunicorn --print-config ", 1)
    out = subprocess.run(
        command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    config = dict(
        (name.strip(), value.strip())
        for name, sep, value in (ln.partition(" = ") for ln in out.stdout.splitlines())
        if sep
    )
    for name, value in GUNICORN_SETTINGS.items():
        assert config[name] == str(value), (name, config[name])
    assert config["bind"] == f"['0.0.0.0:{port}']"
    assert config["on_starting"] == "<on_starting()>"  # ours, not gunicorn's default
    assert config["preload_app"] == "False"


@pytest.mark.parametrize("how", LAUNCHERS)
def test_a_setting_the_app_used_to_check_itself_stops_the_web_before_it_listens(
    how: str, env: dict[str, str], tmp_path: Path
) -> None:
    """LOOPBOT_TRUSTED_PROXY=-1 passed the start-up check and was refused only by the app,
    in a worker, after the port had accepted a connection (a red team's finding)."""
    bad = {**env, "LOOPBOT_TRUSTED_PROXY": "-1", "LOOPBOT_ENV_FILE": str(tmp_path / "no.env")}
    status, stderr, ran, accepted = start_and_watch(how, bad, tmp_path)
    assert status != 0 and "LOOPBOT_TRUSTED_PROXY: must be true, false" in stderr, stderr
    assert not accepted and "Booting worker" not in stderr, stderr
    assert ran < BOUND, stderr
