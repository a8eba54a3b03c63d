"""What decides whether bubblewrap may make its namespaces on this host, read from /proc
and what container runtimes leave behind (sysctls, AppArmor, a seccomp filter, a masked
/proc), and the fix read off them. Apart from the checks: a diagnosis of the host that
``loopbot doctor``'s sandbox check (bot/ops/doctor.py) shows when its trial run fails."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostFacts:
    """What decides whether bubblewrap may make its namespaces here (see ``host_facts``)."""

    container: str | None = None  # docker, podman, kubernetes, lxc... or None
    seccomp_filter: bool = False  # a seccomp filter is on (Docker's default profile is one)
    userns_clone: int | None = None  # kernel.unprivileged_userns_clone (Debian kernels)
    max_user_namespaces: int | None = None  # user.max_user_namespaces
    apparmor_restrict: int | None = None  # kernel.apparmor_restrict_unprivileged_userns
    proc_masked: bool = False  # parts of /proc mounted over (a container's masked paths)
    apparmor_profile: str | None = None  # this process's AppArmor confinement, if any


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def host_facts() -> HostFacts:
    """Read the facts from /proc and the files container runtimes leave behind."""
    # systemd's container interface names it in lower case (podman, lxc, systemd-nspawn).
    container = os.environ.get("container") or None  # noqa: SIM112
    if Path("/.dockerenv").exists():
        container = "docker"
    elif Path("/run/.containerenv").exists():
        container = container or "podman"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        container = "kubernetes"
    try:
        status = Path("/proc/self/status").read_text()
        seccomp = any(
            line.split(":")[0] == "Seccomp" and line.split()[-1] == "2"
            for line in status.splitlines()
        )
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        seccomp, mounts = False, []
    # Container runtimes hide /proc/kcore, /proc/keys... under tmpfs or /dev/null binds
    # and make /proc/sys read-only; bwrap then cannot mount a fresh /proc.
    points = {fields[1] for fields in (line.split() for line in mounts) if len(fields) > 1}
    masked = bool(points & {"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/scsi"})
    return HostFacts(
        container=container,
        seccomp_filter=seccomp,
        userns_clone=_read_int("/proc/sys/kernel/unprivileged_userns_clone"),
        max_user_namespaces=_read_int("/proc/sys/user/max_user_namespaces"),
        apparmor_restrict=_read_int("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        proc_masked=masked,
        apparmor_profile=_apparmor_profile(),
    )


def _apparmor_profile() -> str | None:
    """The AppArmor profile confining this process (``docker-default (enforce)``), or None
    when AppArmor is off or the process is unconfined."""
    for path in ("/proc/self/attr/apparmor/current", "/proc/self/attr/current"):
        try:
            label = Path(path).read_text().strip().rstrip("\x00")
        except OSError:
            continue
        return None if label in ("", "unconfined") else label
    return None


def sandbox_fix(facts: HostFacts) -> str:
    """What to change on this host for bubblewrap to work, from what is known of it."""
    steps: list[str] = []
    if facts.max_user_namespaces == 0:
        steps.append("sysctl -w user.max_user_namespaces=15000")
    if facts.userns_clone == 0:
        steps.append("sysctl -w kernel.unprivileged_userns_clone=1")
    if facts.apparmor_restrict == 1:
        steps.append(
            "AppArmor restricts unprivileged user namespaces (Ubuntu 24.04+): load a profile "
            "for /usr/bin/bwrap with `userns,` or sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0"
        )
    if facts.container == "kubernetes":
        steps.append(
            "in the pod's securityContext: seccompProfile Unconfined, appArmorProfile "
            "Unconfined and procMount Unmasked"
        )
    elif facts.container is not None:
        opts = []
        if facts.seccomp_filter:
            opts.append(
                "--security-opt seccomp=unconfined (the default profile refuses "
                "the namespaces bwrap makes)"
            )
        if facts.apparmor_profile:
            opts.append(
                f"--security-opt apparmor=unconfined (it runs under {facts.apparmor_profile}, "
                "which refuses bwrap's mounts)"
            )
        if facts.proc_masked:
            opts.append("--security-opt systempaths=unconfined (bwrap mounts its own /proc)")
        if opts:
            steps.append(
                f"start the {facts.container} container with "
                + ", ".join(opts)
                + "; --privileged is not needed"
            )
    if not steps:
        steps.append(
            "bubblewrap needs unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on Ubuntu an "
            "AppArmor profile for bwrap)"
        )
    return "; ".join(steps) + " (docs/operating.md#what-the-sandbox-needs-from-the-host)"
