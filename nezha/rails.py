"""Turns a rail spec (``NEZHA_RAILS`` / ``nezharun --rails``) into this host's rails.

The grammar and the kind table belong to the core (``core/src/transport/rail_spec.h``,
``rail_kinds.cc``): ``nezha._core.parse_rails`` parses the spec, and each kind's row says how its
target resolves. This module only does what needs the host: it turns interface names and subnets
into this host's IPv4 addresses. A subnet names the same rail on hosts whose NIC names differ,
which is why it is the recommended form for multi-host jobs. Without a spec there is one rail: the
address this host uses to reach the rendezvous store.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import Dict, List, Optional, Tuple

import psutil

from nezha import _core

_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclasses.dataclass(frozen=True)
class RailSpec:
    """One rail on this host: its name in the spec, its resolved target (the local IPv4 address
    to bind, ``PROVIDER@ADDRESS``, a daemon's ``ADDRESS:PORT``, or empty: the kind's row says
    which), its kind, and kind-specific options as (key, value) pairs."""

    name: str
    local_addr: str
    kind: str = "tcp"
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def binds_local_address(self) -> bool:
        """Whether the rail's traffic leaves from an IPv4 address of its own (the engine's control
        channel needs another path for a rail that does not)."""
        return rail_target(self.kind) == _core.RailTarget.local_address


def core_rail_kinds() -> Tuple[str, ...]:
    """Every kind the core's rail factory builds."""
    return tuple(_core.rail_kinds())


def rail_target(kind: str):
    """How ``kind``'s target resolves (a ``nezha._core.RailTarget``), from the core's table."""
    for row in _core.rail_kind_table():
        if row["kind"] == kind:
            return row["target"]
    raise ValueError(f"unknown rail kind {kind!r}; known kinds: {', '.join(core_rail_kinds())}")


def resolve_rails(spec: Optional[str], rendezvous_addr: str) -> List[RailSpec]:
    """Resolves ``spec`` against this host's interfaces; ``ValueError`` says what did not match."""
    if spec is None or not spec.strip():
        return [_default_rail(rendezvous_addr)]
    interfaces = _ipv4_interfaces()
    rails: List[RailSpec] = []
    for item in _core.parse_rails(spec):
        rail = RailSpec(name=item.target or item.kind,
                        local_addr=_resolve_target(item, interfaces),
                        kind=item.kind, options=tuple(item.options))
        for other in rails:
            if (rail.binds_local_address and other.binds_local_address
                    and other.local_addr == rail.local_addr):
                raise ValueError(f"rails {other.name!r} and {rail.name!r} both resolve to local "
                                 f"address {rail.local_addr}; list each rail once")
            if other.kind == rail.kind and other.name == rail.name:
                raise ValueError(f"rail {rail.name!r} is listed twice; list each rail once")
        rails.append(rail)
    return rails


def discover():
    """This host's rail inventory (interfaces, libfabric providers, RDMA devices); see
    ``nezha.rail_discovery`` for how ``nezharun --rails auto`` combines the hosts' inventories."""
    from nezha.rail_discovery import discover as _discover
    return _discover()


def _resolve_target(item, interfaces: Dict[str, List[ipaddress.IPv4Interface]]) -> str:
    """The target as the core's maker wants it, per the kind's row: interfaces and subnets become
    this host's address; the shape was checked by the core's parser already."""
    form = item.target_form
    if form == _core.RailTarget.local_address:
        return _resolve_item(item.target, interfaces)
    if form == _core.RailTarget.provider_at_local_address:
        # PROVIDER@WHERE -> PROVIDER@LOCAL_IP; a provider alone (ofi:shm) binds no address.
        provider, at, where = item.target.rpartition("@")
        return f"{provider}@{_resolve_item(where, interfaces)}" if at else item.target
    return item.target  # none: empty; host_port: a remote endpoint, used as written


def _resolve_item(target: str, interfaces: Dict[str, List[ipaddress.IPv4Interface]]) -> str:
    network = _as_network(target)
    if network is None:
        if target not in interfaces:
            raise ValueError(f"rail {target}: no such network interface with an IPv4 address; "
                             f"interfaces: {_describe(interfaces)}")
        return str(interfaces[target][0].ip)
    inside = [(name, iface.ip) for name, addrs in interfaces.items() for iface in addrs
              if iface.ip in network]
    if len(inside) == 1:
        return str(inside[0][1])
    if len(inside) > 1:
        listed = ", ".join(f"{ip} on {name}" for name, ip in inside)
        raise ValueError(f"rail {target}: several local addresses in that subnet ({listed}); "
                         f"use a narrower subnet or an interface name")
    if network.subnet_of(_LOOPBACK) and any(iface.ip in _LOOPBACK
                                            for addrs in interfaces.values() for iface in addrs):
        # Every 127/8 address is local once loopback is up, so "127.0.0.2/32" is a valid extra
        # rail: several loopback rails let one machine exercise multi-rail code paths.
        return str(next(iter(network.hosts()), network.network_address))
    raise ValueError(f"rail {target}: no local address in that subnet; local addresses: "
                     f"{_describe(interfaces)}")


def _as_network(target: str) -> Optional[ipaddress.IPv4Network]:
    if not any(ch.isdigit() for ch in target) or not all(ch.isdigit() or ch in "./"
                                                         for ch in target):
        return None  # an interface name such as "eth1" or "lo"
    try:
        network = ipaddress.ip_network(target, strict=False)
    except ValueError:
        raise ValueError(f"rail {target}: not a valid IPv4 subnet") from None
    if not isinstance(network, ipaddress.IPv4Network):
        raise ValueError(f"rail {target}: only IPv4 subnets are supported")
    return network


def _default_rail(rendezvous_addr: str) -> RailSpec:
    local = route_source_address(rendezvous_addr)
    name = next((n for n, addrs in _ipv4_interfaces().items()
                 if any(str(a.ip) == local for a in addrs)), local)
    return RailSpec(name=name, local_addr=local, kind="tcp")


def route_source_address(remote: str) -> str:
    """The local IPv4 address this host uses to reach ``remote`` (a host name or address).

    A UDP ``connect`` sends nothing; it only asks the kernel's routing table. Loopback
    destinations map to 127.0.0.1.
    """
    try:
        infos = socket.getaddrinfo(remote, None, socket.AF_INET, socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {remote!r}: {exc.strerror}") from None
    target = infos[0][4][0]
    if ipaddress.ip_address(target) in _LOOPBACK:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))  # any port: nothing is sent
        except OSError as exc:
            raise ValueError(f"no route from this host to {remote} ({target}): "
                             f"{exc.strerror}") from None
        return probe.getsockname()[0]


def _ipv4_interfaces() -> Dict[str, List[ipaddress.IPv4Interface]]:
    result: Dict[str, List[ipaddress.IPv4Interface]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family == socket.AF_INET:
                netmask = addr.netmask or "255.255.255.255"
                result.setdefault(name, []).append(
                    ipaddress.IPv4Interface(f"{addr.address}/{netmask}"))
    return result


def _describe(interfaces: Dict[str, List[ipaddress.IPv4Interface]]) -> str:
    parts: List[Tuple[str, str]] = [(name, str(iface)) for name, addrs in sorted(interfaces.items())
                                    for iface in addrs]
    return ", ".join(f"{name} {iface}" for name, iface in parts) or "none"
