"""The synchronous collectives, differentiable like Horovod's.

Gradient conventions (horovod.torch's, so scripts train the same and its test suite passes):
  allreduce Sum/Average -> the gradient is allreduced with the same op and scale factors;
  allreduce Min/Max     -> the summed gradient flows to the ranks whose input was selected;
  allreduce Product     -> the summed gradient times prod/x (undefined where x == 0);
                           (Horovod allreduces the gradient with Min/Max/Product itself, which is
                           not the derivative; COMPATIBILITY.md lists this difference);
  grouped_allreduce     -> the same, tensor by tensor, as one grouped operation;
  allgather, broadcast  -> the gradient is averaged over ranks (Horovod >= 0.20), then sliced to this
                           rank's rows / kept only on the root;
  alltoall              -> the gradient goes back with alltoall using the received splits;
  reducescatter         -> the gradient is multiplied by the size for Sum (not for Average) and by
                           the prescale and postscale factors, then allgathered: Horovod's
                           definition, size times the derivative for both ops.
Backward ops are named after the forward op (`<name>.grad`) when it was named.
"""

import torch

from nezha.basics import rank
from nezha.compression import compress_all, decompress_all
from nezha.handle import synchronize
from nezha.ops import started_by_waiter
from nezha.horovod_api import Average, Max, Min, Product, Sum, resolve_op
from nezha.process_sets import global_process_set, process_set_id
from nezha.torch import mpi_ops
from nezha.torch.compression import Compression


def _waited(start, *args, **kwargs):
    """The result of ``start`` (an mpi_ops *_async function) waited for at once: the submission
    leads the engine's loop meanwhile (NEZHA_LEAD_US)."""
    return synchronize(started_by_waiter(start, *args, **kwargs))


def _grad_name(name, suffix="grad"):
    return None if name is None else "%s.%s" % (name, suffix)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.name, ctx.process_set = op, name, process_set
        ctx.scale = (prescale_factor, postscale_factor)
        if mpi_ops.is_plain_cpu(tensor, process_set):
            result = mpi_ops.reduce_plain_now(tensor, torch.empty_like(tensor), op, name,
                                              prescale_factor, postscale_factor)
        else:
            result = _waited(
                mpi_ops.allreduce_async, tensor, name=name, op=op, prescale_factor=prescale_factor,
                postscale_factor=postscale_factor, process_set=process_set)
        if op in (Min, Max, Product):
            ctx.save_for_backward(tensor, result)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        pre, post = ctx.scale
        name = _grad_name(ctx.name)
        if ctx.op in (Sum, Average):
            grad = allreduce(grad_output, name=name, op=ctx.op, prescale_factor=pre,
                             postscale_factor=post, process_set=ctx.process_set)
        else:
            tensor, result = ctx.saved_tensors
            grad = _selected_grad(ctx.op, allreduce(grad_output, name=name, op=Sum,
                                                    process_set=ctx.process_set), tensor, result)
        return grad, None, None, None, None, None


def _selected_grad(op, summed, tensor, result):
    """Min/Max/Product: the derivative of the reduction at this rank's input, given the summed
    gradient of its output."""
    if op == Product:
        return summed * result / tensor
    return summed * (tensor == result).to(summed.dtype)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces `tensor` over all ranks (of the process set) into a new tensor (differentiable)."""
    process_set_id(process_set)
    op = resolve_op(op, average)
    compressed, cctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, op, name, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, cctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.name, ctx.scale = op, name, (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        results = tuple(_waited(
            mpi_ops.grouped_allreduce_async,
            tensors, name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set))
        if op not in (Sum, Average):
            ctx.save_for_backward(*tensors, *results)
        return results

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = [g.contiguous() for g in grad_outputs]
        if ctx.op in (Sum, Average):
            grads = _waited(
                mpi_ops.grouped_allreduce_async,
                grads, name=_grad_name(ctx.name), op=ctx.op, prescale_factor=ctx.scale[0],
                postscale_factor=ctx.scale[1], process_set=ctx.process_set)
        else:
            saved = ctx.saved_tensors
            count = len(grads)
            summed = _waited(
                mpi_ops.grouped_allreduce_async,
                grads, name=_grad_name(ctx.name), op=Sum, process_set=ctx.process_set)
            grads = [_selected_grad(ctx.op, s, t, r)
                     for s, t, r in zip(summed, saved[:count], saved[count:])]
        return (None, None, None, None, None) + tuple(grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one operation; returns a list of new tensors."""
    process_set_id(process_set)
    op = resolve_op(op, average)
    compressed, cctxs = compress_all(compression, tensors)
    reduced = _GroupedAllreduce.apply(op, name, prescale_factor, postscale_factor, process_set,
                                      *compressed)
    return decompress_all(compression, reduced, cctxs)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.name, ctx.process_set = (tensor.shape[0] if tensor.dim() else 1), name, process_set
        return _waited(mpi_ops.allgather_async, tensor, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        ps = ctx.process_set
        grad = allreduce(grad_output, name=_grad_name(ctx.name), op=Average, process_set=ps)
        rows = torch.tensor([ctx.rows], dtype=torch.int64)
        all_rows = _waited(mpi_ops.allgather_async, rows, name=_grad_name(ctx.name, "rows"),
                           process_set=ps)
        offset = int(all_rows[:ps.rank()].sum())
        return grad.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along dim 0 (differentiable)."""
    process_set_id(process_set)
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.name, ctx.process_set = name, process_set
        return tuple(_waited(mpi_ops.grouped_allgather_async, list(tensors), name=name,
                             process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        ps = ctx.process_set
        grads = _waited(
            mpi_ops.grouped_allreduce_async,
            [g.contiguous() for g in grad_outputs], name=_grad_name(ctx.name), op=Average,
            process_set=ps)
        # Every rank's rows of every tensor, [ranks, tensors]: where this rank's rows start.
        rows = torch.tensor([ctx.rows], dtype=torch.int64)
        all_rows = _waited(mpi_ops.allgather_async, rows, name=_grad_name(ctx.name, "rows"),
                           process_set=ps)
        offsets = all_rows[:ps.rank()].sum(dim=0)
        return (None, None) + tuple(g.narrow(0, int(o), r)
                                    for g, o, r in zip(grads, offsets, ctx.rows))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one operation (differentiable); returns a list."""
    process_set_id(process_set)
    tensors = list(tensors)
    if not tensors:
        return []
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.name, ctx.process_set = root_rank, name, process_set
        return _waited(mpi_ops.broadcast_async, tensor, root_rank, name=name,
                       process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, name=_grad_name(ctx.name), op=Average,
                         process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank as a new tensor (differentiable)."""
    process_set_id(process_set)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = _waited(mpi_ops.alltoall_async, tensor, splits=splits, name=name,
                                          process_set=process_set)
        ctx.received_splits, ctx.name, ctx.process_set = received_splits, name, process_set
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, _unused):
        grad, _ = _waited(
            mpi_ops.alltoall_async,
            grad_output.contiguous(), splits=ctx.received_splits, name=_grad_name(ctx.name),
            process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends `splits[r]` rows to rank r (differentiable). Returns the gathered rows, and also the
    received splits when `splits` was given (as Horovod does)."""
    process_set_id(process_set)
    output, received_splits = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received_splits)


def _reducescatter_grad_factor(op, prescale_factor, postscale_factor, process_set):
    """What Horovod multiplies a reducescatter's incoming gradient by before allgathering it."""
    factor = process_set.size() if op == Sum else 1
    return factor * prescale_factor * postscale_factor


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, name, prescale_factor, postscale_factor, process_set):
        if op not in (Sum, Average):
            raise NotImplementedError("reducescatter is differentiable only for Sum and Average; "
                                      "use reducescatter_async for %s" % op)
        ctx.name, ctx.process_set = name, process_set
        ctx.factor = _reducescatter_grad_factor(op, prescale_factor, postscale_factor, process_set)
        return _waited(
            mpi_ops.reducescatter_async, tensor, name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = grad_output * ctx.factor if ctx.factor != 1 else grad_output
        grad = _waited(mpi_ops.allgather_async, grad.contiguous(), name=_grad_name(ctx.name),
                       process_set=ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over all ranks; rank r gets block r of dim 0 (differentiable)."""
    process_set_id(process_set)
    mpi_ops.check_scatterable(tensor, "reducescatter")
    op = resolve_op(op, None)
    compressed, cctx = compression.compress(tensor)
    reduced = _Reducescatter.apply(compressed, op, name, prescale_factor, postscale_factor,
                                   process_set)
    return compression.decompress(reduced, cctx)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, name, prescale_factor, postscale_factor, process_set, *tensors):
        if op not in (Sum, Average):
            raise NotImplementedError("grouped_reducescatter is differentiable only for Sum and "
                                      "Average; use grouped_reducescatter_async for %s" % op)
        ctx.name, ctx.process_set = name, process_set
        ctx.factor = _reducescatter_grad_factor(op, prescale_factor, postscale_factor, process_set)
        return tuple(_waited(
            mpi_ops.grouped_reducescatter_async,
            list(tensors), name=name, op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = [(g * ctx.factor if ctx.factor != 1 else g).contiguous() for g in grad_outputs]
        gathered = _waited(mpi_ops.grouped_allgather_async, grads, name=_grad_name(ctx.name),
                           process_set=ctx.process_set)
        return (None, None, None, None, None) + tuple(gathered)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters each tensor of a list as one operation (differentiable); returns a list."""
    process_set_id(process_set)
    tensors = list(tensors)
    for t in tensors:
        mpi_ops.check_scatterable(t, "grouped_reducescatter")
    op = resolve_op(op, None)
    compressed, cctxs = compress_all(compression, tensors)
    reduced = _GroupedReducescatter.apply(op, name, prescale_factor, postscale_factor, process_set,
                                          *compressed)
    return decompress_all(compression, reduced, cctxs)
