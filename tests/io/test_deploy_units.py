"""The systemd units in deploy/systemd: valid for systemd (``systemd-analyze verify``, with
the paths rewritten to this checkout), and set as the worker's drain and the sandbox need."""

from __future__ import annotations

import configparser
import getpass
import grp
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bot.core.repo_config import SandboxConfig

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
WEB = UNITS / "loopbot-web.service"
WORKER = UNITS / "loopbot-worker@.service"


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing: ./scripts/setup --dev installs systemd")
        pytest.skip("systemd-analyze is not installed (./scripts/setup --dev installs it)")
    return found


def _service(unit: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    return parser["Service"]


def _seconds(value: str) -> float:
    """systemd's time span (``45``, ``65min``, ``1h 5min``) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


@pytest.mark.parametrize(("unit", "name"), [(WEB, WEB.name), (WORKER, "loopbot-worker@1.service")])
def test_systemd_verifies_each_unit(unit: Path, name: str, tmp_path: Path) -> None:
    """As installed, with /opt/loopbot this checkout and its virtualenv, the user this
    one (loopbot's own user does not exist here), and an env file that exists."""
    analyze = _analyze()
    env_file = tmp_path / ".env"
    env_file.write_text("PORT=8000\n")
    text = unit.read_text().replace("/opt/loopbot/.env", str(env_file))
    text = text.replace("/opt/loopbot", str(ROOT))
    text = text.replace("User=loopbot", f"User={getpass.getuser()}")
    text = text.replace("Group=loopbot", f"Group={grp.getgrgid(os.getgid()).gr_name}")
    (tmp_path / name).write_text(text)
    r = subprocess.run(
        [analyze, "verify", str(tmp_path / name)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 even for unknown keys and bad values; what it says about our file
    # (and not about the host's own units) is the verdict.
    ours = [line for line in (r.stdout + r.stderr).splitlines() if str(tmp_path) in line]
    assert r.returncode == 0 and not ours, r.stdout + r.stderr


def test_verify_would_see_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key and a bad value are reported."""
    analyze = _analyze()
    bad = tmp_path / "broken.service"
    bad.write_text(WEB.read_text().replace("KillMode=mixed", "KillMode=mixd\nTimeoutStopSecs=5"))
    r = subprocess.run([analyze, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    said = [line for line in r.stderr.splitlines() if str(bad) in line]
    assert any("KillMode" in line or "kill mode" in line for line in said), r.stderr
    assert any("TimeoutStopSecs" in line for line in said), r.stderr


def test_the_worker_may_finish_its_longest_step_before_it_is_killed() -> None:
    """SIGTERM to the worker only (it passes it to its job, which hands the loop over at
    its next step); the stop timeout outlasts the longest step a loop.yml may set."""
    service = _service(WORKER)
    longest = SandboxConfig.model_fields["timeout_seconds"].metadata
    ceiling = next(m.le for m in longest if hasattr(m, "le"))
    assert service["KillMode"] == "mixed" and "KillSignal" not in service  # SIGTERM
    assert _seconds(service["TimeoutStopSec"]) >= ceiling + 120  # + commit, push, save
    web = _service(WEB)
    assert web["KillMode"] == "mixed" and _seconds(web["TimeoutStopSec"]) > 30  # gunicorn's


@pytest.mark.parametrize("unit", [WEB, WORKER])
def test_nothing_in_the_units_keeps_bubblewrap_from_its_namespaces(unit: Path) -> None:
    service = _service(unit)
    for key in ("RestrictNamespaces", "PrivateUsers", "ProtectKernelTunables", "ProtectProc"):
        assert key not in service, f"{unit.name}: {key} breaks the sandbox"
    assert service["ExecStart"].startswith("/opt/loopbot/.venv/bin/loopbot ")
    assert service["EnvironmentFile"] == "/opt/loopbot/.env"
