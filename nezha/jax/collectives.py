"""nezha's collectives on jax arrays and whole pytrees, eager and inside ``jax.jit``.

Eager calls on concrete arrays go straight to the numpy API (one grouped submission per pytree).
Traced calls (inside jit, grad, scan, cond) bind the side-effecting ``collective_p`` primitive, lowered to
an XLA FFI custom call into the engine (or the io_callback fallback). Differentiation follows
Horovod's conventions, as nezha.torch does (nezha/torch/autograd_ops.py): allreduce Sum/Average
allreduce the cotangent with the same op and scale factors; allgather and broadcast average it over
ranks, then keep this rank's rows / only the root's; reducescatter allgathers it (times size for
Sum); alltoall sends it back.

Names inside a trace are deterministic per call site: ``jax.<kind>.<file>:<line>.<n>``, n counting
that site's traces, so every rank that traces the same program in the same order agrees on them.
Pass ``name=`` for names that do not depend on trace order.
"""
from __future__ import annotations

import collections
import functools
import os
import sys
from typing import Any, List, NamedTuple, Optional

import numpy as np

import jax
import jax.numpy as jnp

from .. import basics, ops
from ..compression import Compression, compress_all, decompress_all
from ..process_sets import global_process_set, process_set_id
from ._primitive import run_collective, set_place

Sum, Average, Min, Max, Product = ops.Sum, ops.Average, ops.Min, ops.Max, ops.Product
_HERE = os.path.dirname(os.path.abspath(__file__))
_site_counts: collections.Counter = collections.Counter()


def _is_traced(leaves: List[Any]) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in leaves)


def _trace_name(kind: str, name: Optional[str]) -> str:
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        return name
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE:
        frame = frame.f_back
    site = "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    key = (kind, site)
    _site_counts[key] += 1
    return f"jax.{kind}.{site}.{_site_counts[key]}"


class _Params(NamedTuple):
    kind: str
    name: str
    reduce_op: Any = Sum
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = -1
    process_set: int = 0  # the set's engine id; its members run the collective (and its gradient)


def _run(p: _Params, xs, force_fallback: bool = False):
    return run_collective(p.kind, xs, name=p.name, reduce_op=p.reduce_op, prescale=p.prescale,
                          postscale=p.postscale, root=p.root, process_set=p.process_set,
                          force_fallback=force_fallback)


def _grad_params(p: _Params, kind: str, op=Sum, prescale=1.0, postscale=1.0) -> _Params:
    return _Params(kind, p.name + ".grad", op, prescale, postscale, -1, p.process_set)


# --- differentiable traced collectives (custom_vjp, Horovod's gradients) -----------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _allreduce_t(p: _Params, fallback: bool, xs):
    return _run(p, xs, fallback)


def _allreduce_fwd(p, fallback, xs):
    ys = _run(p, xs, fallback)
    return ys, (xs, ys)


def _allreduce_bwd(p, fallback, res, cts):
    xs, ys = res
    if p.reduce_op in (Sum, Average):
        return (_run(_grad_params(p, "allreduce", p.reduce_op, p.prescale, p.postscale), cts,
                     fallback),)
    summed = _run(_grad_params(p, "allreduce"), cts, fallback)
    if p.reduce_op in (Min, Max):  # the summed gradient flows where this rank's input was chosen
        return ([g * (x == y).astype(g.dtype) for g, x, y in zip(summed, xs, ys)],)
    return ([g * y / x for g, x, y in zip(summed, xs, ys)],)  # Product


_allreduce_t.defvjp(_allreduce_fwd, _allreduce_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _broadcast_t(p, fallback, xs):
    return _run(p, xs, fallback)


def _broadcast_bwd(p, fallback, _res, cts):
    avg = _run(_grad_params(p, "allreduce", Average), cts, fallback)
    # Masked rather than replaced by zeros: every rank's program must keep the allreduce.
    keep = 1.0 if basics.rank() == p.root else 0.0
    return ([g * jnp.asarray(keep, g.dtype) for g in avg],)


_broadcast_t.defvjp(lambda p, f, xs: (_run(p, xs, f), None), _broadcast_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _allgather_t(p, fallback, xs):
    return _run(p, xs, fallback)


def _allgather_bwd(p, fallback, shape, cts):
    (avg,) = _run(_grad_params(p, "allreduce", Average), cts, fallback)
    rows = shape[0] if shape else 1
    mine = jax.lax.dynamic_slice_in_dim(avg, set_place(p.process_set)[1] * rows, rows, 0)
    return ([mine.reshape(shape)],)


_allgather_t.defvjp(lambda p, f, xs: (_run(p, xs, f), xs[0].shape), _allgather_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _reducescatter_t(p, fallback, xs):
    return _run(p, xs, fallback)


def _reducescatter_bwd(p, fallback, shape, cts):
    n = set_place(p.process_set)[0]
    scale = (n if p.reduce_op == Sum else 1.0) * p.prescale * p.postscale
    (g,) = cts
    # Blocks differ by a row when dim 0 does not divide evenly: pad to the largest, gather, trim.
    rows = shape[0] if shape else 1
    big = -(-rows // n)
    padded = jnp.pad(g * scale, [(0, big - g.shape[0])] + [(0, 0)] * (g.ndim - 1))
    (gathered,) = _run(_grad_params(p, "allgather"), [padded], fallback)
    blocks = [gathered[r * big: r * big + rows // n + (1 if r < rows % n else 0)] for r in range(n)]
    return ([jnp.concatenate(blocks).reshape(shape)],)


_reducescatter_t.defvjp(lambda p, f, xs: (_run(p, xs, f), xs[0].shape), _reducescatter_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _alltoall_t(p, fallback, xs):
    return _run(p, xs, fallback)


_alltoall_t.defvjp(lambda p, f, xs: (_run(p, xs, f), None),
                   lambda p, f, _r, cts: (_run(_grad_params(p, "alltoall"), cts, f),))


# --- public API --------------------------------------------------------------------------------

def _fallback_forced() -> bool:
    return os.environ.get("NEZHA_JAX_FORCE_CALLBACK", "") not in ("", "0")


def _to_numpy(x: Any) -> np.ndarray:
    return np.asarray(x)


def grouped_allreduce(tensors: Any, op: Any = Average, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, name: Optional[str] = None,
                      compression: Any = None, process_set: Any = global_process_set) -> Any:
    """Allreduces every array of ``tensors`` (a list or any pytree) as one grouped submission, so
    the engine fuses them; returns the same structure. Eager or inside ``jax.jit``; among the ranks
    of ``process_set`` (on a rank outside it: ValueError)."""
    op = ops._check_op(op)
    set_id = process_set_id(process_set)
    compression = compression or Compression.none
    leaves, tree = jax.tree_util.tree_flatten(tensors)
    if not leaves:
        return tensors
    sent, ctxs = compress_all(compression, [jnp.asarray(x) for x in leaves])
    if _is_traced(sent):
        p = _Params("allreduce", _trace_name("allreduce", name), op, float(prescale_factor),
                    float(postscale_factor), -1, set_id)
        out = _allreduce_t(p, _fallback_forced(), list(sent))
    else:
        out = [jnp.asarray(r) for r in ops.grouped_allreduce(
            [_to_numpy(x) for x in sent], op, name, prescale_factor, postscale_factor,
            process_set=process_set)]
    return jax.tree_util.tree_unflatten(tree, decompress_all(compression, out, ctxs))


def allreduce(tensor: Any, op: Any = Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None,
              compression: Any = None, process_set: Any = global_process_set) -> Any:
    """Allreduces an array, or every array of a pytree (one grouped submission)."""
    return grouped_allreduce(tensor, op, prescale_factor, postscale_factor, name, compression,
                             process_set)


def broadcast(tensor: Any, root_rank: int = 0, name: Optional[str] = None,
              process_set: Any = global_process_set) -> Any:
    """Returns ``root_rank``'s array (or pytree of arrays) on every rank (of ``process_set``;
    ``root_rank`` is a rank of the job, in the set)."""
    set_id = process_set_id(process_set)
    n = basics.size()
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= int(root_rank) < n:
        raise ValueError(f"root_rank {root_rank!r} is out of range for {n} ranks")
    if set_id and int(root_rank) not in process_set.ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set!r}")
    leaves, tree = jax.tree_util.tree_flatten(tensor)
    if not leaves:
        return tensor
    leaves = [jnp.asarray(x) for x in leaves]
    if _is_traced(leaves):
        p = _Params("broadcast", _trace_name("broadcast", name), Sum, 1.0, 1.0, int(root_rank), set_id)
        out = _broadcast_t(p, _fallback_forced(), leaves)
    else:
        base = ops._auto_name("broadcast", name, set_id)
        handles = ops.started_together_by_waiter(
            [functools.partial(ops.broadcast_async, _to_numpy(x), int(root_rank),
                               name=f"{base}.{i}", process_set=process_set)
             for i, x in enumerate(leaves)])
        out = [jnp.asarray(h.wait()) for h in handles]
    return jax.tree_util.tree_unflatten(tree, out)


def _per_leaf(kind: str, traced_fn, eager_fn, tensor: Any, name: Optional[str], **params) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(tensor)
    leaves = [jnp.asarray(x) for x in leaves]
    out = []
    for i, x in enumerate(leaves):
        leaf_name = None if name is None else (name if len(leaves) == 1 else f"{name}.{i}")
        if _is_traced([x]):
            p = _Params(kind, _trace_name(kind, leaf_name), **params)
            (y,) = traced_fn(p, _fallback_forced(), [x])
        else:
            y = jnp.asarray(eager_fn(_to_numpy(x), leaf_name))
        out.append(y)
    return jax.tree_util.tree_unflatten(tree, out)


def allgather(tensor: Any, name: Optional[str] = None, process_set: Any = global_process_set) -> Any:
    """Concatenates every rank's array along dim 0 (per leaf of a pytree). Inside jit every rank
    must pass the same shape; eagerly dim 0 may differ."""
    set_id = process_set_id(process_set)
    return _per_leaf("allgather", _allgather_t, lambda x, n: ops.allgather(x, n, process_set), tensor,
                     name, process_set=set_id)


def reducescatter(tensor: Any, op: Any = Average, name: Optional[str] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: Any = global_process_set) -> Any:
    """Reduces across ranks and returns this rank's block of dim 0 (lower ranks get the extra
    rows), per leaf of a pytree."""
    op = ops._check_op(op)
    set_id = process_set_id(process_set)
    return _per_leaf("reducescatter", _reducescatter_t,
                     lambda x, n: ops.reducescatter(x, op, n, prescale_factor, postscale_factor,
                                                    process_set),
                     tensor, name, reduce_op=op, prescale=float(prescale_factor),
                     postscale=float(postscale_factor), process_set=set_id)


def alltoall(tensor: Any, name: Optional[str] = None, process_set: Any = global_process_set) -> Any:
    """Sends equal parts of dim 0 to each rank (of ``process_set``: part k to its k-th member) and
    returns the received parts concatenated in rank order, per leaf. (Uneven splits: nezha.alltoall
    on numpy arrays.)"""
    set_id = process_set_id(process_set)
    n = set_place(set_id)[0]
    for x in jax.tree_util.tree_leaves(tensor):
        if np.ndim(x) == 0 or np.shape(x)[0] % n:
            raise ValueError(f"alltoall needs dim 0 divisible by the number of ranks ({n}); got "
                             f"shape {np.shape(x)}")
    return _per_leaf("alltoall", _alltoall_t,
                     lambda x, nm: ops.alltoall(x, name=nm, process_set=process_set)[0], tensor, name,
                     process_set=set_id)


def barrier(process_set: Any = global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has reached it. Eager only: inside jit,
    collectives are already ordered and synchronising."""
    ops.barrier(process_set=process_set)
