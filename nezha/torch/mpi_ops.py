"""Asynchronous and in-place collectives on torch tensors (Horovod's `*_async`, `*_` names).

Thin: each function stages tensors (see _buffers), calls the matching `nezha.*_async`, and returns
its Handle extended (`then`) by a step that delivers the result into torch tensors. Names are
prefixed with the op (`allreduce.<name>`) as Horovod does, so one name may serve an allreduce and a
broadcast.
The synchronous in-place forms start their operation as a waiter (`started_by_waiter`): the caller
leads the engine's loop until the result is in, as `nezha.allreduce` does, instead of waking the
engine's thread and sleeping. The differentiable synchronous forms live in autograd_ops.
"""

import numpy as np
import torch

import nezha
from nezha.handle import Handle, synchronize
from nezha.horovod_api import Average, resolve_op
from nezha.ops import started_by_waiter
from nezha.process_sets import global_process_set, process_set_id
from nezha.torch import _buffers


def _op_name(kind, name):
    return None if name is None else "%s.%s" % (kind, name)


def _outputs_for(sources, hosts_in, targets):
    """Host buffers the engine writes results into.

    In place (`targets` given): the target's own memory when it is a contiguous CPU tensor, else the
    private staging copy of the input. Out of place: a fresh tensor for inputs the engine reads in
    place (they must not change), else the private staging copy.
    """
    outs = []
    for i, (src, host_in) in enumerate(zip(sources, hosts_in)):
        private_copy = host_in.data_ptr() != src.data_ptr() or host_in.device != src.device
        if targets is None:
            outs.append(host_in if private_copy else torch.empty_like(host_in))
        elif targets[i].device.type == "cpu" and targets[i].is_contiguous():
            outs.append(targets[i].detach())
        else:
            outs.append(host_in if private_copy else _buffers.host_output(targets[i]))
    return outs


def _deliver(hosts_out, sources, targets):
    if targets is None:
        return [_buffers.to_device_of(h, s) for h, s in zip(hosts_out, sources)]
    for h, t in zip(hosts_out, targets):
        _buffers.copy_out(h, t)
    return list(targets)


def is_plain_cpu(tensor, process_set):
    """A plain torch.Tensor (subclasses such as DTensor take the general path) that is a numpy
    view (_buffers.is_numpy_view_ready), reduced over the whole job: what reduce_plain_now takes."""
    return (type(tensor) is torch.Tensor and process_set is global_process_set
            and _buffers.is_numpy_view_ready(tensor))


def reduce_plain_now(tensor, out, op, name, prescale_factor, postscale_factor):
    """Reduces a plain tensor (is_plain_cpu) into `out` (itself, or a new tensor like it) and
    returns `out`: their storage as numpy arrays through nezha.allreduce's synchronous path, with
    nothing to stage and no handle to extend (a small call's time is mostly this layer's CPU)."""
    nezha.allreduce(_buffers.engine_array(tensor), op=op, name=_op_name("allreduce", name),
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                    out=_buffers.engine_array(out))
    return out


def _reduce_async(tensors, targets, name, op, prescale_factor, postscale_factor, grouped,
                  process_set=global_process_set):
    process_set_id(process_set)  # refused before anything is staged
    what = "grouped_allreduce" if grouped else "allreduce"
    for t in tensors:
        _buffers.check_supported(t, what)
    device = _buffers.group_device(tensors, what)
    if _buffers.needs_widening(tensors):
        return _widened_reduce_async(tensors, targets, name, op, prescale_factor,
                                     postscale_factor, grouped, process_set)
    hosts_in = _buffers.stage_in(tensors)
    hosts_out = _outputs_for(tensors, hosts_in, targets)
    ins = [_buffers.engine_array(h) for h in hosts_in]
    outs = [_buffers.engine_array(h) for h in hosts_out]
    if grouped:
        engine_handle = nezha.grouped_allreduce_async(
            ins, op=op, name=_op_name(what, name), prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, outs=outs, process_set=process_set, device=device)
    else:
        engine_handle = nezha.allreduce_async(
            ins[0], op=op, name=_op_name(what, name), prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, out=outs[0], process_set=process_set,
            device=device)

    def finish(_):
        results = _deliver(hosts_out, tensors, targets)
        return results if grouped else results[0]

    return engine_handle.then(finish)


def _widened_reduce_async(tensors, targets, name, op, prescale_factor, postscale_factor, grouped,
                          process_set):
    """bf16 reduction without an engine-visible bf16 dtype: reduce float32 copies in place."""
    wide = _buffers.widen_bfloat16(tensors)
    inner = _reduce_async(wide, wide, name, op, prescale_factor, postscale_factor, grouped,
                          process_set)

    def finish(results):
        results = results if grouped else [results]
        narrowed = [r.to(t.dtype) for r, t in zip(results, tensors)]
        if targets is not None:
            for n, t in zip(narrowed, targets):
                t.detach().copy_(n)
            narrowed = list(targets)
        return narrowed if grouped else narrowed[0]

    return inner.then(finish)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's sparse reduction: every rank's indices and values are allgathered (their counts
    differ per rank) and summed by coalescing. Returns a handle that is also a function to call
    for the reduced sparse tensor, as Horovod's."""
    process_set_id(process_set)
    if not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse tensor; use allreduce_async")
    op = resolve_op(op, None)
    if op not in (Average, nezha.Sum):
        raise ValueError("sparse_allreduce_async supports Sum and Average, got %s" % (op,))
    grad = tensor.detach().coalesce()

    def combine(gathered):
        indices, values = gathered
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.t(), values, grad.shape).coalesce()

    return Handle.gather([allgather_async(grad.indices().t().contiguous(), name=name + ".indices",
                                          process_set=process_set),
                          allgather_async(grad.values().contiguous(), name=name + ".values",
                                          process_set=process_set)],
                         combine)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over all ranks into a new tensor; `tensor` is not modified."""
    return _reduce_async([tensor], None, name, resolve_op(op, average), prescale_factor,
                         postscale_factor, grouped=False, process_set=process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing `tensor` over all ranks in place."""
    return _reduce_async([tensor], [tensor], name, resolve_op(op, average), prescale_factor,
                         postscale_factor, grouped=False, process_set=process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over all ranks in place and returns it."""
    if is_plain_cpu(tensor, process_set):
        return reduce_plain_now(tensor, tensor, resolve_op(op, average), name, prescale_factor,
                                postscale_factor)
    return synchronize(started_by_waiter(allreduce_async_, tensor, average, name, op,
                                         prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts reducing a list of tensors as one operation; the handle's result is a list."""
    return _reduce_async(list(tensors), None, name, resolve_op(op, average), prescale_factor,
                         postscale_factor, grouped=True, process_set=process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    tensors = list(tensors)
    return _reduce_async(tensors, tensors, name, resolve_op(op, average), prescale_factor,
                         postscale_factor, grouped=True, process_set=process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(started_by_waiter(grouped_allreduce_async_, tensors, average, name, op,
                                         prescale_factor, postscale_factor, process_set))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along dim 0 (dim 0 may differ per rank)."""
    process_set_id(process_set)
    _buffers.check_supported(tensor, "allgather")
    source = tensor.reshape(1) if tensor.dim() == 0 else tensor
    (host_in,) = _buffers.stage_in([source])
    engine_handle = nezha.allgather_async(_buffers.engine_array(host_in),
                                          name=_op_name("allgather", name),
                                          process_set=process_set,
                                          device=_buffers.engine_device(tensor))

    def finish(result):
        return _buffers.to_device_of(_buffers.tensor_from_engine(result, tensor.dtype), tensor)

    return engine_handle.then(finish)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of the tensors negotiated as one unit (fused into one operation on the
    rails); the handle's result is the list of gathered tensors."""
    process_set_id(process_set)
    tensors = list(tensors)
    for t in tensors:  # all checked before any is submitted, so a refusal leaves nothing in flight
        _buffers.check_supported(t, "grouped_allgather")
    device = _buffers.group_device(tensors, "grouped_allgather")
    hosts = _buffers.stage_in([t.reshape(1) if t.dim() == 0 else t for t in tensors])
    engine_handle = nezha.grouped_allgather_async([_buffers.engine_array(h) for h in hosts],
                                                  name=_op_name("allgather", name),
                                                  process_set=process_set, device=device)

    def finish(results):
        return [_buffers.to_device_of(_buffers.tensor_from_engine(r, t.dtype), t)
                for r, t in zip(results, tensors)]

    return engine_handle.then(finish)


def _broadcast_async(tensor, target, root_rank, name, process_set):
    _buffers.check_supported(tensor, "broadcast")
    (host_in,) = _buffers.stage_in([tensor])
    targets = None if target is None else [target]
    (host_out,) = _outputs_for([tensor], [host_in], targets)
    engine_handle = nezha.broadcast_async(
        _buffers.engine_array(host_in), root_rank, name=_op_name("broadcast", name),
        out=_buffers.engine_array(host_out), process_set=process_set,
        device=_buffers.engine_device(tensor))

    def finish(_):
        return _deliver([host_out], [tensor], targets)[0]

    return engine_handle.then(finish)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` into a new tensor on every rank."""
    process_set_id(process_set)
    return _broadcast_async(tensor, None, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` into `tensor` on every rank."""
    process_set_id(process_set)
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(started_by_waiter(broadcast_async_, tensor, root_rank, name, process_set))


def _splits_list(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        splits = splits.detach().cpu().tolist()
    return [int(s) for s in splits]


def received_splits_like(received, splits):
    """The rows received from each rank as an int32 tensor where Horovod returns it: on the
    device of `splits` when that is a tensor (a GPU's splits give GPU received_splits), else on
    the CPU."""
    received = torch.from_numpy(np.asarray(received).astype(np.int32, copy=False))
    if isinstance(splits, torch.Tensor) and splits.device.type != "cpu":
        return received.to(splits.device)
    return received


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending `splits[r]` rows of dim 0 to rank r (equal parts by default).

    The handle's result is `(output, received_splits)`, received_splits an int32 tensor on the
    device of `splits` (the CPU when splits is not a tensor), as in Horovod.
    """
    process_set_id(process_set)
    _buffers.check_supported(tensor, "alltoall")
    (host_in,) = _buffers.stage_in([tensor])
    engine_handle = nezha.alltoall_async(_buffers.engine_array(host_in),
                                         splits=_splits_list(splits),
                                         name=_op_name("alltoall", name),
                                         process_set=process_set,
                                         device=_buffers.engine_device(tensor))

    def finish(result):
        output, received = result
        output = _buffers.to_device_of(_buffers.tensor_from_engine(output, tensor.dtype), tensor)
        return output, received_splits_like(received, splits)

    return engine_handle.then(finish)


def check_scatterable(tensor, what):
    """Raises (TypeError, or ValueError for a 0-d tensor, as Horovod) unless `tensor` can be
    reducescattered."""
    _buffers.check_supported(tensor, what)
    if tensor.dim() == 0:
        raise ValueError("%s does not support scalar inputs: a 0-d tensor has no dimension 0 to "
                         "scatter" % what)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducing `tensor` over all ranks; rank r receives block r of dim 0 (lower ranks get
    the extra rows when dim 0 does not divide evenly)."""
    process_set_id(process_set)
    op = resolve_op(op, None)
    check_scatterable(tensor, "reducescatter")
    if _buffers.needs_widening([tensor]):
        inner = reducescatter_async(tensor.detach().float(), name, op, process_set,
                                    prescale_factor, postscale_factor)
        return inner.then(lambda result: result.to(tensor.dtype))
    (host_in,) = _buffers.stage_in([tensor])
    engine_handle = nezha.reducescatter_async(
        _buffers.engine_array(host_in), op=op, name=_op_name("reducescatter", name),
        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        process_set=process_set, device=_buffers.engine_device(tensor))

    def finish(result):
        return _buffers.to_device_of(_buffers.tensor_from_engine(result, tensor.dtype), tensor)

    return engine_handle.then(finish)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of the tensors negotiated as one unit (fused into one operation on the
    rails); the handle's result is the list of this rank's blocks. Every tensor is checked before any is submitted (a 0-d one raises ValueError, as in Horovod)."""
    process_set_id(process_set)
    op = resolve_op(op, None)
    tensors = list(tensors)
    for t in tensors:
        check_scatterable(t, "grouped_reducescatter")
    device = _buffers.group_device(tensors, "grouped_reducescatter")
    sources = _buffers.widen_bfloat16(tensors) if _buffers.needs_widening(tensors) else tensors
    hosts = _buffers.stage_in(sources)
    engine_handle = nezha.grouped_reducescatter_async(
        [_buffers.engine_array(h) for h in hosts], op=op, name=_op_name("reducescatter", name),
        prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        process_set=process_set, device=device)

    def finish(results):
        return [_buffers.to_device_of(_buffers.tensor_from_engine(r, s.dtype), t).to(t.dtype)
                for r, s, t in zip(results, sources, tensors)]

    return engine_handle.then(finish)


def join(device=-1):
    """Marks this rank as out of data; returns the rank that joined last (Horovod semantics).
    `device` is accepted for compatibility: Nezha's zero tensors for joined ranks live on the host."""
    return int(nezha.join())
