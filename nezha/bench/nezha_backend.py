"""The implementation under test: nezha's own collectives (and the cross-rank agreement the
measuring loop gets from nezha for every backend)."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from nezha.bench.backend import CallableStep
from nezha.bench.workloads import VerificationError, rank_input, split_counts

BROADCAST_ROOT = 0


class NezhaBackend:
    def __init__(self, nezha_module, impl: str):
        self._nz = nezha_module
        self.impl = impl
        self.rank = nezha_module.rank()
        self.world = nezha_module.size()

    def prepare(self, op: str, count: int, dtype: str) -> CallableStep:
        nz = self._nz
        x = rank_input(self.rank, self.world, count, dtype)
        # A stable name per (op, size) lets the engine's response cache serve steady-state steps,
        # as it would for a training loop's gradients.
        name = f"nezha-bench.{op}.{dtype}.{count}"
        if op == "allreduce":
            # In place, like torch.distributed's all_reduce (the Gloo baseline) and Horovod's
            # allreduce_ on gradients: no copy of the input into a separate output.
            original = x.copy()
            def run():
                nz.allreduce(x, op=nz.Sum, name=name, out=x)
            def checked():
                np.copyto(x, original)
                run()
                return x
            return CallableStep(run, checked)
        if op == "broadcast":
            out = np.empty_like(x)
            def run():
                nz.broadcast(x, BROADCAST_ROOT, name=name, out=out)
            def checked():
                out.fill(0)
                run()
                return out
            return CallableStep(run, checked)
        if op == "allgather":
            def run():
                nz.allgather(x, name=name)
            return CallableStep(run, lambda: nz.allgather(x, name=name))
        if op == "reducescatter":
            def run():
                nz.reducescatter(x, op=nz.Sum, name=name)
            return CallableStep(run, lambda: nz.reducescatter(x, op=nz.Sum, name=name))
        if op == "alltoall":
            splits = split_counts(count, self.world)
            def run():
                nz.alltoall(x, splits=splits, name=name)
            def checked():
                output, received = nz.alltoall(x, splits=splits, name=name)
                want = [splits[self.rank]] * self.world
                if [int(s) for s in np.asarray(received).reshape(-1)] != want:
                    raise VerificationError(
                        f"nezha alltoall {count} x {dtype} on rank {self.rank}: received splits "
                        f"{list(np.asarray(received).reshape(-1))}, expected {want}")
                return output
            return CallableStep(run, checked)
        raise ValueError(f"unknown op {op!r}")

    def rail_bytes(self) -> Tuple[List[str], List[int]]:
        stats = self._nz.rail_stats()
        return [rail["name"] for rail in stats], [int(rail["bytes_sent"]) for rail in stats]


class NezhaCoordinator:
    """Cross-rank agreement for the measuring loop, over nezha (whichever backend is measured)."""

    def __init__(self, nezha_module, timeout_s: Optional[float]):
        self._nz = nezha_module
        self._timeout_s = timeout_s
        self.rank = nezha_module.rank()
        self.world = nezha_module.size()

    def barrier(self) -> None:
        self._nz.barrier(timeout_s=self._timeout_s)

    def max_over_ranks(self, value: float) -> float:
        agreed = self._nz.allreduce(np.array([value], dtype=np.float64), op=self._nz.Max,
                                    name="nezha-bench.max")
        return float(agreed[0])

    def sum_over_ranks(self, values: Sequence[int]) -> List[int]:
        if not values:
            return []
        summed = self._nz.allreduce(np.array(values, dtype=np.int64), op=self._nz.Sum,
                                    name=f"nezha-bench.sum{len(values)}")
        return [int(v) for v in summed]
