"""What a sandbox with network access may reach (``EgressPolicy``): plain values, checked
and normalised, apart from the proxy that enforces them (``jobs.sandbox.egress``).

Host allowlist syntax (``EgressPolicy.hosts``): ``pypi.org`` matches exactly that host;
``.pythonhosted.org`` (leading dot) matches ``pythonhosted.org`` and every subdomain of it.
IPv4 literals are accepted (``127.0.0.2``); IPv6 literals are not. Matching is on the name
the client asked for, without any DNS lookup; the address check then applies to whatever
that name resolves to.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

# Never reachable through the proxy, whatever a name resolves to, unless an operator
# carves a range out with ``extra_allowed_networks``. IPv4-mapped IPv6 forms
# (::ffff:a.b.c.d) are covered by the IPv4 ranges: squid keeps every IPv4 address in
# mapped form and compares it so. (Listing ::ffff:0:0/96 would refuse every IPv4 address.)
BLOCKED_NETWORKS: tuple[str, ...] = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",  # loopback: Redis, the worker's own services
    "169.254.0.0/16",  # link-local: cloud metadata (169.254.169.254)
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, broadcast
    "::/96",  # unspecified (::), loopback (::1), IPv4-compatible
    "::ffff:0:0:0/96",  # IPv4-translated (SIIT): a host doing NAT46 would reach IPv4
    "64:ff9b::/96",  # NAT64: would reach any IPv4 address, private ones included
    "64:ff9b:1::/48",  # local-use NAT64
    "100::/64",  # discard-only
    "fc00::/7",  # unique local (AWS's IPv6 metadata is fd00:ec2::254)
    "fe80::/10",  # link-local
    "ff00::/8",  # multicast
)

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST = re.compile(rf"\.?(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*")  # a name, or .suffix

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class EgressPolicy:
    """What the sandbox may reach.

    ``hosts``: the host allowlist (see the module docstring for the syntax), or None for
    any public host. ``extra_allowed_networks``: CIDRs the operator allows although they
    are private (an internal package mirror, say); set by the operator, never by a
    repository. ``http_ports``: ports plain ``http://`` requests may go to;
    ``connect_ports``: ports ``CONNECT`` (https) may go to.
    """

    hosts: tuple[str, ...] | None = None
    extra_allowed_networks: tuple[str, ...] = ()
    http_ports: tuple[int, ...] = (80, 443)
    connect_ports: tuple[int, ...] = (443,)

    def __post_init__(self) -> None:
        if self.hosts is not None:
            object.__setattr__(self, "hosts", _normalise_hosts(self.hosts))
        nets = tuple(str(_network(n)) for n in self.extra_allowed_networks)
        object.__setattr__(self, "extra_allowed_networks", nets)
        for port in (*self.http_ports, *self.connect_ports):
            if not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"not a TCP port: {port!r}")

    def blocked_networks(self) -> list[Network]:
        """BLOCKED_NETWORKS with ``extra_allowed_networks`` carved out of them.

        Squid's ``dst`` ACL matches when *any* address of a name matches, so carving the
        allowed ranges out of the deny list (rather than adding an allow rule) keeps a
        name that resolves to both an allowed and a forbidden address refused."""
        blocked: list[Network] = [ipaddress.ip_network(n) for n in BLOCKED_NETWORKS]
        for allowed in (ipaddress.ip_network(n) for n in self.extra_allowed_networks):
            remaining: list[Network] = []
            for net in blocked:
                if net.version != allowed.version or not net.overlaps(allowed):
                    remaining.append(net)
                elif net.subnet_of(allowed):  # type: ignore[arg-type]
                    continue
                else:
                    remaining.extend(net.address_exclude(allowed))  # type: ignore[arg-type]
            blocked = remaining
        return sorted(blocked, key=lambda n: (n.version, n))


def policy_from_setting(
    network: bool | Sequence[str] | None, *, extra_allowed_networks: Sequence[str] = ()
) -> EgressPolicy | None:
    """``sandbox.network`` from loop.yml as a policy: false/None = no network (None),
    true = any public host, a list = those hosts."""
    if network is None or network is False:
        return None
    if network is True:
        return EgressPolicy(None, tuple(extra_allowed_networks))
    if isinstance(network, str):
        raise ValueError("sandbox.network: a list of host names, true or false")
    return EgressPolicy(tuple(network), tuple(extra_allowed_networks))


def _normalise_hosts(hosts: Sequence[str]) -> tuple[str, ...]:
    if isinstance(hosts, str):
        raise ValueError("hosts must be a list of host names, not one string")
    names: list[str] = []
    for raw in hosts:
        if not isinstance(raw, str):
            raise ValueError(f"not a host name: {raw!r}")
        name = raw.strip().lower().rstrip(".")
        if ":" in name or "[" in name:
            raise ValueError(f"{raw!r}: IPv6 literals and ports are not supported; use a name")
        if not _HOST.fullmatch(name):
            raise ValueError(f"not a host name: {raw!r}")
        names.append(name)
    suffixes = {n for n in names if n.startswith(".")}

    def covered(name: str) -> bool:  # squid refuses a list where one entry covers another
        return any(s != name and (name == s[1:] or name.endswith(s)) for s in suffixes)

    return tuple(sorted({n for n in names if not covered(n)}))


def _network(text: str) -> Network:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError as exc:
        raise ValueError(f"not a network (CIDR): {text!r}") from exc
