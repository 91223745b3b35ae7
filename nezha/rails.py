"""Turns a rail spec (``NEZHA_RAILS`` / ``nezharun --rails``) into this host's rails.

A spec is a comma list of items, one rail each::

    [kind:]target[;option=value;...]     or     kind[;option=value;...]

``target`` is an interface name (``eth1``), an IPv4 subnet (``10.50.0.0/24``) or a single IPv4
address (a /32) for the network kinds ``tcp`` (the default) and ``mptcp``: ``eth1``,
``tcp:eth1``, ``mptcp:10.0.0.0/24``. A subnet names the same rail on hosts whose NIC names
differ, which is why it is the recommended form for multi-host jobs. Other kinds the core knows
(``nezha._core.rail_kinds()``, e.g. ``shm`` once it lands) are named alone (``shm``) or with a
target the kind interprets (``kind:target``). ``ofi:PROVIDER@WHERE`` is a libfabric rail
(``ofi:tcp;ofi_rxm@10.50.0.0/24``, ``ofi:verbs;ofi_rxm@ib0``, ``ofi:shm``): WHERE resolves like a
network target, and the provider may contain ``;``, so for ``ofi`` a ``;``-part without ``=``
continues the target. Options after ``;`` (always ``key=value``) are kind-specific and go to the
core's rail factory untouched (``tcp:eth1;max_share_bytes=1048576``); an unknown option or kind is
an error there, naming the rail. Without a spec there is one rail: the address this host uses to
reach the rendezvous store.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import Dict, List, Optional, Tuple

import psutil

NETWORK_KINDS = ("tcp", "mptcp")  # rails bound to a local IPv4 address
# Kinds whose target may contain ';' (libfabric provider strings such as "tcp;ofi_rxm"): a ';'-part
# without '=' continues the target; options are always key=value. The core's parser does the same.
SEMICOLON_TARGET_KINDS = ("ofi",)

# Collective-only rails named by the daemon they reduce on (``agg:ADDR:PORT``): they bind no local
# address (their control path uses the rendezvous route), the target goes to the core as `daemon`.
COLLECTIVE_KINDS = ("agg",)
PROTOCOLS = NETWORK_KINDS  # the name this tuple had before other kinds existed
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclasses.dataclass(frozen=True)
class RailSpec:
    """One rail on this host: its name in the spec, the local IPv4 address to bind (empty for a
    kind that binds none), its kind, and kind-specific options as (key, value) pairs."""

    name: str
    local_addr: str
    kind: str = "tcp"
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def protocol(self) -> str:
        """The kind (this field's name before kinds other than tcp/mptcp existed)."""
        return self.kind


def core_rail_kinds() -> Tuple[str, ...]:
    """Every kind the core's rail factory builds (tcp and mptcp at least)."""
    try:
        from nezha import _core
    except ImportError:  # the launcher may run where the core is not built: network kinds only
        return NETWORK_KINDS
    return tuple(_core.rail_kinds())


def resolve_rails(spec: Optional[str], rendezvous_addr: str) -> List[RailSpec]:
    """Resolves ``spec`` against this host's interfaces; ``ValueError`` says what did not match."""
    if spec is None or not spec.strip():
        return [_default_rail(rendezvous_addr)]
    interfaces = _ipv4_interfaces()
    other_kinds = [k for k in core_rail_kinds() if k not in NETWORK_KINDS]
    rails: List[RailSpec] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"rail spec {spec!r} has an empty item")
        head, *option_texts = [part.strip() for part in item.split(";")]
        if head.split(":", 1)[0].strip().lower() in SEMICOLON_TARGET_KINDS:
            # "ofi:tcp;ofi_rxm@10.50.0.0/24;window=4": parts without '=' continue the target.
            while option_texts and "=" not in option_texts[0]:
                head += ";" + option_texts.pop(0)
        options = _parse_options(item, option_texts)
        kind, target = "tcp", head
        if ":" in head:
            prefix, rest = head.split(":", 1)
            kind, target = prefix.strip().lower(), rest.strip()
            if kind not in NETWORK_KINDS and kind not in other_kinds:
                raise ValueError(f"rail {item!r}: unknown rail kind {prefix!r}; known kinds: "
                                 f"{', '.join(NETWORK_KINDS + tuple(other_kinds))}")
        elif head.lower() in other_kinds:
            kind, target = head.lower(), ""
        if kind in NETWORK_KINDS:
            if not target:
                raise ValueError(f"rail {item!r}: expected [tcp:|mptcp:]<interface or IPv4 subnet>")
            rail = RailSpec(name=target, local_addr=_resolve_item(target, interfaces),
                            kind=kind, options=options)
        elif kind == "ofi":
            rail = RailSpec(name=target, local_addr=_resolve_ofi_target(item, target, interfaces),
                            kind=kind, options=options)
        elif kind in COLLECTIVE_KINDS:
            rail = _collective_rail(item, kind, target, options)
        else:
            rail = RailSpec(name=target or kind, local_addr=target, kind=kind, options=options)
        for other in rails:
            if rail.local_addr and other.local_addr == rail.local_addr:
                raise ValueError(f"rails {other.name!r} and {rail.name!r} both resolve to local "
                                 f"address {rail.local_addr}; list each rail once")
            if not rail.local_addr and other.kind == rail.kind and other.name == rail.name:
                raise ValueError(f"rail {rail.name!r} is listed twice; list each rail once")
        rails.append(rail)
    return rails


def discover():
    """This host's rail inventory (interfaces, libfabric providers, RDMA devices); see
    ``nezha.rail_discovery`` for how ``nezharun --rails auto`` combines the hosts' inventories."""
    from nezha.rail_discovery import discover as _discover
    return _discover()


def _resolve_ofi_target(item: str, target: str,
                        interfaces: Dict[str, List[ipaddress.IPv4Interface]]) -> str:
    """``PROVIDER@SUBNET_OR_INTERFACE`` -> ``PROVIDER@LOCAL_IP`` (what the core binds); a provider
    alone (``shm``) binds no address."""
    provider, at, where = target.rpartition("@")
    if not at:
        provider, where = target, ""
    if not provider:
        raise ValueError(f"rail {item!r}: expected ofi:PROVIDER@<interface or IPv4 subnet>, e.g. "
                         f"ofi:tcp;ofi_rxm@10.50.0.0/24 or ofi:verbs;ofi_rxm@10.60.0.0/24")
    return f"{provider}@{_resolve_item(where, interfaces)}" if where else provider


def _collective_rail(item: str, kind: str, target: str,
                     options: Tuple[Tuple[str, str], ...]) -> RailSpec:
    host, colon, port = target.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
        port_ok = colon and port.isdigit() and 0 < int(port) < 65536
    except ValueError:
        port_ok = False
    if not port_ok:
        raise ValueError(f"rail {item!r}: expected {kind}:<IPv4 address>:<port> of the nezha-aggd to use")
    return RailSpec(name=target, local_addr="", kind=kind, options=(("daemon", target),) + options)


def _parse_options(item: str, texts: List[str]) -> Tuple[Tuple[str, str], ...]:
    options: List[Tuple[str, str]] = []
    for text in texts:
        key, eq, value = text.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"rail {item!r}: option {text!r} is not key=value")
        if any(k == key.strip() for k, _ in options):
            raise ValueError(f"rail {item!r}: option {key.strip()!r} is given twice")
        options.append((key.strip(), value.strip()))
    return tuple(options)


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
