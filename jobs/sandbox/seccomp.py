"""The seccomp filter every sandbox command runs under (bwrap ``--seccomp``): a BPF program
built from a table of syscalls, apart from the sandbox's mounts and command line."""

from __future__ import annotations

import os
import platform
import struct

# Syscalls no build or test needs and that reach past the sandbox's namespaces: the
# kernel keyrings (shared with the worker's session), eBPF, perf, userfaultfd, mounts
# and namespaces, modules, kexec, swap, reboot, the kernel log, io_uring.
_DENY = {
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "unshare": (272, 97),
    "setns": (308, 268),
    "open_by_handle_at": (304, 265),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "syslog": (103, 116),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    # Reaching into another process of the sandbox: a backend CLI's tools run as its uid,
    # and must not take its file descriptors (its stdout is what the harness reads) or
    # rewrite its memory.
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
}
_AUDIT_ARCH = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
_SOCKET_CALLS = {"socket": (41, 198), "socketpair": (53, 199)}
# Address families a command may open: Unix, IPv4, IPv6 (its own loopback and the proxy),
# netlink (glibc asks it about interfaces). Not vsock, which no network namespace
# isolates (a VM's hypervisor and host services listen there), nor packet, bluetooth, ...
_FAMILIES = (1, 2, 10, 16)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp filter for bwrap ``--seccomp``; None on other machines.

    The calls in ``_DENY``, x32-ABI calls, and sockets of families not in ``_FAMILIES``
    fail with EPERM; another architecture's ABI (i386 on x86_64) kills the process.
    """
    arch = _AUDIT_ARCH.get(machine or platform.machine())
    if arch is None:
        return None
    audit, column = arch
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to offsets.
    prog: list[tuple[int, str | None, str | None, int]] = [
        (ld, None, None, 4),  # seccomp_data.arch
        (jeq, None, "kill", audit),
        (ld, None, None, 0),  # seccomp_data.nr
    ]
    if column == 0:  # x86_64: the x32 ABI sets bit 30 of the number
        prog.append((jge, "deny", None, 0x40000000))
    for pair in _SOCKET_CALLS.values():
        prog.append((jeq, "family", None, pair[column]))
    for nr in sorted({pair[column] for pair in _DENY.values()}):
        prog.append((jeq, "deny", None, nr))
    prog.append((ret, None, None, 0x7FFF0000))  # allow
    labels = {"family": len(prog)}
    prog.append((ld, None, None, 16))  # args[0], low word: the address family
    for family in _FAMILIES:
        prog.append((jeq, "allow", None, family))
    labels["deny"] = len(prog)
    prog.append((ret, None, None, 0x00050000 | 1))  # EPERM
    labels["allow"] = len(prog)
    prog.append((ret, None, None, 0x7FFF0000))
    labels["kill"] = len(prog)
    prog.append((ret, None, None, 0x80000000))  # SECCOMP_RET_KILL_PROCESS

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return b"".join(
        struct.pack("=HBBI", code, offset(i, jt), offset(i, jf), k)
        for i, (code, jt, jf, k) in enumerate(prog)
    )


def memfd(data: bytes) -> int:
    """A file descriptor holding ``data``, positioned at its start (for bwrap to read)."""
    fd = os.memfd_create("loopbot-seccomp", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
