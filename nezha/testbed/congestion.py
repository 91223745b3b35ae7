"""TCP congestion control inside the testbed's hosts.

A new namespace starts with the machine's default algorithm, and machines differ (this one's is BBR;
Linux's own default, and what most clusters run, is CUBIC). Over the testbed's tbf-shaped rails BBR
stalled one 256 KB allreduce in forty for 30-190 ms on 6 hosts, with no packet dropped (its probing
and pacing against the token bucket; benchmarks/SCALE.md), where CUBIC stalled none: a figure
measured here would then depend on the machine it ran on. So the testbed pins one algorithm in
every host.
"""

from __future__ import annotations

from pathlib import Path

from . import commands

DEFAULT = "cubic"
_PROC = Path("/proc/sys/net/ipv4")


def _words(name: str) -> list:
    return (_PROC / name).read_text().split()


def allow(algorithm: str) -> None:
    """Makes `algorithm` one a namespace may choose: the kernel lets a namespace other than the
    machine's own pick only algorithms in tcp_allowed_congestion_control (root's), so it is added
    there when missing (nothing is removed; the machine's own default is untouched)."""
    if algorithm not in _words("tcp_available_congestion_control"):
        try:  # built as a module and not loaded yet (no modprobe, or no such module: the check below)
            commands.run(["modprobe", f"tcp_{algorithm}"], check=False)
        except commands.CommandError:
            pass
        if algorithm not in _words("tcp_available_congestion_control"):
            raise commands.TestbedError(
                f"TCP congestion control {algorithm!r} is not available on this kernel "
                f"(available: {' '.join(_words('tcp_available_congestion_control'))})")
    allowed = _words("tcp_allowed_congestion_control")
    if algorithm not in allowed:
        # Where this is refused (a container's /proc/sys), configure() says what failed.
        commands.run(["sysctl", "-q", "-w", "net.ipv4.tcp_allowed_congestion_control=" + " ".join(allowed + [algorithm])],
                     check=False)


def configure(namespace: str, algorithm: str) -> None:
    """Every TCP connection `namespace` opens from now on runs `algorithm`."""
    try:
        commands.run(commands.in_netns(namespace, ["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={algorithm}"]))
    except commands.CommandError as exc:
        raise commands.TestbedError(
            f"cannot run TCP congestion control {algorithm!r} in {namespace} (a namespace may only pick one in "
            f"tcp_allowed_congestion_control: {' '.join(_words('tcp_allowed_congestion_control'))}); "
            f"Testbed(congestion=None) keeps the machine's: {exc}") from None


def current(namespace: str) -> str:
    return commands.run(commands.in_netns(namespace, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"])).stdout.strip()
