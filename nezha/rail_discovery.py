"""Rail discovery: what each host offers, and the rail spec a job of those hosts should use.

``nezharun --rails auto`` asks every host for its inventory (this module run as
``python -m nezha.rail_discovery`` behind the job's launch prefix or ssh, or in-process for the
local host), then keeps what all hosts share:

* IPv4 subnets every host has an address in (loopback and link-local excluded): one TCP rail each,
  named by subnet so hosts whose NIC names differ still agree;
* where every host also has an RDMA device (``/sys/class/infiniband``; pyverbs, when installed,
  confirms the devices open) on its interface in that subnet, and libfabric offers
  ``verbs;ofi_rxm`` on every host, the rail becomes ``ofi:verbs;ofi_rxm@SUBNET`` instead.

Nothing here opens a connection; ``--dry-run`` prints the per-host view and the chosen spec.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from nezha import rails as _rails

VERBS_PROVIDER = "verbs;ofi_rxm"
_SYS_INFINIBAND = "/sys/class/infiniband"
_EXCLUDED = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("169.254.0.0/16"))


@dataclasses.dataclass
class HostInventory:
    """What one host offers: IPv4 interfaces as (name, address, subnet), libfabric's RDM
    providers, and RDMA devices as (device, [network interfaces])."""

    host: str
    interfaces: List[Tuple[str, str, str]]
    ofi_providers: List[str]
    rdma_devices: List[Tuple[str, List[str]]]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(host: str, text: str) -> "HostInventory":
        try:
            data = json.loads(text)
            return HostInventory(host=host,
                                 interfaces=[tuple(i) for i in data["interfaces"]],
                                 ofi_providers=list(data["ofi_providers"]),
                                 rdma_devices=[(d, list(n)) for d, n in data["rdma_devices"]])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"host {host}: unreadable rail inventory ({exc}): {text[:200]!r}") from None

    def rdma_interfaces(self) -> Dict[str, str]:
        """Network interface -> the RDMA device on it."""
        return {netdev: dev for dev, netdevs in self.rdma_devices for netdev in netdevs}


def discover(host: str = "localhost") -> HostInventory:
    """This host's inventory."""
    interfaces = [(name, str(iface.ip), str(iface.network))
                  for name, addrs in sorted(_rails._ipv4_interfaces().items()) for iface in addrs]
    return HostInventory(host, interfaces, ofi_providers(), rdma_devices())


def ofi_providers() -> List[str]:
    """libfabric's RDM tagged providers here, through the core (empty without libfabric)."""
    try:
        from nezha import _core
    except ImportError:
        return []
    return list(_core.ofi_providers()) if hasattr(_core, "ofi_providers") else []


def rdma_devices(sys_root: str = _SYS_INFINIBAND) -> List[Tuple[str, List[str]]]:
    """RDMA devices and the network interfaces they sit on (RoCE: the Ethernet NIC; IPoIB: ib0)."""
    names = sorted(os.listdir(sys_root)) if os.path.isdir(sys_root) else []
    try:  # optional: pyverbs lists the devices the verbs library can actually open
        import pyverbs.device as _verbs  # type: ignore[import-not-found]
        openable = {d.name.decode() if isinstance(d.name, bytes) else d.name
                    for d in _verbs.get_device_list()}
        names = [n for n in names if n in openable] or sorted(openable)
    except Exception:  # pyverbs missing or no verbs library: sysfs alone
        pass
    out = []
    for dev in names:
        net_dir = os.path.join(sys_root, dev, "device", "net")
        out.append((dev, sorted(os.listdir(net_dir)) if os.path.isdir(net_dir) else []))
    return out


def choose_rails(inventories: Sequence[HostInventory]) -> Tuple[Optional[str], List[str]]:
    """The rail spec for a job of these hosts (None: no shared subnet, use the default rail) and
    one human-readable line per host and rail, saying what each host would use."""
    if not inventories:
        return None, []
    shared = None
    for inv in inventories:
        nets = {net for _, _, net in inv.interfaces
                if not any(ipaddress.ip_network(net).subnet_of(x) for x in _EXCLUDED)}
        shared = nets if shared is None else shared & nets
    items, lines = [], []
    for net in sorted(shared or (), key=lambda n: ipaddress.ip_network(n)):
        per_host = []
        rdma_everywhere = True
        for inv in inventories:
            name, addr = next((n, a) for n, a, s in inv.interfaces if s == net)
            dev = inv.rdma_interfaces().get(name)
            rdma_everywhere = rdma_everywhere and dev is not None and VERBS_PROVIDER in inv.ofi_providers
            per_host.append((inv.host, name, addr, dev))
        item = f"ofi:{VERBS_PROVIDER}@{net}" if rdma_everywhere else net
        items.append(item)
        for host, name, addr, dev in per_host:
            how = f"RDMA {dev} via libfabric {VERBS_PROVIDER}" if rdma_everywhere else "TCP"
            lines.append(f"{host}: {item}: {name} {addr} ({how})")
    return (",".join(items) or None), lines


def describe_hosts(inventories: Sequence[HostInventory]) -> List[str]:
    """One line per host: its interfaces, RDMA devices and libfabric providers."""
    lines = []
    for inv in inventories:
        nics = ", ".join(f"{n} {a} ({s})" for n, a, s in inv.interfaces) or "none"
        rdma = ", ".join(f"{d} on {'/'.join(n) or '?'}" for d, n in inv.rdma_devices) or "none"
        prov = ", ".join(inv.ofi_providers) or "none (no libfabric in this build)"
        lines.append(f"{inv.host}: interfaces {nics}; RDMA devices {rdma}; libfabric providers {prov}")
    return lines


if __name__ == "__main__":  # the remote half of nezharun --rails auto
    sys.stdout.write(discover().to_json() + "\n")
