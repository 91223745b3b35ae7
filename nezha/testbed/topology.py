"""Names and addresses of a testbed: pure functions of (prefix, hosts, rails), no system calls.

Rail r is the subnet 10.(50+r).0.0/24 on the bridge `<prefix>-br<r>`; host i is the namespace
`<prefix>-h<i>`, whose interface `rail<r>` has 10.(50+r).0.(i+1); the bridge itself has .254 so
processes in the root namespace (the rendezvous store) reach every host on every rail.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

FIRST_RAIL_OCTET = 50
MAX_RAILS = 8  # 10.50.0.0/24 .. 10.57.0.0/24; also MPTCP's in-kernel limit of 8 subflows
MAX_HOSTS = 99  # keeps root-side veth names (`<prefix>-h<i>r<r>`) within IFNAMSIZ
BRIDGE_HOST_ID = 254
IFNAMSIZ = 15  # longest Linux interface name

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]*$")
_MAX_PREFIX_LEN = IFNAMSIZ - len("-h99r7")


@dataclass(frozen=True)
class Topology:
    prefix: str
    hosts: int
    rails: int

    def __post_init__(self) -> None:
        validate_prefix(self.prefix)
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{MAX_HOSTS}, got {self.hosts}")
        if not 1 <= self.rails <= MAX_RAILS:
            raise ValueError(f"rails must be in 1..{MAX_RAILS}, got {self.rails}")

    @property
    def host_names(self) -> list:
        return [host_name(self.prefix, i) for i in range(self.hosts)]

    @property
    def rail_subnets(self) -> list:
        return [rail_subnet(r) for r in range(self.rails)]

    def host_index(self, host) -> int:
        """Accepts an index or a namespace name; raises ValueError for a host not in this testbed."""
        if isinstance(host, int) and not isinstance(host, bool):
            index = host
        else:
            match = re.fullmatch(re.escape(self.prefix) + r"-h(\d+)", str(host))
            if not match:
                raise ValueError(f"{host!r} is not a host of testbed {self.prefix!r}")
            index = int(match.group(1))
        if not 0 <= index < self.hosts:
            raise ValueError(f"host {host!r} out of range: testbed {self.prefix!r} has {self.hosts} hosts")
        return index

    def check_rail(self, rail: int) -> int:
        if not 0 <= rail < self.rails:
            raise ValueError(f"rail {rail} out of range: testbed {self.prefix!r} has {self.rails} rails")
        return rail


def validate_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix) or len(prefix) > _MAX_PREFIX_LEN:
        raise ValueError(
            f"prefix {prefix!r} must be lowercase letters/digits, start with a letter and be at most "
            f"{_MAX_PREFIX_LEN} characters (interface names are limited to {IFNAMSIZ})")


def host_name(prefix: str, host: int) -> str:
    return f"{prefix}-h{host}"


def bridge_name(prefix: str, rail: int) -> str:
    return f"{prefix}-br{rail}"


def root_veth_name(prefix: str, host: int, rail: int) -> str:
    """The root-namespace end of host's veth on rail (a bridge port)."""
    return f"{prefix}-h{host}r{rail}"


def host_interface(rail: int) -> str:
    """The host-namespace end: the same name on every host, like a NIC."""
    return f"rail{rail}"


def rail_subnet(rail: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"10.{FIRST_RAIL_OCTET + rail}.0.0/24")


def host_address(host: int, rail: int) -> ipaddress.IPv4Address:
    return rail_subnet(rail).network_address + (host + 1)


def bridge_address(rail: int) -> ipaddress.IPv4Address:
    return rail_subnet(rail).network_address + BRIDGE_HOST_ID


def owned_namespace_re(prefix: str) -> re.Pattern:
    return re.compile(re.escape(prefix) + r"-h\d+")


def owned_link_re(prefix: str) -> re.Pattern:
    """Root-namespace links a testbed with this prefix creates: its bridges and veth ends."""
    return re.compile(re.escape(prefix) + r"-(br\d+|h\d+r\d+)")
