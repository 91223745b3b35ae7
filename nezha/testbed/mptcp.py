"""MPTCP in every host namespace, so one MPTCP connection to a peer's rail-0 address uses every rail.

Each host announces its addresses on rails 1.. as `signal` endpoints. The connecting side accepts
those ADD_ADDRs and opens one subflow to each; the kernel routes it out of the matching rail
because each rail is its own subnet. Rails are never routed to each other, so a subflow can only
take the rail its addresses belong to.

Applications must keep their listening socket open while a connection lives and bind it to every
address (0.0.0.0): subflow joins arrive at the peer's other rail addresses through that listener.
"""

from __future__ import annotations

from . import commands, topology

# The in-kernel path manager caps both limits at 8.
_MAX_LIMIT = 8


def configure(namespace: str, host: int, rails: int) -> None:
    commands.run(commands.in_netns(namespace, ["sysctl", "-q", "-w", "net.mptcp.enabled=1"]))
    extra = min(rails - 1, _MAX_LIMIT)
    commands.run(["ip", "-n", namespace, "mptcp", "endpoint", "flush"])
    commands.run(["ip", "-n", namespace, "mptcp", "limits", "set",
                  "subflows", str(extra), "add_addr_accepted", str(extra)])
    for rail in range(1, rails):
        commands.run(["ip", "-n", namespace, "mptcp", "endpoint", "add", str(topology.host_address(host, rail)),
                      "dev", topology.host_interface(rail), "signal"])


def endpoints(namespace: str) -> str:
    return commands.run(["ip", "-n", namespace, "mptcp", "endpoint", "show"]).stdout
