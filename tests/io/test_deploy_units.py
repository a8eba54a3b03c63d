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
from bot.web.serving import GUNICORN_SETTINGS
from tests.helpers import ROOT

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


def _installed(unit: Path, into: Path) -> Path:
    """``unit`` as it would be installed here: /opt/loopbot is this checkout (whose
    .venv/bin/loopbot exists), the env file one that exists, the user this one."""
    env_file = into / ".env"
    env_file.write_text("PORT=8000\n")
    text = unit.read_text().replace("/opt/loopbot/.env", str(env_file))
    text = text.replace("/opt/loopbot", str(ROOT))
    text = text.replace("User=loopbot", f"User={getpass.getuser()}")
    text = text.replace("Group=loopbot", f"Group={grp.getgrgid(os.getgid()).gr_name}")
    (into / unit.name).write_text(text)
    return into / unit.name


def _verify(analyze: str, path: Path) -> tuple[int, list[str], str]:
    """verify's exit status, the lines that name our unit, and all it said. It exits 0
    for unknown keys and bad values (a warning naming file and line) and 1 when
    ExecStart= is not an executable; it does not look up User= or read EnvironmentFile=
    (systemd 252). Lines about the host's own units are not ours."""
    r = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    said = r.stdout + r.stderr
    names = (str(path.parent), WEB.name, WORKER.name.split("@")[0] + "@")
    return r.returncode, [line for line in said.splitlines() if any(n in line for n in names)], said


@pytest.mark.parametrize(
    ("unit", "instance"), [(WEB, WEB.name), (WORKER, "loopbot-worker@1.service")]
)
def test_systemd_verifies_each_unit(unit: Path, instance: str, tmp_path: Path) -> None:
    """Installed under its own name; the template is verified through an instance, as
    `systemctl start loopbot-worker@1` loads it (verify finds the template beside it)."""
    analyze = _analyze()
    _installed(unit, tmp_path)
    status, ours, said = _verify(analyze, tmp_path / instance)
    assert status == 0 and not ours, said


def test_verify_would_see_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key, a bad value and a missing program."""
    analyze = _analyze()
    bad = _installed(WORKER, tmp_path)
    bad.write_text(bad.read_text().replace("KillMode=mixed", "KillMode=mixd\nTimeoutStopSecs=5"))
    status, ours, said = _verify(analyze, tmp_path / "loopbot-worker@1.service")
    assert any("KillMode" in line or "kill mode" in line for line in ours), said
    assert any("TimeoutStopSecs" in line for line in ours), said
    bad.write_text(bad.read_text().replace(str(ROOT / ".venv"), str(tmp_path / "no-venv")))
    status, ours, said = _verify(analyze, tmp_path / "loopbot-worker@1.service")
    assert status != 0 and any("not executable" in line for line in ours), said


def test_the_worker_may_finish_its_longest_step_before_it_is_killed() -> None:
    """SIGTERM to the worker only (it passes it to its job, which hands the loop over at
    its next step); the stop timeout outlasts the longest step a loop.yml may set."""
    service = _service(WORKER)
    longest = SandboxConfig.model_fields["timeout_seconds"].metadata
    ceiling = next(m.le for m in longest if hasattr(m, "le"))
    assert service["KillMode"] == "mixed"
    assert service.get("KillSignal", "SIGTERM") in ("SIGTERM", "TERM", "15")  # drains
    assert _seconds(service["TimeoutStopSec"]) >= ceiling + 120  # + commit, push, save
    web = _service(WEB)
    assert web["KillMode"] == "mixed" and web.get("KillSignal", "SIGTERM") == "SIGTERM"
    graceful = GUNICORN_SETTINGS["graceful_timeout"]
    assert isinstance(graceful, int) and _seconds(web["TimeoutStopSec"]) > graceful


@pytest.mark.parametrize("unit", [WEB, WORKER])
def test_nothing_in_the_units_keeps_bubblewrap_from_its_namespaces(unit: Path) -> None:
    service = _service(unit)
    for key in ("RestrictNamespaces", "PrivateUsers", "ProtectKernelTunables", "ProtectProc"):
        assert key not in service, f"{unit.name}: {key} is left out (see the unit's comment)"
    assert service["ExecStart"].startswith("/opt/loopbot/.venv/bin/loopbot ")
    assert service["EnvironmentFile"] == "/opt/loopbot/.env"
    assert service["WorkingDirectory"] == "/opt/loopbot"  # where loopbot finds .env itself
