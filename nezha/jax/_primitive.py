"""One JAX primitive for every nezha collective inside a traced computation.

``collective_p`` lowers to a side-effecting XLA FFI custom call, ``nezha_collective``, compiled into
``nezha._core`` (bindings/jax_ffi.cc, and jax_ffi_cuda.cc for CUDA buffers) when the build found
jaxlib's FFI headers and jit compiles for the CPU or CUDA (on other backends the io_callback below
serves): XLA never drops or merges it. The CPU handler is asynchronous and submits each collective
to the engine as XLA reaches it: the engine matches collectives across ranks by name, so ranks may
reach a program's independent collectives in different orders. The CUDA handler stages through
host memory and blocks in stream order, so there every rank must reach them in the same order (as
with NCCL). No JAX effect is needed (an ordered effect would take every call
off JAX's fast C++ dispatch path, ~0.3 ms each here). Without the handlers, ``run_collective`` goes
through an ordered ``io_callback`` into the numpy API instead (slower: the callback holds the GIL,
copies, and must be ordered because it blocks).

Parameters (all static): ``kind`` (an OpType name), ``name`` (the engine's tensor name, the same on
every rank), ``reduce_op``, ``prescale``, ``postscale``, ``root`` (the broadcast root, a job rank),
``process_set`` (the set's id; 0: every rank).
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import Any, List, Sequence

import numpy as np

import jax
from jax.experimental import io_callback
from jax._src import core as jax_core
from jax._src import dispatch, xla_bridge
from jax._src.interpreters import batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lib.mlir import ir

from .. import _core, basics, ops, process_sets

_FFI_TARGET = "nezha_collective"


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
    cuda_targets = getattr(_core, "jax_ffi_cuda_targets", None)
    if cuda_targets is not None:  # loads nothing: the handler opens the CUDA driver when first run
        for target, capsule in cuda_targets().items():
            jax.ffi.register_ffi_target(target, capsule, platform="CUDA", api_version=1)
    return True


@functools.lru_cache(maxsize=None)
def _warn_fallback() -> None:
    warnings.warn("nezha.jax: nezha._core was built without jaxlib's XLA FFI headers; collectives "
                  "inside jax.jit use an ordered io_callback (holds the GIL, copies each buffer). "
                  "Reinstall nezha with jax present to get the FFI path.", RuntimeWarning,
                  stacklevel=3)


# The platforms the FFI handlers serve: the CPU (XLA's buffers handed to the engine) and CUDA (device
# buffers staged through page-locked host memory on XLA's stream, bindings/jax_ffi_cuda.cc).
# Elsewhere (rocm, tpu) collectives inside jit go through the io_callback: JAX copies each buffer
# to the host and back.
FFI_BACKENDS = ("cpu", "cuda")


def jit_platform() -> str:
    """The platform jax.jit compiles for, as lowering rules name it: jax.default_backend() says
    "gpu" for CUDA and ROCm alike."""
    return xla_bridge.canonicalize_platform(jax.default_backend())


@functools.lru_cache(maxsize=None)
def _warn_accelerator() -> None:
    warnings.warn(f"nezha.jax: jax.jit compiles for {jit_platform()!r} here; collectives "
                  "inside jit go through an io_callback (device -> host -> device copies). "
                  f"The FFI path serves {', '.join(FFI_BACKENDS)} only.", RuntimeWarning, stacklevel=3)


def set_place(process_set: int):
    """(ranks taking part, this rank's index among them) for process set id `process_set`."""
    ps = process_sets.by_id(process_set)
    return ps.size(), ps.rank()


def output_avals(kind: str, avals: Sequence[Any], process_set: int = 0) -> List[jax_core.ShapedArray]:
    """Result shapes, known at trace time: inside jit every rank passes the same shapes."""
    n, r = set_place(process_set)
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


def _abstract_eval(*avals, kind, name, reduce_op, prescale, postscale, root, process_set):
    return output_avals(kind, avals, process_set)


collective_p.def_abstract_eval(_abstract_eval)


def _never_dead(used_outputs, eqn):
    """JAX drops equations whose results are unused and that have no effect; a collective must
    still run (its peers wait for it), so it is kept whenever the computation around it is."""
    return [True] * len(eqn.invars), eqn


pe.dce_rules[collective_p] = _never_dead


def _i32(v: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), int(v))


def _lowering(ctx, *args, kind, name, reduce_op, prescale, postscale, root, process_set):
    result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    if kind == "alltoall":
        root = set_place(process_set)[0]  # the handler splits dim 0 into this many equal parts
    f64 = ir.F64Type.get()
    call = mlir.custom_call(
        _FFI_TARGET, result_types=result_types, operands=list(args), api_version=4,
        has_side_effect=True,
        backend_config={"kind": _i32(int(getattr(ops.OpType, kind))),
                        "name": ir.StringAttr.get(name), "reduce_op": _i32(int(reduce_op)),
                        "prescale": ir.FloatAttr.get(f64, prescale),
                        "postscale": ir.FloatAttr.get(f64, postscale), "root": _i32(root),
                        "process_set": _i32(process_set)})
    return list(call.results)


for _platform in FFI_BACKENDS:
    mlir.register_lowering(collective_p, _lowering, platform=_platform)


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


def _backstop_s() -> float:
    """How long a callback waits at most: as the FFI handler, twice NEZHA_TIMEOUT_S plus 5 s (the
    engine fails a dead peer's operation sooner; this bounds one a peer never submits)."""
    default = dict((k[0], k[1]) for k in _core.knobs())["NEZHA_TIMEOUT_S"]
    return 2 * float(os.environ.get("NEZHA_TIMEOUT_S") or default) + 5


def _host_collective(kind: str, name: str, reduce_op: Any, prescale: float, postscale: float,
                     root: int, process_set: int, *arrays: np.ndarray) -> List[np.ndarray]:
    """The io_callback fallback's body: the numpy API, with the traced call's name. It blocks (the
    callbacks are ordered), so every rank must reach these collectives in the same order."""
    arrays = [np.asarray(a) for a in arrays]
    ps = process_sets.by_id(process_set)
    led = ops.started_by_waiter  # the callback waits at once: the submission leads the loop
    if kind == "allreduce":
        handle = led(ops.grouped_allreduce_async, arrays, reduce_op, name, prescale, postscale,
                     process_set=ps)
    elif kind == "broadcast":
        handle = ops.Handle.gather(ops.started_together_by_waiter(
            [functools.partial(ops.broadcast_async, a, root, name=f"{name}.{i}", process_set=ps)
             for i, a in enumerate(arrays)]))
    elif kind == "allgather":
        handle = led(ops.allgather_async, arrays[0], name=name, process_set=ps).then(lambda y: [y])
    elif kind == "reducescatter":
        handle = led(ops.reducescatter_async, arrays[0], reduce_op, name, prescale, postscale,
                     process_set=ps).then(lambda y: [y])
    elif kind == "alltoall":
        handle = led(ops.alltoall_async, arrays[0], name=name, process_set=ps).then(
            lambda y: [y[0]])
    else:
        raise ValueError(f"unknown collective kind {kind!r}")
    return handle.wait(_backstop_s())


def run_collective(kind: str, arrays: Sequence[Any], *, name: str, reduce_op: Any = ops.Sum,
                   prescale: float = 1.0, postscale: float = 1.0, root: int = -1,
                   process_set: int = 0, force_fallback: bool = False) -> List[Any]:
    """Runs one collective on traced arrays (one grouped submission for all of them) among the
    ranks of process set id `process_set` (0: every rank)."""
    params = dict(kind=kind, name=name, reduce_op=ops.ReduceOp(int(reduce_op)),
                  prescale=float(prescale), postscale=float(postscale), root=int(root),
                  process_set=int(process_set))
    backend = jit_platform()
    if ffi_available() and not force_fallback and backend in FFI_BACKENDS:
        return collective_p.bind(*arrays, **params)
    if not force_fallback:
        (_warn_fallback if backend in FFI_BACKENDS else _warn_accelerator)()
    on_cpu = backend == "cpu"
    avals = [jax.typeof(a) for a in arrays]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in output_avals(kind, avals, process_set)]
    callback = functools.partial(_host_collective, kind, name, params["reduce_op"],
                                 params["prescale"], params["postscale"], params["root"],
                                 params["process_set"])
    # Ordered on the CPU, whose runtime may run independent blocking callbacks concurrently. On an
    # accelerator the callbacks of one program run in its stream's order (the same on every rank),
    # and an ordered effect would be worse than useless: once one collective fails (a mismatch), the
    # failed runtime token is handed to every later ordered call, which then fails as well.
    return list(io_callback(callback, shapes, *arrays, ordered=on_cpu))
