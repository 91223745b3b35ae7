"""State synchronisation helpers: parameters, optimizer state and picklable objects."""

import io
import pickle

import torch

from nezha import objects
from nezha.basics import rank
from nezha.handle import synchronize
from nezha.process_sets import global_process_set
from nezha.torch import mpi_ops


def broadcast_parameters(params, root_rank, prefix=None):
    """Overwrites every rank's tensors with root_rank's, in place.

    `params` is a `state_dict()`, an iterable of (name, tensor) such as `named_parameters()`, or
    (as in Horovod) a list of tensors. Names key the broadcasts, so the order of named `params`
    does not need to match across ranks; unnamed tensors are matched by position, as Horovod does.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
        if any(len(item) != 2 for item in items):
            raise ValueError("broadcast_parameters expects a state_dict, (name, tensor) pairs or "
                             "a list of tensors")
    else:
        raise ValueError("invalid params of type: %s" % type(params))
    base = "broadcast_parameters" if prefix is None else prefix
    handles = [mpi_ops.broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                        root_rank,
                                        name="%s.%s" % (base, name if name is not None else i))
               for i, (name, p) in enumerate(items) if p is not None]
    for handle in handles:
        synchronize(handle)


class _TensorSlot:
    """Stands in for one tensor of an optimizer state_dict while its structure is broadcast."""

    __slots__ = ("index", "shape", "dtype")

    def __init__(self, index, shape, dtype):
        self.index, self.shape, self.dtype = index, shape, dtype


def _split_tensors(obj, tensors):
    """Returns `obj` with every tensor replaced by a _TensorSlot; the tensors go to `tensors`."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return {k: _split_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split_tensors(v, tensors) for v in obj)
    return obj


def _join_tensors(obj, tensors):
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join_tensors(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, model=None, prefix=None):
    """Makes every rank's optimizer state (hyper-parameters, moments, step counts) root_rank's.

    Ranks whose state is still empty (no step taken yet) receive it too: the state's structure is
    broadcast as a small pickled skeleton, then its tensors are broadcast in place, without pickling.
    As in Horovod, a rank whose state is empty first gives every trainable parameter without a
    gradient a zero one (sparse for SparseAdam, and for SGD on `model`'s sparse embeddings), so code
    that reads or broadcasts `p.grad` afterwards finds a tensor; parameters that do not require a
    gradient keep `grad is None`. Unlike Horovod, no dummy optimizer step is taken: parameters are
    not touched and the state is exactly root_rank's.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state:
        _give_missing_grads(optimizer, model)
    base = "broadcast_optimizer_state" if prefix is None else prefix
    local_tensors = []
    skeleton = _split_tensors(optimizer.state_dict(), local_tensors)
    skeleton = broadcast_object(skeleton if rank() == root_rank else None, root_rank,
                                name=base + ".skeleton")
    slots = []
    _collect_slots(skeleton, slots)
    slots.sort(key=lambda s: s.index)
    if rank() == root_rank:
        tensors = local_tensors
    else:
        tensors = [torch.empty(s.shape, dtype=s.dtype) for s in slots]
    handles = [mpi_ops.broadcast_async_(t, root_rank, name="%s.%d" % (base, i))
               for i, t in enumerate(tensors)]
    for handle in handles:
        synchronize(handle)
    optimizer.load_state_dict(_join_tensors(skeleton, tensors))


def _give_missing_grads(optimizer, model):
    sparse_ids = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse_ids.update(id(p) for p in m.parameters())
    sparse_optimizer = isinstance(optimizer, torch.optim.SparseAdam)
    sgd = isinstance(optimizer, torch.optim.SGD)
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                grad = torch.zeros_like(p)
                if p.dim() and (sparse_optimizer or (sgd and id(p) in sparse_ids)):
                    grad = grad.to_sparse(1)  # by rows, as an embedding's gradient
                p.grad = grad


def _collect_slots(obj, slots):
    if isinstance(obj, _TensorSlot):
        slots.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, slots)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, slots)


def _torch_dumps(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    return buffer.getvalue()


def _torch_loads(data):
    return torch.load(io.BytesIO(data), weights_only=False)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` on every rank (nezha.broadcast_object, serialized by torch.save)."""
    return objects.broadcast_object(obj, root_rank, name, process_set, dumps=_torch_dumps,
                                    loads=_torch_loads)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj`, in rank order (serialized by torch.save)."""
    return objects.allgather_object(obj, name, process_set, dumps=_torch_dumps,
                                    loads=_torch_loads)
