"""Per-rail egress shaping with a token bucket filter (`tc qdisc ... tbf`).

netem is not available on our kernels; tbf is. Its burst and queue size decide whether one TCP
flow can actually reach the configured rate: too small a bucket and the veth's 64 KB GSO packets
are split and paced too finely, too short a queue and tail drops halve TCP's window. The values
below were chosen by measurement (see tests/test_testbed.py::test_shaped_rail_delivers_its_rate).
"""

from __future__ import annotations

import json
import re
from typing import Optional

from . import commands

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)\s*$", re.IGNORECASE)

# Bucket: a few milliseconds of traffic, at least two 64 KB GSO packets.
BURST_SECONDS = 0.004
MIN_BURST_BYTES = 128 * 1024
# Queue: how long a packet may wait in tbf before it is dropped (tc's `latency`).
QUEUE_LATENCY_MS = 20


def parse_rate(rate: str) -> int:
    """'1gbit', '250mbit', '1.5gbit' -> bits per second. Only bit units: tc's 'bps' means bytes/s."""
    match = _RATE_RE.match(str(rate))
    if not match:
        raise ValueError(f"rate {rate!r} must be a number followed by bit, kbit, mbit, gbit or tbit")
    bits = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if bits <= 0:
        raise ValueError(f"rate {rate!r} must be positive")
    return bits


def format_rate(bits_per_s: int) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits_per_s % _UNITS[unit] == 0:
            return f"{bits_per_s // _UNITS[unit]}{unit}"
    return f"{bits_per_s}bit"


def tbf_args(bits_per_s: int) -> list:
    burst = max(MIN_BURST_BYTES, int(bits_per_s / 8 * BURST_SECONDS))
    return ["tbf", "rate", f"{bits_per_s}bit", "burst", str(burst), "latency", f"{QUEUE_LATENCY_MS}ms"]


def set_rate(namespace: str, interface: str, rate: Optional[str]) -> None:
    """Shapes interface's egress to rate; None or 'off' removes the shaping."""
    if rate is None or str(rate).strip().lower() == "off":
        clear_rate(namespace, interface)
        return
    # `replace` installs or changes the qdisc atomically, so a live flow is never left unshaped.
    commands.run(commands.in_netns(namespace, ["tc", "qdisc", "replace", "dev", interface, "root",
                                               *tbf_args(parse_rate(rate))]))


def clear_rate(namespace: str, interface: str) -> None:
    if current_rate(namespace, interface) is not None:
        commands.run(commands.in_netns(namespace, ["tc", "qdisc", "del", "dev", interface, "root"]))


def current_rate(namespace: str, interface: str) -> Optional[str]:
    """The tbf rate on interface as '<n><unit>', or None when it is not shaped."""
    out = commands.run(commands.in_netns(namespace, ["tc", "-j", "qdisc", "show", "dev", interface])).stdout
    for qdisc in json.loads(out or "[]"):
        if qdisc.get("kind") == "tbf" and qdisc.get("root"):
            # tc's JSON reports the rate in bytes per second.
            return format_rate(int(qdisc["options"]["rate"]) * 8)
    return None
