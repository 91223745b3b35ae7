"""One JAX primitive for every nezha collective inside a traced computation.

``collective_p`` carries an ordered effect: JAX threads a token through every call in program order,
so XLA never drops (dead-code eliminates), merges (CSE) or reorders them, and every rank issues its
collectives in the same order. Lowered to the XLA FFI handler ``nezha_collective`` compiled into
``nezha._core`` (bindings/jax_ffi.cc) when the build found jaxlib's FFI headers; otherwise
``run_collective`` goes through an ordered ``io_callback`` into the numpy API instead (slower: the
callback holds the GIL and copies).

Parameters (all static): ``kind`` (an OpType name), ``name`` (the engine's tensor name, the same on
every rank), ``reduce_op``, ``prescale``, ``postscale``, ``root`` (the broadcast root).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, List, Sequence

import numpy as np

import jax
from jax.experimental import io_callback
from jax._src import core as jax_core
from jax._src import dispatch, effects
from jax._src.interpreters import batching, mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

from .. import _core, basics, ops

_FFI_TARGET = "nezha_collective"


class NezhaCollectiveEffect(effects.Effect):
    """Ordered: collectives run in program order on every rank."""

    def __str__(self) -> str:
        return "NezhaCollective"


collective_effect = NezhaCollectiveEffect()
effects.lowerable_effects.add_type(NezhaCollectiveEffect)
effects.ordered_effects.add_type(NezhaCollectiveEffect)
effects.control_flow_allowed_effects.add_type(NezhaCollectiveEffect)
effects.custom_derivatives_allowed_effects.add_type(NezhaCollectiveEffect)

collective_p = jax_core.Primitive("nezha_collective")
collective_p.multiple_results = True
collective_p.def_impl(functools.partial(dispatch.apply_primitive, collective_p))


@functools.lru_cache(maxsize=None)
def ffi_available() -> bool:
    """True when nezha._core was built with the XLA FFI handlers (and they are registered)."""
    targets = getattr(_core, "jax_ffi_targets", None)
    if targets is None:
        return False
    for target, capsule in targets().items():
        jax.ffi.register_ffi_target(target, capsule, platform="cpu", api_version=1)
    return True


@functools.lru_cache(maxsize=None)
def _warn_fallback() -> None:
    warnings.warn("nezha.jax: nezha._core was built without jaxlib's XLA FFI headers; collectives "
                  "inside jax.jit use an ordered io_callback (holds the GIL, copies each buffer). "
                  "Reinstall nezha with jax present to get the FFI path.", RuntimeWarning,
                  stacklevel=3)


def output_avals(kind: str, avals: Sequence[Any]) -> List[jax_core.ShapedArray]:
    """Result shapes, known at trace time: inside jit every rank passes the same shapes."""
    n, r = basics.size(), basics.rank()
    out = []
    for a in avals:
        shape = tuple(a.shape)
        if kind == "allgather":
            shape = (n * (shape[0] if shape else 1),) + shape[1:]
        elif kind == "reducescatter":
            rows = shape[0] if shape else 1
            shape = (rows // n + (1 if r < rows % n else 0),) + shape[1:]
        out.append(jax_core.ShapedArray(shape, a.dtype))
    return out


def _abstract_eval(*avals, kind, name, reduce_op, prescale, postscale, root):
    return output_avals(kind, avals), {collective_effect}


collective_p.def_effectful_abstract_eval(_abstract_eval)


def _i32(v: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), int(v))


def _lowering(ctx, *args, kind, name, reduce_op, prescale, postscale, root):
    token = ctx.tokens_in.get(collective_effect)
    result_types = [hlo.TokenType.get()] + [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    if kind == "alltoall":
        root = basics.size()  # the handler splits dim 0 into this many equal parts
    f64 = ir.F64Type.get()
    call = mlir.custom_call(
        _FFI_TARGET, result_types=result_types, operands=[token, *args], api_version=4,
        has_side_effect=True,
        backend_config={"kind": _i32(int(getattr(ops.OpType, kind))),
                        "name": ir.StringAttr.get(name), "reduce_op": _i32(int(reduce_op)),
                        "prescale": ir.FloatAttr.get(f64, prescale),
                        "postscale": ir.FloatAttr.get(f64, postscale), "root": _i32(root)})
    results = list(call.results)
    ctx.set_tokens_out(mlir.TokenSet({collective_effect: results[0]}))
    return results[1:]


mlir.register_lowering(collective_p, _lowering, platform="cpu")


def _batching(args, dims, *, kind, **params):
    """Under vmap (nezha.jax.pmap's local shards): elementwise collectives run on the stacked
    arrays; allgather gathers along dim 0 with the batch moved to dim 1."""
    if kind in ("allreduce", "broadcast"):
        return collective_p.bind(*args, kind=kind, **params), list(dims)
    if kind == "allgather":
        moved = [batching.moveaxis(a, d, 1) if d is not batching.not_mapped else a
                 for a, d in zip(args, dims)]
        if any(d is batching.not_mapped or np.ndim(a) < 2 for a, d in zip(moved, dims)):
            raise NotImplementedError("nezha.jax: allgather under vmap needs batched arrays of rank >= 1")
        return collective_p.bind(*moved, kind=kind, **params), [1] * len(args)
    raise NotImplementedError(f"nezha.jax: {kind} cannot run under vmap / nezha.jax.pmap's local "
                              "shards; call it outside the mapped function")


batching.primitive_batchers[collective_p] = _batching


def _host_collective(kind: str, name: str, reduce_op: Any, prescale: float, postscale: float,
                     root: int, *arrays: np.ndarray) -> List[np.ndarray]:
    """The io_callback fallback's body: the numpy API, with the traced call's name."""
    arrays = [np.asarray(a) for a in arrays]
    if kind == "allreduce":
        return ops.grouped_allreduce(arrays, reduce_op, name, prescale, postscale)
    if kind == "broadcast":
        return [ops.broadcast(a, root, name=f"{name}.{i}") for i, a in enumerate(arrays)]
    if kind == "allgather":
        return [ops.allgather(arrays[0], name=name)]
    if kind == "reducescatter":
        return [ops.reducescatter(arrays[0], reduce_op, name, prescale, postscale)]
    if kind == "alltoall":
        return [ops.alltoall(arrays[0], name=name)[0]]
    if kind == "barrier":
        h = basics._engine().submit(ops.OpType.barrier, name)
        ops.Handle([h], lambda: None, [name]).wait()
        return []
    raise ValueError(f"unknown collective kind {kind!r}")


def run_collective(kind: str, arrays: Sequence[Any], *, name: str, reduce_op: Any = ops.Sum,
                   prescale: float = 1.0, postscale: float = 1.0, root: int = -1,
                   force_fallback: bool = False) -> List[Any]:
    """Runs one collective on traced arrays (one grouped submission for all of them)."""
    params = dict(kind=kind, name=name, reduce_op=ops.ReduceOp(int(reduce_op)),
                  prescale=float(prescale), postscale=float(postscale), root=int(root))
    if ffi_available() and not force_fallback:
        return collective_p.bind(*arrays, **params)
    if not force_fallback:
        _warn_fallback()
    avals = [jax.typeof(a) for a in arrays]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in output_avals(kind, avals)]
    callback = functools.partial(_host_collective, kind, name, params["reduce_op"],
                                 params["prescale"], params["postscale"], params["root"])
    return list(io_callback(callback, shapes, *arrays, ordered=True))
