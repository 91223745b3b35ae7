"""Collectives on numpy arrays and any buffer-protocol or DLPack object, sync and async.

Every collective is identified across ranks by its ``name``. Without a name, one is generated from
a per-process counter per operation type (and process set), so ranks must then call unnamed
collectives in the same order (as with Horovod). Each takes ``process_set=`` (process_sets.py): the
collective then runs among that set's ranks only. The ``*_async`` forms also take ``device=``
(``Device.cpu`` or ``Device.gpu``): where an adapter's tensor lives, as Horovod tells CPU from GPU.
The ranks must agree (else ``NezhaError`` on every rank), and a GPU's float16 is scaled in half
precision, as Horovod's GPU kernels scale it (a CPU's in float32).
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import _core
from ._buffers import as_array, present
from .basics import _engine, _state, size
from .handle import _WAIT_SLICE_S, Handle
from .process_sets import global_process_set, process_set_id

ReduceOp = _core.ReduceOp
OpType = _core.OpType
Device = _core.Device
Sum, Average, Min, Max, Product = (ReduceOp.Sum, ReduceOp.Average, ReduceOp.Min, ReduceOp.Max,
                                   ReduceOp.Product)

_counters: dict = {}  # (operation type, process set id) -> count of unnamed calls


def _auto_name(kind: str, name: Optional[str], set_id: int = 0) -> str:
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        return name
    # Per process set: only a set's members call its collectives, so one count per set keeps every
    # member's names in step. Set ids restart with every init(), so do their counts.
    key = (kind, set_id, _state.generation if set_id else 0)
    counter = _counters.setdefault(key, itertools.count())
    return f"{kind}.noname.{next(counter)}"


# Set while a synchronous function submits: its caller waits at once, so the submission leads the
# engine's loop on this thread meanwhile (NEZHA_LEAD_US; engine.h point 5), with no wake-up of the
# loop thread on a small operation's latency.
_sync_call = threading.local()


def _submit(*args, **kwargs):
    return _engine().submit(*args, lead=getattr(_sync_call, "on", False), **kwargs)


def _submit_group(*args, **kwargs):
    return _engine().submit_group(*args, lead=getattr(_sync_call, "on", False), **kwargs)


def started_by_waiter(start, *args, **kwargs):
    """``start(*args, **kwargs)`` (an *_async function, here or in an adapter) for a caller that
    waits for the handle at once: the submission leads the engine's loop meanwhile."""
    before = getattr(_sync_call, "on", False)
    _sync_call.on = True
    try:
        return start(*args, **kwargs)
    finally:
        _sync_call.on = before


def started_together_by_waiter(starts: Sequence[Callable[[], Handle]]) -> List[Handle]:
    """Runs the submissions ``starts`` (no-argument callables) in order for a caller that waits for
    all of them at once: only the last leads the engine's loop, so the others are negotiated (and
    fused) with it rather than one round trip each."""
    handles = [start() for start in starts[:-1]]
    if starts:
        handles.append(started_by_waiter(starts[-1]))
    return handles


def _set_size(set_id: int) -> int:
    return size() if set_id == 0 else len(_engine().process_set_ranks(set_id))


def _check_op(op: Any) -> ReduceOp:
    if not isinstance(op, ReduceOp):
        raise ValueError(f"op must be one of nezha.Sum, Average, Min, Max, Product; got {op!r}")
    return op


def _output_like(arr: np.ndarray, out: Any, what: str) -> np.ndarray:
    if out is None:
        return np.empty_like(arr)
    out_arr, _ = as_array(out, what)
    if out_arr.shape != arr.shape or out_arr.dtype != arr.dtype:
        raise ValueError(f"{what} has shape {out_arr.shape} and dtype {out_arr.dtype}; "
                         f"expected {arr.shape} and {arr.dtype}")
    if not out_arr.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return out_arr


def _engine_output(h: Any, like: np.ndarray) -> np.ndarray:
    flat = h.take_output()
    return flat.view(like.dtype).reshape(h.output_shape)


# --- allreduce --------------------------------------------------------------------------------

def allreduce_async(tensor: Any, op: ReduceOp = Average, name: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    out: Any = None, process_set: Any = global_process_set,
                    device: Device = Device.cpu) -> Handle:
    """Starts an allreduce; ``wait()`` returns the reduced array (``out`` if given; ``out`` may
    be ``tensor`` itself for an in-place reduction)."""
    op = _check_op(op)
    set_id = process_set_id(process_set)
    name = _auto_name("allreduce", name, set_id)
    arr, dtype = as_array(tensor)
    result = _output_like(arr, out, "out")
    h = _submit(OpType.allreduce, name, arr, result, dtype, op,
                float(prescale_factor), float(postscale_factor), process_set=set_id,
                device=device)
    return Handle([h], lambda: present(result, dtype), [name])


def allreduce(tensor: Any, op: ReduceOp = Average, name: Optional[str] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, out: Any = None,
              process_set: Any = global_process_set):
    """Reduces ``tensor`` elementwise across all ranks (default: average) and returns the result
    on every rank, bit-identical everywhere."""
    if (type(tensor) is np.ndarray and process_set is global_process_set
            and tensor.flags.c_contiguous and tensor.dtype.kind != "V"
            and (out is None or (type(out) is np.ndarray and out.shape == tensor.shape
                                 and out.dtype == tensor.dtype and out.flags.c_contiguous
                                 and out.flags.writeable))):
        return _allreduce_now(tensor, out, _check_op(op), _auto_name("allreduce", name),
                              float(prescale_factor), float(postscale_factor))
    return started_by_waiter(allreduce_async, tensor, op, name, prescale_factor, postscale_factor,
                             out, process_set).wait()


def _allreduce_now(arr: np.ndarray, out: Optional[np.ndarray], op: ReduceOp, name: str,
                   prescale: float, postscale: float) -> np.ndarray:
    """allreduce() of a plain contiguous numpy array (into a matching one, or itself, if given)
    over every rank: what allreduce_async() and Handle.wait() do for it, without their layers. A
    small operation's whole time is a few tens of microseconds, and with more ranks than cores
    every rank's interpreter time is on its path."""
    result = np.empty_like(arr) if out is None else out
    h = _engine().submit(OpType.allreduce, name, arr, result, None, op, prescale, postscale,
                         process_set=0, lead=True)
    while not h.wait(_WAIT_SLICE_S):  # in slices, so Ctrl-C reaches Python promptly
        pass
    if h.error:
        raise _core.NezhaError(h.error)
    return result


def grouped_allreduce_async(tensors: Sequence[Any], op: ReduceOp = Average,
                            name: Optional[str] = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0,
                            outs: Optional[Sequence[Any]] = None,
                            process_set: Any = global_process_set,
                            device: Device = Device.cpu) -> Handle:
    """Starts an allreduce of several tensors negotiated as one unit; ``wait()`` returns a list."""
    op = _check_op(op)
    set_id = process_set_id(process_set)
    tensors = list(tensors)
    if outs is not None and len(outs) != len(tensors):
        raise ValueError(f"got {len(outs)} outputs for {len(tensors)} tensors")
    group = _auto_name("grouped_allreduce", name, set_id)
    # Every member is converted and checked before any is submitted, and the engine queues them as
    # one unit: a bad member never leaves the others in flight waiting for it.
    arrays, dtypes, results, names = [], [], [], []
    for i, t in enumerate(tensors):
        arr, dtype = as_array(t, f"tensors[{i}]")
        arrays.append(arr)
        dtypes.append(dtype)
        results.append(_output_like(arr, None if outs is None else outs[i], f"outs[{i}]"))
        names.append(f"{group}.{i}")
    handles = _submit_group(OpType.allreduce, group, names, arrays, results, dtypes, op,
                            float(prescale_factor), float(postscale_factor),
                            process_set=set_id, device=device)
    presented = [present(r, d) for r, d in zip(results, dtypes)]
    return Handle(handles, lambda: presented, names)


def grouped_allreduce(tensors: Sequence[Any], op: ReduceOp = Average, name: Optional[str] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      outs: Optional[Sequence[Any]] = None,
                      process_set: Any = global_process_set) -> List[np.ndarray]:
    """Allreduce of several tensors as one unit (fused together); returns a list of results."""
    return started_by_waiter(grouped_allreduce_async, tensors, op, name, prescale_factor,
                             postscale_factor, outs, process_set).wait()


# --- allgather, broadcast, alltoall, reducescatter --------------------------------------------

def allgather_async(tensor: Any, name: Optional[str] = None,
                    process_set: Any = global_process_set,
                    device: Device = Device.cpu) -> Handle:
    """Starts an allgather; ``wait()`` returns the ranks' tensors concatenated along dim 0."""
    set_id = process_set_id(process_set)
    name = _auto_name("allgather", name, set_id)
    arr, dtype = as_array(tensor)
    src = arr.reshape(1) if arr.ndim == 0 else arr
    h = _submit(OpType.allgather, name, src, None, dtype, process_set=set_id, device=device)
    return Handle([h], lambda: present(_engine_output(h, src), dtype), [name])


def allgather(tensor: Any, name: Optional[str] = None,
              process_set: Any = global_process_set) -> np.ndarray:
    """Concatenates every rank's tensor along the first dimension (which may differ per rank)."""
    return started_by_waiter(allgather_async, tensor, name, process_set).wait()


def broadcast_async(tensor: Any, root_rank: int, name: Optional[str] = None,
                    out: Any = None, process_set: Any = global_process_set,
                    device: Device = Device.cpu) -> Handle:
    """Starts a broadcast from ``root_rank`` (a rank of the job, in the process set if one is
    given); ``wait()`` returns the root's tensor."""
    set_id = process_set_id(process_set)
    name = _auto_name("broadcast", name, set_id)
    n = size()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= int(root_rank) < n:
        raise ValueError(f"root_rank {root_rank!r} is out of range for {n} ranks")
    if set_id and int(root_rank) not in process_set.ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set!r}")
    arr, dtype = as_array(tensor)
    result = _output_like(arr, out, "out")
    h = _submit(OpType.broadcast, name, arr, result, dtype, Sum, 1.0, 1.0,
                int(root_rank), process_set=set_id, device=device)
    return Handle([h], lambda: present(result, dtype), [name])


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None, out: Any = None,
              process_set: Any = global_process_set):
    """Copies ``root_rank``'s tensor to every rank and returns it."""
    return started_by_waiter(broadcast_async, tensor, root_rank, name, out, process_set).wait()


def alltoall_async(tensor: Any, splits: Optional[Sequence[int]] = None,
                   name: Optional[str] = None, process_set: Any = global_process_set,
                   device: Device = Device.cpu) -> Handle:
    """Starts an alltoall; ``wait()`` returns ``(output, received_splits)``. In a process set,
    ``splits`` has one entry per member, in rank order."""
    set_id = process_set_id(process_set)
    name = _auto_name("alltoall", name, set_id)
    arr, dtype = as_array(tensor)
    if arr.ndim == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    n = _set_size(set_id)
    rows = arr.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall without splits needs dim 0 ({rows}) divisible by the "
                             f"number of ranks ({n})")
        splits = [rows // n] * n
    splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    if len(splits) != n:
        raise ValueError(f"splits has {len(splits)} entries; expected one per rank ({n})")
    if any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"splits {splits} must be non-negative and sum to dim 0 ({rows})")
    h = _submit(OpType.alltoall, name, arr, None, dtype, Sum, 1.0, 1.0, -1, splits,
                process_set=set_id, device=device)
    return Handle([h], lambda: (present(_engine_output(h, arr), dtype),
                                np.asarray(h.received_splits, np.int64)),
                  [name])


def alltoall(tensor: Any, splits: Optional[Sequence[int]] = None,
             name: Optional[str] = None,
             process_set: Any = global_process_set) -> Tuple[np.ndarray, np.ndarray]:
    """Sends ``splits[r]`` rows of dim 0 to rank r (equal parts by default) and returns
    ``(received rows concatenated in rank order, rows received from each rank)``."""
    return started_by_waiter(alltoall_async, tensor, splits, name, process_set).wait()


def reducescatter_async(tensor: Any, op: ReduceOp = Average, name: Optional[str] = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                        process_set: Any = global_process_set,
                        device: Device = Device.cpu) -> Handle:
    """Starts a reducescatter; ``wait()`` returns this rank's block of the reduction."""
    op = _check_op(op)
    set_id = process_set_id(process_set)
    name = _auto_name("reducescatter", name, set_id)
    arr, dtype = as_array(tensor)
    src = arr.reshape(1) if arr.ndim == 0 else arr
    h = _submit(OpType.reducescatter, name, src, None, dtype, op,
                float(prescale_factor), float(postscale_factor), process_set=set_id,
                device=device)
    return Handle([h], lambda: present(_engine_output(h, src), dtype), [name])


def reducescatter(tensor: Any, op: ReduceOp = Average, name: Optional[str] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: Any = global_process_set) -> np.ndarray:
    """Reduces across ranks and returns this rank's block of dim 0 (split as evenly as possible;
    lower ranks get the extra rows)."""
    return started_by_waiter(reducescatter_async, tensor, op, name, prescale_factor,
                             postscale_factor, process_set).wait()


def _group_members(tensors: Sequence[Any], group: str):
    """Every member converted and checked before any is submitted: a bad one leaves none in
    flight. A 0-d member is taken as one row, as the single-tensor calls take it."""
    srcs, dtypes, names = [], [], []
    for i, t in enumerate(tensors):
        arr, dtype = as_array(t, f"tensors[{i}]")
        srcs.append(arr.reshape(1) if arr.ndim == 0 else arr)
        dtypes.append(dtype)
        names.append(f"{group}.{i}")
    return srcs, dtypes, names


def grouped_allgather_async(tensors: Sequence[Any], name: Optional[str] = None,
                            process_set: Any = global_process_set,
                            device: Device = Device.cpu) -> Handle:
    """Starts an allgather of several tensors negotiated as one unit (fused into one operation on
    the rails where they fit the fusion threshold); ``wait()`` returns a list."""
    set_id = process_set_id(process_set)
    group = _auto_name("grouped_allgather", name, set_id)
    srcs, dtypes, names = _group_members(list(tensors), group)
    handles = _submit_group(OpType.allgather, group, names, srcs, [None] * len(srcs),
                            dtypes, process_set=set_id, device=device)
    return Handle(handles, lambda: [present(_engine_output(h, s), d)
                                    for h, s, d in zip(handles, srcs, dtypes)], names)


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: Any = global_process_set) -> List[np.ndarray]:
    """Allgather of several tensors as one unit; returns a list of gathered tensors."""
    return started_by_waiter(grouped_allgather_async, tensors, name, process_set).wait()


def grouped_reducescatter_async(tensors: Sequence[Any], op: ReduceOp = Average,
                                name: Optional[str] = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0,
                                process_set: Any = global_process_set,
                                device: Device = Device.cpu) -> Handle:
    """Starts a reducescatter of several tensors negotiated as one unit (fused into one operation
    on the rails where they fit the fusion threshold); ``wait()`` returns a list of this rank's
    blocks."""
    op = _check_op(op)
    set_id = process_set_id(process_set)
    group = _auto_name("grouped_reducescatter", name, set_id)
    srcs, dtypes, names = _group_members(list(tensors), group)
    handles = _submit_group(OpType.reducescatter, group, names, srcs, [None] * len(srcs),
                            dtypes, op, float(prescale_factor), float(postscale_factor),
                            process_set=set_id, device=device)
    return Handle(handles, lambda: [present(_engine_output(h, s), d)
                                    for h, s, d in zip(handles, srcs, dtypes)], names)


def grouped_reducescatter(tensors: Sequence[Any], op: ReduceOp = Average,
                          name: Optional[str] = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          process_set: Any = global_process_set) -> List[np.ndarray]:
    """Reducescatter of several tensors as one unit; returns a list of this rank's blocks."""
    return started_by_waiter(grouped_reducescatter_async, tensors, op, name, prescale_factor,
                             postscale_factor, process_set).wait()


# --- synchronisation --------------------------------------------------------------------------

def barrier_async(name: Optional[str] = None, process_set: Any = global_process_set) -> Handle:
    """Starts a barrier; ``wait()`` returns once every rank (of the process set, if given) has
    started it."""
    set_id = process_set_id(process_set)
    name = _auto_name("barrier", name, set_id)
    h = _submit(OpType.barrier, name, process_set=set_id)
    return Handle([h], lambda: None, [name])


def barrier(timeout_s: Optional[float] = None, process_set: Any = global_process_set) -> None:
    """Returns once every rank (of the process set, if given) has called barrier()."""
    started_by_waiter(barrier_async, None, process_set).wait(timeout_s)


def join(timeout_s: Optional[float] = None) -> int:
    """Declares this rank done: until every rank has joined, it takes part in the others'
    allreduces with zeros. Returns the rank that joined last."""
    h = _engine().submit(OpType.join, "join")
    return Handle([h], lambda: h.last_joined_rank, ["join"]).wait(timeout_s)
