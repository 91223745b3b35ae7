"""torch.distributed's store, served by nezharun for its ranks as torchrun's agent serves it.

``init_process_group`` with the default ``env://`` reads ``MASTER_ADDR``/``MASTER_PORT``; nezharun
points them at a store it serves itself, at its rendezvous address, which every rank reaches by
construction (rank 0's own address may not be known to nezharun: a network namespace, a host
behind a launch prefix). Every rank, rank 0 included, must then connect to it as a client, as
under torchrun with ``TORCHELASTIC_USE_AGENT_STORE=True``; but that variable also turns a script's
own ``tcp://`` rendezvous into clients only (its rank 0 would serve nothing), so nezharun sets
``NEZHA_TORCH_STORE`` instead and ``client_mode_for_nezharun_store`` makes only an ``env://``
rendezvous that names this very store use client mode.

A job that never calls ``init_process_group`` must not pay for importing torch: the port is bound
and listening at once, and torch's ``TCPStore`` is started on that very socket
(``master_listen_fd``) only when a rank first connects (its connection waits in the backlog).
"""

from __future__ import annotations

import importlib
import logging
import os
import select
import socket
import threading
from datetime import timedelta
from typing import Dict, Optional

log = logging.getLogger("nezharun")

STORE_VAR = "NEZHA_TORCH_STORE"  # host:port of the store nezharun serves for this job
_AGENT_VAR = "TORCHELASTIC_USE_AGENT_STORE"


def client_mode_for_nezharun_store() -> None:
    """Wraps torch.distributed's ``env://`` handler so that, when MASTER_ADDR:MASTER_PORT is the
    store nezharun serves, every rank connects as a client (as torchrun's agent store makes them);
    any other ``env://`` and every other scheme are left as they are. Idempotent. (Call it once
    torch.distributed is imported.)"""
    # The module, not torch.distributed's function of the same name.
    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    handlers = rendezvous._rendezvous_handlers
    original = handlers.get("env")
    if original is None or getattr(original, "_nezharun_store", False):
        return

    def env_handler(url, *args, **kwargs):
        inner = original(url, *args, **kwargs)
        served = os.environ.get(STORE_VAR)
        named = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        return _as_clients(inner) if served and served == named else inner

    env_handler._nezharun_store = True
    handlers["env"] = env_handler


def _as_clients(inner):
    """Runs torch's handler with its agent-store switch on while it makes the store."""
    while True:
        before = os.environ.get(_AGENT_VAR)
        os.environ[_AGENT_VAR] = "True"
        try:
            item = next(inner)
        except StopIteration:
            return
        finally:
            if before is None:
                del os.environ[_AGENT_VAR]
            else:
                os.environ[_AGENT_VAR] = before
        yield item


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
                STORE_VAR: f"{self.addr}:{self.port}"}

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
