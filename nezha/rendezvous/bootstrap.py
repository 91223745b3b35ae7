"""Joining the job's rendezvous store: serve it when this process must, connect, announce.

This is what ``nezha.init()`` needs from the rendezvous layer in one call.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import Optional

import psutil

from nezha.environ import WorldInfo
from nezha.rendezvous.client import StoreClient
from nezha.rendezvous.keys import arrival_key
from nezha.rendezvous.server import StoreServer


@dataclasses.dataclass
class Rendezvous:
    """A connected store client, and the server when this process hosts the store."""

    client: StoreClient
    server: Optional[StoreServer]

    def close(self) -> None:
        """Closes the client, then stops the server if this process serves it."""
        self.client.close()
        if self.server is not None:
            self.server.stop()


def join(world: WorldInfo, timeout_s: float = 30.0) -> Rendezvous:
    """Serves the store if ``world.host_store``, connects to it and sets this rank's arrival key.

    Raises ``TimeoutError``/``PermissionError``/``OSError`` naming the store's address.
    """
    server = None
    port = world.rendezvous_port
    if world.host_store:
        server = StoreServer(_bind_address(world.rendezvous_addr), port, world.secret).start()
        port = server.port
    try:
        client = StoreClient(world.rendezvous_addr, port, world.secret, timeout_s=timeout_s)
        client.set(arrival_key(world.rank), b"")
    except BaseException:
        if server is not None:
            server.stop()
        raise
    return Rendezvous(client, server)


def _bind_address(rendezvous_addr: str) -> str:
    """Bind to the rendezvous address when it is one of ours; otherwise (a name that resolves to
    a service address, NAT...) to every interface: the HMAC handshake still guards the store."""
    try:
        resolved = socket.getaddrinfo(rendezvous_addr, None, socket.AF_INET)[0][4][0]
    except socket.gaierror:
        return "0.0.0.0"
    if ipaddress.ip_address(resolved).is_loopback:
        return resolved
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    return resolved if resolved in local else "0.0.0.0"
