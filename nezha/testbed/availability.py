"""Can this machine run a testbed? Tests skip with the reason when it cannot."""

from __future__ import annotations

import functools
import os
import shutil
import secrets

from . import commands


@functools.lru_cache(maxsize=None)
def testbed_available() -> tuple:
    """(True, "") or (False, why not): needs root, iproute2 and tc, network namespaces and bridges."""
    if os.geteuid() != 0:
        return False, "the network-namespace testbed needs root (run the tests as root)"
    for tool in ("ip", "tc", "sysctl"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` is not installed (apt-get install iproute2 procps)"
    probe = "nzprobe" + secrets.token_hex(2)
    try:
        commands.run(["ip", "netns", "add", probe])
        try:
            commands.run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"])
            commands.run(["ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1"])
            commands.run(["ip", "-n", probe, "link", "set", "v0", "master", "br0"])
        finally:
            commands.run(["ip", "netns", "del", probe], check=False)
    except commands.TestbedError as exc:
        return False, f"cannot create network namespaces, bridges or veths here: {exc}"
    return True, ""


testbed_available.__test__ = False  # not a pytest test despite the name, when imported into a test module
