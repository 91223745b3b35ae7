"""Creating, inspecting and removing the namespaces, bridges and veths of a testbed (iproute2)."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import time
from typing import Optional

from . import commands, topology
from .topology import Topology

# Processes still inside a namespace keep it (and its veths) alive after `ip netns del`.
_KILL_GRACE_S = 2.0


def create(topo: Topology) -> None:
    """Builds bridges, namespaces and veths. The caller removes leftovers first and cleans up on failure."""
    run = commands.run
    for rail in range(topo.rails):
        bridge = topology.bridge_name(topo.prefix, rail)
        run(["ip", "link", "add", bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{topology.bridge_address(rail)}/24", "dev", bridge])
        run(["ip", "link", "set", bridge, "up"])
    for host, namespace in enumerate(topo.host_names):
        run(["ip", "netns", "add", namespace])
        run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        for rail in range(topo.rails):
            port = topology.root_veth_name(topo.prefix, host, rail)
            nic = topology.host_interface(rail)
            run(["ip", "link", "add", port, "type", "veth", "peer", "name", nic, "netns", namespace])
            run(["ip", "link", "set", port, "master", topology.bridge_name(topo.prefix, rail), "up"])
            run(["ip", "-n", namespace, "addr", "add", f"{topology.host_address(host, rail)}/24", "dev", nic])
            run(["ip", "-n", namespace, "link", "set", nic, "up"])


def destroy(prefix: str) -> None:
    """Removes every namespace and root link this prefix owns (and processes left in them). Idempotent."""
    topology.validate_prefix(prefix)
    for namespace in owned_namespaces(prefix):
        _kill_processes_in(namespace)
        commands.run(["ip", "netns", "del", namespace], check=False)
    for link in owned_links(prefix):
        commands.run(["ip", "link", "del", link], check=False)
    left = owned_namespaces(prefix) + owned_links(prefix)
    if left:
        raise commands.TestbedError(f"testbed {prefix!r}: could not remove {', '.join(left)}")


def owned_namespaces(prefix: str) -> list:
    out = commands.run(["ip", "-j", "netns", "list"]).stdout
    names = [entry["name"] for entry in json.loads(out or "[]")]
    pattern = topology.owned_namespace_re(prefix)
    return sorted(n for n in names if pattern.fullmatch(n))


def owned_links(prefix: str) -> list:
    pattern = topology.owned_link_re(prefix)
    return sorted(link["ifname"] for link in _links(None) if pattern.fullmatch(link["ifname"]))


def discover(prefix: str) -> Optional[Topology]:
    """The topology of an existing testbed with this prefix, or None when there is none."""
    hosts = [int(re.search(r"(\d+)$", n).group(1)) for n in owned_namespaces(prefix)]
    bridge_re = re.compile(re.escape(prefix) + r"-br(\d+)")
    rails = [int(m.group(1)) for m in (bridge_re.fullmatch(name) for name in owned_links(prefix)) if m]
    if not hosts or not rails:
        return None
    if sorted(hosts) != list(range(len(hosts))) or sorted(rails) != list(range(len(rails))):
        raise commands.TestbedError(f"testbed {prefix!r} is incomplete (hosts {sorted(hosts)}, "
                                    f"rails {sorted(rails)}); run `down` and `up` again")
    return Topology(prefix, len(hosts), len(rails))


def set_port(prefix: str, host: int, rail: int, up: bool) -> None:
    """Cuts or restores host's cable to rail: the bridge side goes down, the host sees NO-CARRIER."""
    commands.run(["ip", "link", "set", topology.root_veth_name(prefix, host, rail), "up" if up else "down"])


def forget_failed_neighbors(topo: Topology, rail: int) -> None:
    """Drops FAILED and INCOMPLETE ARP entries on rail everywhere, so a restored link works at once.

    Whoever tried to reach a cut host holds a FAILED (or still INCOMPLETE) entry for it and gets
    "No route to host" until the kernel retries; failover tests want "link up" to mean usable now.
    """
    unresolved = ["nud", "failed", "nud", "incomplete"]
    for namespace in topo.host_names:
        commands.run(["ip", "-n", namespace, "neigh", "flush", "dev", topology.host_interface(rail), *unresolved])
    commands.run(["ip", "neigh", "flush", "dev", topology.bridge_name(topo.prefix, rail), *unresolved])


def port_is_up(prefix: str, host: int, rail: int) -> bool:
    (link,) = _links(None, topology.root_veth_name(prefix, host, rail))
    return "UP" in link.get("flags", [])


def _links(namespace: Optional[str], dev: Optional[str] = None) -> list:
    argv = ["ip", "-j"] + (["-n", namespace] if namespace else []) + ["link", "show"] + (["dev", dev] if dev else [])
    return json.loads(commands.run(argv).stdout or "[]")


def _kill_processes_in(namespace: str) -> None:
    """SIGTERM, then SIGKILL after a grace period, every process left in namespace (waits via pidfds)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        out = commands.run(["ip", "netns", "pids", namespace], check=False).stdout
        pidfds = []
        for pid in (int(p) for p in out.split() if p.isdigit()):
            if pid == os.getpid():
                continue
            try:
                pidfds.append(os.pidfd_open(pid))
                signal.pidfd_send_signal(pidfds[-1], sig)
            except ProcessLookupError:
                pass
        try:
            deadline = time.monotonic() + _KILL_GRACE_S
            waiting = list(pidfds)
            while waiting and time.monotonic() < deadline:
                ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
                waiting = [fd for fd in waiting if fd not in ready]
            if not waiting:
                return
        finally:
            for fd in pidfds:
                os.close(fd)
