"""send / recv of the "nezha" process group: a broadcast from the sender in the pair set of the
two ranks (nezha.process_sets.pair_set), so only those two ranks take part, the transfer is
negotiated like any other operation (a size or dtype mismatch fails on both, a dead peer within
the timeout) and a large one is striped over every rail.

The n-th send from rank a to rank b with a given tag pairs with the n-th receive of b from a with
that tag, in each process group: both sides count their transfers per (group, sender, receiver,
tag) and name the operation after the count.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Tuple

import torch

from nezha.process_sets import pair_set
from nezha.torch import mpi_ops
from nezha.torch.backend import tensors as tz


class PointToPoint:
    """Mixin of ProcessGroupNezha: send, recv, isend/irecv (torch wraps these)."""

    _p2p_counts: Dict[Tuple[int, int, int], "itertools.count"]

    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0):
        self._one_tensor(tensors, "send")
        return self._transfer("send", tensors[0], self.rank(), self._peer(dstRank, "send"), tag)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0):
        self._one_tensor(tensors, "recv")
        return self._transfer("recv", tensors[0], self._peer(srcRank, "recv"), self.rank(), tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0):
        raise NotImplementedError("the nezha backend receives from a named rank only: pass src= "
                                  "to recv/irecv (a receive from any source is not supported)")

    def _peer(self, group_rank: int, what: str) -> int:
        self._job_rank(group_rank, f"{what}'s peer")
        if group_rank == self.rank():
            raise ValueError(f"{what}: rank {group_rank} cannot {what} to or from itself")
        return group_rank

    def _transfer(self, kind: str, tensor: torch.Tensor, src: int, dst: int, tag: int):
        key = (src, dst, int(tag))
        count = next(self._p2p_counts.setdefault(key, itertools.count()))
        source, dest = self._job_rank(src, kind), self._job_rank(dst, kind)
        pair = pair_set(source, dest)
        blob = tz.as_bytes(tensor)

        def start(_name):
            # Named by the pair's own count (not the group's sequence): the two ranks' other
            # operations in between need not agree.
            name = f"{self._prefix}.p2p.{source}-{dest}.{tag}.{count}"
            return mpi_ops.broadcast_async_(blob, source, name=name, process_set=pair)

        def finish(_):
            if kind == "recv":
                tz.deliver(blob, tensor)
            return tz.settle_devices([tensor])

        return self._run(kind, start, finish, None, sequenced=False)
