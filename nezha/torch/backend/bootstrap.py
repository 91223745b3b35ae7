"""Starting nezha's engine for ``init_process_group("nezha")``.

Under nezharun the engine starts as ``nezha.init()`` would (nezharun's store, its per-job secret,
its host placement and rails). Anywhere else (torchrun, Slurm, an explicit ``store=`` or
``init_method=``), the ranks meet through the store torch.distributed hands the backend: each
publishes its host (host name, boot id and network namespace, or ``NEZHA_HOST_ID``), from which
the local and cross ranks follow, and its engine's listen addresses; rank 0 publishes the job's
secret unless ``NEZHA_SECRET`` is set on every rank. The store is as trusted as torch's own: any
peer that can reach it can read the secret, as it can join the job.
"""
from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta
from typing import List, Optional, Sequence, Tuple

import torch.distributed as dist

import nezha
from nezha import basics, environ


class TorchStoreClient:
    """A torch.distributed Store behind the interface of nezha's StoreClient (set, get, get_many,
    wait, add with timeouts), which nezha's address exchange uses."""

    def __init__(self, store: dist.Store, timeout_s: float) -> None:
        self._store = store
        self._timeout_s = timeout_s

    def set(self, key: str, value: bytes) -> None:
        self._store.set(key, value)

    def get(self, key: str, timeout_s: Optional[float] = None) -> bytes:
        self.wait([key], timeout_s)
        return bytes(self._store.get(key))

    def get_many(self, keys: Sequence[str], timeout_s: Optional[float] = None) -> List[bytes]:
        self.wait(keys, timeout_s)  # multi_get itself waits only as long as the store's timeout
        return [bytes(v) for v in self._store.multi_get(list(keys))]

    def wait(self, keys: Sequence[str], timeout_s: Optional[float] = None) -> None:
        limit = self._timeout_s if timeout_s is None else timeout_s
        try:
            self._store.wait(list(keys), timedelta(seconds=limit))
        except Exception as exc:  # torch raises DistStoreError (a RuntimeError) on timeout
            missing = [k for k in keys if not self._store.check([k])]
            raise TimeoutError(f"torch.distributed's store: waited {limit:g} s for "
                               f"{missing[:4] or list(keys)[:4]} ({exc})") from None

    def add(self, key: str, delta: int) -> int:
        return int(self._store.add(key, delta))


def host_key() -> str:
    """What tells this rank's host from the others': ``NEZHA_HOST_ID`` (nezharun's placement),
    else the host name, boot id and network namespace (so network namespaces used as hosts, as on
    the testbed, are told apart as a shared-memory rail tells them apart)."""
    explicit = os.environ.get("NEZHA_HOST_ID") or os.environ.get("HOROVOD_HOSTNAME")
    if explicit:
        return explicit
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"


def placement(hosts: List[str], rank: int) -> Tuple[int, int, int, int]:
    """(local rank, local size, cross rank, cross size) of `rank` given every rank's host key;
    hosts are numbered in the order of their lowest rank."""
    order = list(dict.fromkeys(hosts))
    mine = hosts[rank]
    return (hosts[:rank].count(mine), hosts.count(mine), order.index(mine), len(order))


def store_address(store: dist.Store) -> str:
    """The address the store's server listens on (to pick the default rail's interface)."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    host = getattr(store, "host", None) if isinstance(store, dist.TCPStore) else None
    return host or os.environ.get("MASTER_ADDR") or "127.0.0.1"


def start_engine(store: dist.Store, rank: int, size: int, timeout: timedelta) -> bool:
    """Starts nezha's engine as rank `rank` of `size`; True when this call started it (the default
    group then shuts it down), False when nezha was initialized already, with the same layout."""
    if nezha.is_initialized():
        if (nezha.rank(), nezha.size()) != (rank, size):
            raise ValueError(f"nezha is initialized as rank {nezha.rank()} of {nezha.size()}; "
                             f"init_process_group asked for rank {rank} of {size}")
        return False
    env = os.environ
    if env.get("NEZHA_RANK") == str(rank) and env.get("NEZHA_SIZE") == str(size):
        nezha.init()  # nezharun's job: its store, secret, placement and rails
        return True
    connect_s = float(nezha._core.knob_value("NEZHA_CONNECT_TIMEOUT_S") or 60)
    client = TorchStoreClient(store, min(connect_s, timeout.total_seconds()))
    generation = client.add(f"nezha/torch/generation/{rank}", 1)
    prefix = f"nezha/torch/{generation}"
    me = host_key()
    client.set(f"{prefix}/host/{rank}", me.encode())
    hosts = [h.decode() for h in client.get_many([f"{prefix}/host/{r}" for r in range(size)])]
    if env.get("NEZHA_SECRET"):
        secret = environ.secret_from(env)
    elif rank == 0:
        secret = secrets.token_bytes(32)
        client.set(f"{prefix}/secret", secret)
    else:
        secret = client.get(f"{prefix}/secret")
    local_rank, local_size, cross_rank, cross_size = placement(hosts, rank)
    info = environ.WorldInfo(
        rank=rank, size=size, local_rank=local_rank, local_size=local_size,
        cross_rank=cross_rank, cross_size=cross_size, rendezvous_addr=store_address(store),
        rendezvous_port=0, secret=secret, rails=env.get("NEZHA_RAILS") or None,
        source="torch.distributed", host_store=False)
    return basics.init_with_store(info, client, host_id=me)
