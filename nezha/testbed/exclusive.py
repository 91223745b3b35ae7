"""One testbed at a time per machine.

Every testbed puts the same addresses (10.50.0.254, ...) on its bridges in the root namespace, so
two at once would make the root namespace's routes to 10.50.0.0/24 ambiguous and the rendezvous
traffic of one could reach the hosts of the other. A testbed owned by a process holds an flock for
its lifetime (others wait, bounded); one left up by the CLI is found by its addresses.
"""

from __future__ import annotations

import fcntl
import json
import os
import time

from . import commands, topology

LOCK_PATH = "/run/nezha-testbed.lock"


class MachineLock:
    """An exclusive flock on LOCK_PATH, taken with a deadline (flock itself has no timeout)."""

    def __init__(self, path: str = LOCK_PATH):
        self._path = path
        self._fd = None

    def acquire(self, timeout_s: float, holder: str) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + timeout_s
        pause = 0.05
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    owner = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise commands.TestbedError(
                        f"testbed {holder!r}: another testbed ({owner}) held {self._path} for {timeout_s:g} s")
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"prefix {holder}, pid {os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def check_no_other_testbed(prefix: str) -> None:
    """Raises if an interface outside this prefix holds a testbed bridge address (e.g. a CLI testbed)."""
    bridge_addrs = {str(topology.bridge_address(r)) for r in range(topology.MAX_RAILS)}
    ours = topology.owned_link_re(prefix)
    out = commands.run(["ip", "-j", "-4", "addr", "show"]).stdout
    for link in json.loads(out or "[]"):
        for info in link.get("addr_info", []):
            if info.get("local") in bridge_addrs and not ours.fullmatch(link["ifname"]):
                raise commands.TestbedError(
                    f"testbed {prefix!r}: {link['ifname']} already holds {info['local']} (another testbed is up; "
                    f"remove it with `python -m nezha.testbed down --prefix "
                    f"{link['ifname'].rsplit('-br', 1)[0]}`)")
