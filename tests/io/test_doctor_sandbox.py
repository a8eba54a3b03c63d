"""``loopbot doctor``'s sandbox check: a trial bubblewrap run, and when it fails, the fix
read off the host (sysctls, AppArmor, a container's seccomp profile and masked /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bot.core.settings import Settings
from bot.ops.doctor import _sandbox
from bot.ops.doctor_host import HostFacts, sandbox_fix
from tests.helpers import ROOT

DOCKER = HostFacts(container="docker", seccomp_filter=True, proc_masked=True)


@pytest.mark.parametrize(
    ("facts", "says", "never"),
    [
        (HostFacts(max_user_namespaces=0), ["user.max_user_namespaces=15000"], ["container"]),
        (HostFacts(userns_clone=0), ["kernel.unprivileged_userns_clone=1"], ["AppArmor"]),
        (
            HostFacts(apparmor_restrict=1),
            ["apparmor_restrict_unprivileged_userns=0", "`userns,`"],
            ["container"],
        ),
        (
            DOCKER,
            ["docker container", "seccomp=unconfined", "systempaths=unconfined"],
            ["apparmor=unconfined", "sysctl"],
        ),
        (
            HostFacts(container="docker", apparmor_profile="docker-default (enforce)"),
            ["apparmor=unconfined (it runs under docker-default (enforce)"],
            ["seccomp", "systempaths"],
        ),
        (
            HostFacts(container="kubernetes", seccomp_filter=True),
            ["seccompProfile Unconfined", "procMount Unmasked"],
            ["--security-opt"],
        ),
        (HostFacts(), ["unprivileged user namespaces"], ["container"]),
    ],
)
def test_the_fix_names_what_this_host_needs(
    facts: HostFacts, says: list[str], never: list[str]
) -> None:
    fix = sandbox_fix(facts)
    for text in says:
        assert text in fix
    for text in never:
        assert text not in fix
    assert "--privileged" not in fix.replace("--privileged is not needed", "")


PROBE = textwrap.dedent(
    """
    from pathlib import Path
    Path("/proc/sys/user/max_user_namespaces").write_text("0")
    from bot.core.settings import Settings
    from bot.ops.doctor import _sandbox
    key = "-----BEGIN RSA PRIVATE KEY-----\\nx\\n-----END RSA PRIVATE KEY-----"
    settings = Settings.model_validate(
        {"GITHUB_APP_ID": "1", "GITHUB_PRIVATE_KEY": key, "GITHUB_WEBHOOK_SECRET": "s"}
    )
    print(_sandbox(settings).line())
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="maps a range of uids into a user namespace")
def test_a_host_that_refuses_user_namespaces_fails_with_the_sysctl_to_set(
    tmp_path: Path,
) -> None:
    """In a user namespace of its own whose ``user.max_user_namespaces`` is 0 (a host
    that refuses them), the trial run fails and the fix names the setting."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    wait_then_run = ["sh", "-c", 'read _ && exec "$@"', "sh", sys.executable, str(script)]
    proc = subprocess.Popen(
        ["unshare", "--user", "--", *wait_then_run],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    ours = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{proc.pid}/ns/user") == ours:  # not yet unshared
        assert time.monotonic() < deadline, "unshare did not start"
        time.sleep(0.01)
    # Root inside for 64k uids, as a real host has them (the sandbox drops to 65534, 1000).
    Path(f"/proc/{proc.pid}/uid_map").write_text("0 0 65536\n")
    Path(f"/proc/{proc.pid}/gid_map").write_text("0 0 65536\n")
    out, _ = proc.communicate("\n", timeout=60)
    assert "[FAIL] sandbox:" in out, out
    assert "max_*_namespaces exceeded" in out
    assert "→ sysctl -w user.max_user_namespaces=15000" in out


def test_the_sandbox_check_seeds_and_reads_back_a_cli_home_on_a_bounded_tmpfs(
    tmp_path: Path,
) -> None:
    """A backend CLI's HOME is reached from the harness through /proc/<pid>/root (issue
    37, items 4 and 7): the check runs it as a turn does and says where HOME is."""
    key = "-----BEGIN RSA PRIVATE KEY-----\nx\n-----END RSA PRIVATE KEY-----"
    settings = Settings.model_validate(
        {
            "GITHUB_APP_ID": "1",
            "GITHUB_PRIVATE_KEY": key,
            "GITHUB_WEBHOOK_SECRET": "s",
            "LOOPBOT_DATA_DIR": str(tmp_path / "data"),
            "LOOPBOT_SANDBOX_TMP_MB": "96",
        }
    )
    check = _sandbox(settings)
    assert check.ok, check.line()
    assert "HOME is the sandbox's /tmp, a 96 MiB tmpfs" in check.detail
