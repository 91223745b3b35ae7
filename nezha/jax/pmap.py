"""``nezha.jax.pmap``: a multi-process replacement for ``jax.pmap`` / a data-parallel ``shard_map``.

``pmap(fn, axis_name)(*args)`` maps ``fn`` over dim 0 of every argument: this process's local
shards. Inside ``fn``, ``psum``, ``pmean``, ``pmax``, ``pmin``, ``all_gather`` and ``axis_index``
named by ``axis_name`` reduce over the local shards with JAX's own collectives (under ``vmap``) and
then across processes through nezha's engine, on every rail. The whole step is one ``jax.jit``
program. With one local shard (a CPU process, the usual layout under nezharun) ``fn`` runs on it
directly. The shards of one process run in that process's one jit program (vmapped on its default
device); spread them over devices with JAX's sharding if needed.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Dict, Hashable

import jax

from .. import basics
from . import collectives

_bound_axes: Dict[Hashable, int] = {}  # axis name -> local shard count, while tracing a pmap


@contextlib.contextmanager
def _bind_axis(axis_name: Hashable, local: int):
    if axis_name in _bound_axes:
        raise ValueError(f"nezha.jax.pmap: axis name {axis_name!r} is already bound by an "
                         "enclosing pmap")
    _bound_axes[axis_name] = local
    try:
        yield
    finally:
        del _bound_axes[axis_name]


def _local_count(axis_name: Hashable, what: str) -> int:
    if axis_name not in _bound_axes:
        raise NameError(f"nezha.jax.{what}: unbound axis name {axis_name!r}; call it inside a "
                        f"function mapped by nezha.jax.pmap(..., axis_name={axis_name!r})")
    return _bound_axes[axis_name]


def pmap(fn: Callable, axis_name: Hashable = "batch", donate_argnums=()) -> Callable:
    """Maps ``fn`` over dim 0 of its (pytree) arguments across this process's shards, with
    collectives by ``axis_name`` spanning every process. Returns outputs stacked on dim 0."""

    @functools.lru_cache(maxsize=None)
    def compiled(local: int):
        def step(*args):
            with _bind_axis(axis_name, local):
                if local == 1:
                    out = fn(*jax.tree_util.tree_map(lambda x: x[0], args))
                    return jax.tree_util.tree_map(lambda y: y[None], out)
                return jax.vmap(fn, axis_name=axis_name)(*args)
        return jax.jit(step, donate_argnums=donate_argnums)

    @functools.wraps(fn)
    def mapped(*args):
        sizes = {jax.numpy.shape(x)[0] if jax.numpy.ndim(x) else None
                 for x in jax.tree_util.tree_leaves(args)}
        if len(sizes) != 1 or None in sizes:
            raise ValueError("nezha.jax.pmap: every argument needs the same leading dimension "
                             f"(this process's shards); got {sorted(sizes, key=str)}")
        return compiled(sizes.pop())(*args)

    return mapped


def _local_then_global(x: Any, axis_name: Hashable, what: str, lax_fn, op) -> Any:
    local = _local_count(axis_name, what)
    y = lax_fn(x, axis_name) if local > 1 else x
    return collectives.allreduce(y, op=op)


def psum(x: Any, axis_name: Hashable) -> Any:
    """Sum over every shard of every process (x may be a pytree)."""
    return _local_then_global(x, axis_name, "psum", jax.lax.psum, collectives.Sum)


def pmean(x: Any, axis_name: Hashable) -> Any:
    """Mean over every shard of every process."""
    return _local_then_global(x, axis_name, "pmean", jax.lax.pmean, collectives.Average)


def pmax(x: Any, axis_name: Hashable) -> Any:
    """Maximum over every shard of every process."""
    return _local_then_global(x, axis_name, "pmax", jax.lax.pmax, collectives.Max)


def pmin(x: Any, axis_name: Hashable) -> Any:
    """Minimum over every shard of every process."""
    return _local_then_global(x, axis_name, "pmin", jax.lax.pmin, collectives.Min)


def all_gather(x: Any, axis_name: Hashable) -> Any:
    """Every shard's x stacked on a new dim 0 in global shard order (process rank, then local)."""
    local = _local_count(axis_name, "all_gather")
    stacked = (jax.lax.all_gather(x, axis_name) if local > 1
               else jax.tree_util.tree_map(lambda v: v[None], x))
    return collectives.allgather(stacked)


def axis_index(axis_name: Hashable) -> Any:
    """This shard's global index: rank * local shards + local index."""
    local = _local_count(axis_name, "axis_index")
    offset = basics.rank() * local
    return offset + jax.lax.axis_index(axis_name) if local > 1 else jax.numpy.int32(offset)
