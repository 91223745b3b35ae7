"""The baseline: torch.distributed with the Gloo backend, on the same ranks, sizes and dtype.

Gloo is bootstrapped over nezha itself: rank 0 reserves a port on its first rail's address and
broadcasts "addr:port"; every rank then joins a TCPStore there. GLOO_SOCKET_IFNAME (which NICs Gloo
uses; a comma list makes it round-robin whole collectives over them) must be set before init.
"""
from __future__ import annotations

import datetime
import os
import socket
from typing import List, Optional, Tuple

import numpy as np

from nezha.bench.backend import CallableStep
from nezha.bench.workloads import rank_input

_BOOTSTRAP_BYTES = 128


def pick_free_port(addr: str) -> int:
    """A port free on `addr` right now (the TCPStore binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def encode_endpoint(addr: str, port: int) -> np.ndarray:
    raw = f"{addr}:{port}".encode("ascii")
    if len(raw) > _BOOTSTRAP_BYTES:
        raise ValueError(f"gloo bootstrap endpoint {raw!r} longer than {_BOOTSTRAP_BYTES} bytes")
    buf = np.zeros(_BOOTSTRAP_BYTES, dtype=np.uint8)
    buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return buf


def decode_endpoint(buf: np.ndarray) -> Tuple[str, int]:
    text = bytes(np.asarray(buf, dtype=np.uint8)).rstrip(b"\0").decode("ascii")
    addr, _, port = text.rpartition(":")
    if not addr or not port.isdigit():
        raise ValueError(f"bad gloo bootstrap endpoint {text!r}")
    return addr, int(port)


def interface_of(addr: str) -> Optional[str]:
    """The local interface holding IPv4 address `addr` (None if none does)."""
    import psutil
    for ifname, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == addr for a in addrs):
            return ifname
    return None


def bootstrap_address(rail_stats, ifnames: Optional[str]) -> str:
    """The IPv4 address Gloo bootstraps on: the first network rail's, else (a job on host-local
    rails only, e.g. shm) the first address of --gloo-ifname's interface, else loopback."""
    import ipaddress

    import psutil
    for stats in rail_stats:
        try:
            return str(ipaddress.IPv4Address(stats["local_addr"]))
        except ValueError:
            continue
    for ifname in (ifnames or "").split(","):
        for a in psutil.net_if_addrs().get(ifname.strip(), []):
            if a.family == socket.AF_INET:
                return a.address
    return "127.0.0.1"


def _to_torch(array: np.ndarray, dtype: str):
    import torch
    if dtype == "bfloat16":  # torch cannot import ml_dtypes arrays; reinterpret the bits
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def _to_numpy(tensor, dtype: str) -> np.ndarray:
    import torch
    if dtype == "bfloat16":
        from nezha.bench.workloads import numpy_dtype
        return tensor.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return tensor.numpy()


class GlooBaseline:
    """torch.distributed/Gloo collectives behind the same Backend interface as nezha's."""

    def __init__(self, nezha_module, impl: str, ifnames: Optional[str], timeout_s: float):
        import torch.distributed as dist
        self._dist = dist
        self.impl = impl
        self.rank = nezha_module.rank()
        self.world = nezha_module.size()
        first_rail_addr = bootstrap_address(nezha_module.rail_stats(), ifnames)
        if ifnames is None:
            ifnames = interface_of(first_rail_addr)
        if ifnames:
            os.environ["GLOO_SOCKET_IFNAME"] = ifnames
        self.ifnames = ifnames
        endpoint = encode_endpoint(first_rail_addr, pick_free_port(first_rail_addr)) \
            if self.rank == 0 else np.zeros(_BOOTSTRAP_BYTES, dtype=np.uint8)
        addr, port = decode_endpoint(nezha_module.broadcast(endpoint, 0, name="nezha-bench.gloo-endpoint"))
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        # Newer torch renames the *_tensor collectives to *_single.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def prepare(self, op: str, count: int, dtype: str) -> CallableStep:
        import torch
        dist = self._dist
        source = _to_torch(rank_input(self.rank, self.world, count, dtype), dtype)
        if op in ("allreduce", "broadcast"):
            # Gloo works in place: time on a scratch copy, verify on a fresh one.
            work = source.clone()
            collective = (lambda t: dist.all_reduce(t, op=dist.ReduceOp.SUM)) if op == "allreduce" \
                else (lambda t: dist.broadcast(t, src=0))
            def checked():
                work.copy_(source)
                collective(work)
                return _to_numpy(work, dtype)
            return CallableStep(lambda: collective(work), checked)
        if op == "allgather":
            out = torch.empty(count * self.world, dtype=source.dtype)
            collective = lambda: self._all_gather(out, source)
        elif op == "reducescatter":
            out = torch.empty(count // self.world, dtype=source.dtype)
            collective = lambda: self._reduce_scatter(out, source, op=dist.ReduceOp.SUM)
        elif op == "alltoall":
            out = torch.empty(count, dtype=source.dtype)
            collective = lambda: dist.all_to_all_single(out, source)
        else:
            raise ValueError(f"unknown op {op!r}")
        def checked():
            out.zero_()
            collective()
            return _to_numpy(out, dtype)
        return CallableStep(collective, checked)

    def rail_bytes(self) -> Tuple[List[str], List[int]]:
        return [], []

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
