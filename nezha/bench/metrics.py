"""Bandwidth figures with the nccl-tests conventions (see nccl-tests doc/PERFORMANCE.md).

algbw is the op's data size over the time; busbw scales it by how much of that data each rank's
link must carry with an optimal algorithm, so figures are comparable across ops and rank counts:
busbw = algbw * 2(n-1)/n for allreduce, (n-1)/n for allgather, reducescatter and alltoall, 1 for
broadcast.
"""
from __future__ import annotations

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")


def busbw_factor(op: str, world: int) -> float:
    """The nccl-tests factor from algbw to busbw for `op` on `world` ranks."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    if op == "allreduce":
        return 2.0 * (world - 1) / world
    if op in ("allgather", "reducescatter", "alltoall"):
        return (world - 1) / world
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown op {op!r}; expected one of {', '.join(OPS)}")


def op_data_bytes(op: str, bytes_per_rank: int, world: int) -> int:
    """The size nccl-tests divides by the time: the gathered output for allgather (every rank's
    contribution), the per-rank buffer for every other op."""
    return bytes_per_rank * world if op == "allgather" else bytes_per_rank


def algbw_gbps(data_bytes: int, time_us: float) -> float:
    """Algorithm bandwidth in Gbit/s (10^9 bits per second)."""
    if time_us <= 0:
        raise ValueError(f"time must be positive, got {time_us} us")
    return data_bytes * 8 / (time_us * 1e3)


def busbw_gbps(op: str, algbw: float, world: int) -> float:
    """Bus bandwidth in Gbit/s from the algorithm bandwidth."""
    return algbw * busbw_factor(op, world)
