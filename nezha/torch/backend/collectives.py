"""The collectives of the "nezha" process group, under the method names torch.distributed calls.

Each method checks its arguments (ValueError / TypeError at the call, as torch's own backends
raise), then hands ``ProcessGroupNezha._run`` a ``start(name)`` that submits the operation to the
engine (nezha's framework-neutral API, through nezha.torch's staging) and a ``finish(result)``
that delivers the outputs. Ranks in ``opts`` (roots) are the group's; the engine works in the
job's ranks, over the group's process set. Both the method names of torch 2.13 and the older ones
(``_allgather_base``, ``alltoall_base``, ...) are served.
"""
from __future__ import annotations

from typing import List

import torch
from torch.distributed import distributed_c10d as c10d

import nezha
from nezha.torch import _buffers, mpi_ops
from nezha.torch.backend import tensors as tz


class Collectives:
    """Mixin of ProcessGroupNezha: every collective operation."""

    # --- reductions -----------------------------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts=c10d.AllreduceOptions()):
        self._one_tensor(tensors, "allreduce")
        return self._reduce_in_place("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors: List[torch.Tensor],
                            opts=c10d.AllreduceCoalescedOptions()):
        return self._reduce_in_place("allreduce_coalesced", list(tensors), opts)

    def reduce(self, tensors: List[torch.Tensor], opts=c10d.ReduceOptions()):
        # Every rank gets the result (torch leaves the non-roots' tensors unspecified): an
        # allreduce costs the same steps on the rails as a reduce followed by nothing.
        self._one_tensor(tensors, "reduce")
        self._job_rank(opts.rootRank, "reduce's root")
        return self._reduce_in_place("reduce", tensors, opts)

    def _reduce_in_place(self, kind: str, tensors: List[torch.Tensor], opts):
        op, prescale = tz.reduction(opts.reduceOp)
        views = [tz.reducible(t, op, kind) for t in tensors]
        if not views:
            return self._done([])
        grouped = len(views) > 1
        if not grouped and _buffers.is_numpy_view_ready(views[0]):
            # A contiguous CPU tensor: the engine reduces its own storage in place; nothing to stage
            # or deliver (a small call's time is mostly these layers' CPU).
            array = _buffers.engine_array(views[0])

            def start(name):
                return nezha.allreduce_async(array, op=op, name=name, prescale_factor=prescale,
                                             out=array, process_set=self._set)
        else:
            def start(name):
                return mpi_ops._reduce_async(views, views, name, op, prescale, 1.0, grouped=grouped,
                                             process_set=self._set)

        return self._run(kind, start, lambda _: tz.settle_devices(tensors), opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts=c10d.ReduceScatterOptions()):
        n = self.size()
        if input.dtype != output.dtype or input.numel() != n * output.numel():
            raise ValueError(f"reduce_scatter_tensor: the input ({input.dtype}, {input.numel()} "
                             f"elements) must be {n} x the output ({output.dtype}, "
                             f"{output.numel()} elements)")
        return self._reduce_scatter("reduce_scatter_tensor", [output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]],
                       opts=c10d.ReduceScatterOptions()):
        self._one_tensor(outputs, "reduce_scatter")
        parts = list(inputs[0]) if len(inputs) == 1 else []
        if len(parts) != self.size():
            raise ValueError(f"reduce_scatter: expected one list of {self.size()} input tensors")
        tz.check_same(parts, outputs[0], "reduce_scatter")
        stacked = torch.stack([p.detach().reshape(-1) for p in parts])
        return self._reduce_scatter("reduce_scatter", outputs, [stacked], opts)

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor],
                                        inputs: List[torch.Tensor],
                                        opts=c10d.ReduceScatterOptions()):
        n = self.size()
        for i, (o, t) in enumerate(zip(outputs, inputs, strict=True)):
            if t.dtype != o.dtype or t.numel() != n * o.numel():
                raise ValueError(f"reduce_scatter_tensor_coalesced: input {i} must be {n} x "
                                 f"output {i} ({o.dtype}, {o.numel()} elements)")
        return self._reduce_scatter("reduce_scatter_tensor_coalesced", list(outputs),
                                    list(inputs), opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter(self, kind: str, outputs, inputs, opts):
        """Rank r of the group receives block r of every input (seen as [size, ...])."""
        op, prescale = tz.reduction(opts.reduceOp)
        n = self.size()
        blocks = [tz.reducible(t.detach(), op, kind).reshape(n, -1) for t in inputs]
        if not blocks:
            return self._done([])

        def start(name):
            return mpi_ops.grouped_reducescatter_async(blocks, name=name, op=op,
                                                       process_set=self._set,
                                                       prescale_factor=prescale)

        def finish(results):
            for result, out in zip(results, outputs):
                tz.deliver(result, out)
            return tz.settle_devices(outputs)

        return self._run(kind, start, finish, opts)

    # --- data movement --------------------------------------------------------------------------

    def broadcast(self, tensors: List[torch.Tensor], opts=c10d.BroadcastOptions()):
        self._one_tensor(tensors, "broadcast")
        root = self._job_rank(opts.rootRank, "broadcast's root")
        tensor = tensors[0]
        blob = tz.as_bytes(tensor)

        def start(name):
            return mpi_ops.broadcast_async_(blob, root, name=name, process_set=self._set)

        def finish(_):
            tz.deliver(blob, tensor)
            return tz.settle_devices(tensors)

        return self._run("broadcast", start, finish, opts)

    def allgather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor],
                  opts=c10d.AllgatherOptions()):
        self._one_tensor(inputs, "allgather")
        if len(outputs) != 1 or len(outputs[0]) != self.size():
            raise ValueError(f"allgather: expected one list of {self.size()} output tensors")
        return self._allgather("allgather", [list(outputs[0])], inputs, opts)

    def allgather_coalesced(self, outputs: List[List[torch.Tensor]],
                            inputs: List[torch.Tensor], opts=c10d.AllgatherOptions()):
        # outputs[r][i]: rank r's tensor i
        if len(outputs) != self.size() or any(len(o) != len(inputs) for o in outputs):
            raise ValueError(f"allgather_coalesced: expected {self.size()} lists (one per rank) "
                             f"of {len(inputs)} outputs")
        per_input = [[outputs[r][i] for r in range(self.size())] for i in range(len(inputs))]
        return self._allgather("allgather_coalesced", per_input, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts=c10d.AllgatherOptions()):
        self._check_gathered(output, input, "all_gather_into_tensor")
        return self._allgather("all_gather_into_tensor", [[output]], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor],
                                    inputs: List[torch.Tensor], opts=c10d.AllgatherOptions()):
        for o, t in zip(outputs, inputs, strict=True):
            self._check_gathered(o, t, "all_gather_into_tensor_coalesced")
        return self._allgather("all_gather_into_tensor_coalesced", [[o] for o in outputs],
                               list(inputs), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _check_gathered(self, output, input, what):
        if output.dtype != input.dtype or output.numel() != self.size() * input.numel():
            raise ValueError(f"{what}: the output ({output.dtype}, {output.numel()} elements) "
                             f"must be {self.size()} x the input ({input.dtype}, "
                             f"{input.numel()} elements)")

    def _allgather(self, kind: str, outputs: List[List[torch.Tensor]], inputs, opts):
        """Every rank's bytes of each input, in group order, into that input's outputs."""
        blobs = [tz.as_bytes(t) for t in inputs]
        if not blobs:
            return self._done([])

        def start(name):
            return mpi_ops.grouped_allgather_async(blobs, name=name, process_set=self._set)

        def finish(gathered):
            for blob, targets in zip(gathered, outputs):
                tz.deliver_bytes(blob, targets, kind)
            return tz.settle_devices([t for targets in outputs for t in targets])

        return self._run(kind, start, finish, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: List[int], input_split_sizes: List[int],
                          opts=c10d.AllToAllOptions()):
        n = self.size()
        rows_in = input.shape[0] if input.dim() else 0
        rows_out = output.shape[0] if output.dim() else 0
        splits_in = (list(input_split_sizes) if input_split_sizes
                     else tz.equal_splits(rows_in, n, "all_to_all_single's input"))
        splits_out = (list(output_split_sizes) if output_split_sizes
                      else tz.equal_splits(rows_out, n, "all_to_all_single's output"))
        if len(splits_in) != n or len(splits_out) != n or sum(splits_in) != rows_in \
                or sum(splits_out) != rows_out:
            raise ValueError(f"all_to_all_single: split sizes {splits_in} (input, {rows_in} rows) "
                             f"and {splits_out} (output, {rows_out} rows) must list {n} parts "
                             "that add up to dim 0")
        if input.dtype != output.dtype or tz.row_bytes(input) != tz.row_bytes(output):
            raise ValueError("all_to_all_single: input and output differ in dtype or row shape")
        row = tz.row_bytes(input)
        return self._alltoall("all_to_all_single", [output], tz.as_bytes(input),
                              [s * row for s in splits_in], [s * row for s in splits_out], opts)

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                 opts=c10d.AllToAllOptions()):
        n = self.size()
        if len(outputs) != n or len(inputs) != n:
            raise ValueError(f"alltoall: expected {n} input and {n} output tensors")
        blob = torch.cat([tz.as_bytes(t).to(inputs[0].device) for t in inputs])
        return self._alltoall("alltoall", list(outputs), blob,
                              [tz.byte_size(t) for t in inputs],
                              [tz.byte_size(t) for t in outputs], opts)

    def gather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor],
               opts=c10d.GatherOptions()):
        # An alltoall in which every rank sends its bytes to the root only.
        self._one_tensor(inputs, "gather")
        root, me, n = opts.rootRank, self.rank(), self.size()
        self._job_rank(root, "gather's root")
        targets = list(outputs[0]) if me == root and outputs else []
        if me == root and len(targets) != n:
            raise ValueError(f"gather: the root needs one list of {n} output tensors")
        if me != root and outputs and any(outputs):
            raise ValueError("gather: only the root passes output tensors")
        size = tz.byte_size(inputs[0])
        send = [size if r == root else 0 for r in range(n)]
        expect = [tz.byte_size(t) for t in targets] if me == root else [0] * n
        return self._alltoall("gather", targets, tz.as_bytes(inputs[0]), send, expect, opts)

    def scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]],
                opts=c10d.ScatterOptions()):
        # An alltoall in which only the root sends: part r to rank r.
        self._one_tensor(outputs, "scatter")
        root, me, n = opts.rootRank, self.rank(), self.size()
        self._job_rank(root, "scatter's root")
        if me == root:
            parts = list(inputs[0]) if len(inputs) == 1 else []
            if len(parts) != n:
                raise ValueError(f"scatter: the root needs one list of {n} input tensors")
            blob = torch.cat([tz.as_bytes(t).to(outputs[0].device) for t in parts])
            send = [tz.byte_size(t) for t in parts]
        else:
            if inputs and any(inputs):
                raise ValueError("scatter: only the root passes input tensors")
            blob, send = torch.empty(0, dtype=torch.uint8), [0] * n
        expect = [tz.byte_size(outputs[0]) if r == root else 0 for r in range(n)]
        return self._alltoall("scatter", list(outputs), blob, send, expect, opts)

    def _alltoall(self, kind: str, targets, blob, send_bytes, expect_bytes, opts):
        """Sends send_bytes[r] bytes of `blob` to group rank r; what arrives must be
        expect_bytes[r] from each rank and is delivered into `targets` in order."""

        def start(name):
            return mpi_ops.alltoall_async(blob, splits=send_bytes, name=name,
                                          process_set=self._set)

        def finish(result):
            received, splits = result
            got = [int(s) for s in splits]
            if got != list(expect_bytes):
                wrong = [r for r in range(len(got)) if got[r] != expect_bytes[r]]
                raise ValueError(f"{kind}: rank(s) {wrong} of the group sent {[got[r] for r in wrong]} "
                                 f"bytes where this rank expected {[expect_bytes[r] for r in wrong]}")
            tz.deliver_bytes(received, targets, kind)
            return tz.settle_devices(targets)

        return self._run(kind, start, finish, opts)

    def barrier(self, opts=c10d.BarrierOptions()):
        return self._run("barrier", lambda name: nezha.barrier_async(name, self._set),
                         lambda _: [], opts)
