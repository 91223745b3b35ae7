"""torch.distributed's store, served by nezharun for its ranks as torchrun's agent serves it.

``init_process_group`` with the default ``env://`` reads ``MASTER_ADDR``/``MASTER_PORT``; with
``TORCHELASTIC_USE_AGENT_STORE=True`` every rank, rank 0 included, connects to that address as a
client instead of rank 0 serving it, so the store lives at nezharun's rendezvous address, which
every rank reaches by construction (rank 0's own address may not be known to nezharun: a network
namespace, a host behind a launch prefix).

A job that never calls ``init_process_group`` must not pay for importing torch: the port is bound
and listening at once, and torch's ``TCPStore`` is started on that very socket
(``master_listen_fd``) only when a rank first connects (its connection waits in the backlog).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from datetime import timedelta
from typing import Dict, Optional

log = logging.getLogger("nezharun")


class LazyTorchStore:
    """Listens on (addr, any port); serves torch's TCPStore there once a rank connects."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((addr, 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self._wake_r, self._wake_w = os.pipe()
        self._store = None
        self._thread: Optional[threading.Thread] = None

    def environment(self) -> Dict[str, str]:
        """What each rank's ``env://`` initialisation needs to reach this store."""
        return {"MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port),
                "TORCHELASTIC_USE_AGENT_STORE": "True"}

    def __enter__(self) -> "LazyTorchStore":
        self._thread = threading.Thread(target=self._serve_when_asked, name="nz-torch-store",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._store = None
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve_when_asked(self) -> None:
        ready, _, _ = select.select([self._sock, self._wake_r], [], [])
        if self._wake_r in ready:
            return
        try:
            from torch.distributed import TCPStore
        except ImportError as exc:
            log.warning("a rank connected to torch.distributed's store, but torch does not "
                        "import here (%s): nezharun cannot serve it", exc)
            return
        self._store = TCPStore(self.addr, self.port, None, True, timeout=timedelta(hours=1),
                               wait_for_workers=False, master_listen_fd=self._sock.fileno())
        self._sock.detach()  # the store owns the socket now and closes it
        log.info("serving torch.distributed's store at %s:%d", self.addr, self.port)
        select.select([self._wake_r], [], [])  # keep it until the job ends
