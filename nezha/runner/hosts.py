"""Host lists (``-H``, ``--hostfile``) and the placement of ranks onto hosts."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from typing import List

import psutil


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """A host and how many ranks it may run."""

    host: str
    slots: int


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one rank runs and its position among the ranks of its host."""

    rank: int
    host: str
    local_rank: int
    local_size: int
    cross_rank: int  # index of the host among the hosts that run ranks
    cross_size: int


def parse_host_list(text: str) -> List[HostSlots]:
    """Parses ``-H`` syntax: ``"h1:2,h2:4,h3"`` (a host without a count has one slot)."""
    hosts = [_parse_host_item(item.strip(), f"-H {text!r}") for item in text.split(",")
             if item.strip()]
    if not hosts:
        raise ValueError(f"-H {text!r} names no host")
    return _merge_duplicates(hosts)


_HOSTFILE_SLOTS = re.compile(r"^(\S+)\s+slots\s*=\s*(\S+)$")


def parse_hostfile(path: str) -> List[HostSlots]:
    """Parses a hostfile: one host per line as ``host slots=N``, ``host:N`` or ``host``; ``#``
    starts a comment."""
    hosts = []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"hostfile {path} line {number}"
            match = _HOSTFILE_SLOTS.match(line)
            if match:
                hosts.append(HostSlots(match.group(1), _slots(match.group(2), where)))
            elif len(line.split()) == 1:
                hosts.append(_parse_host_item(line, where))
            else:
                raise ValueError(f"{where}: expected 'host slots=N', 'host:N' or 'host', "
                                 f"got {line!r}")
    if not hosts:
        raise ValueError(f"hostfile {path} names no host")
    return _merge_duplicates(hosts)


def _parse_host_item(item: str, where: str) -> HostSlots:
    host, sep, count = item.rpartition(":")
    if not sep:
        return HostSlots(item, 1)
    if not host:
        raise ValueError(f"{where}: {item!r} has no host name")
    return HostSlots(host, _slots(count, where))


def _slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise ValueError(f"{where}: slot count {text!r} is not an integer") from None
    if slots < 1:
        raise ValueError(f"{where}: slot count must be at least 1, got {slots}")
    return slots


def _merge_duplicates(hosts: List[HostSlots]) -> List[HostSlots]:
    """A host listed twice keeps its first position and gets the sum of the slots."""
    merged = {}
    for h in hosts:
        merged[h.host] = merged.get(h.host, 0) + h.slots
    return [HostSlots(host, slots) for host, slots in merged.items()]


def place_ranks(hosts: List[HostSlots], num_ranks: int) -> List[Placement]:
    """Fills hosts in order, each up to its slots; hosts left without ranks are not used."""
    if num_ranks < 1:
        raise ValueError(f"-np must be at least 1, got {num_ranks}")
    capacity = sum(h.slots for h in hosts)
    if num_ranks > capacity:
        listed = ", ".join(f"{h.host}:{h.slots}" for h in hosts)
        raise ValueError(f"-np {num_ranks} exceeds the {capacity} slots of the hosts ({listed})")
    per_host = []
    remaining = num_ranks
    for h in hosts:
        take = min(h.slots, remaining)
        if take:
            per_host.append((h.host, take))
        remaining -= take
    placements = []
    rank = 0
    for cross_rank, (host, count) in enumerate(per_host):
        for local_rank in range(count):
            placements.append(Placement(rank, host, local_rank, count, cross_rank, len(per_host)))
            rank += 1
    return placements


def is_local_host(host: str) -> bool:
    """True for localhost, any loopback address, this machine's names and its own addresses."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback:
        return True
    return any(a.address == host for addrs in psutil.net_if_addrs().values() for a in addrs)
