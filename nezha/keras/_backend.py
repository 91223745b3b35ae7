"""One grouped allreduce of a step's gradients on each Keras backend, traceable where Keras traces
the train step: TensorFlow -> nezha.tensorflow's grouped host call (inside tf.function); torch ->
nezha.torch's grouped allreduce (eager); JAX -> nezha.jax.grouped_allreduce (inside jax.jit).
Compression casts with keras.ops, so one compressor serves every backend."""
import keras
import numpy as np

import nezha
from nezha.compression import CastCompressor, NoneCompressor
from nezha.process_sets import global_process_set


def _cast_dtype(compression):
    """The wire dtype name for a cast compressor (any adapter's fp16/bf16), else None."""
    if compression is None or compression is NoneCompressor or (
            isinstance(compression, type) and issubclass(compression, NoneCompressor)):
        return None
    if isinstance(compression, type) and issubclass(compression, CastCompressor):
        wire = compression.wire_dtype
        name = getattr(wire, "name", None) or str(wire)
        if "bfloat16" in name:
            return "bfloat16"
        if "float16" in name:
            return "float16"
    raise ValueError("nezha.keras supports Compression.none, .fp16 and .bf16; got %r"
                     % (compression,))


def _reduce_raw(grads, op, prescale, postscale, name, process_set=global_process_set):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from nezha.tensorflow import mpi_ops
        return mpi_ops.grouped_allreduce_raw(grads, name, op, prescale, postscale, process_set)
    if backend == "torch":
        import nezha.torch as hvd_torch
        return hvd_torch.grouped_allreduce(grads, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale, name=name,
                                           process_set=process_set)
    if backend == "jax":
        try:
            import nezha.jax as hvd_jax
        except ImportError as exc:
            raise RuntimeError(
                "nezha.keras on the JAX backend needs nezha.jax (its in-jit "
                "grouped_allreduce), which is not importable here: %s" % exc) from exc
        return list(hvd_jax.grouped_allreduce(list(grads), op=op, prescale_factor=prescale,
                                              postscale_factor=postscale, name=name,
                                              compression=None, process_set=process_set))
    raise NotImplementedError("nezha.keras does not support the %r backend" % backend)


def grouped_allreduce(grads, op, prescale, postscale, compression=None, name=None,
                      process_set=global_process_set):
    """`grads` (backend tensors, None kept) reduced over every rank (of the process set), cast
    for the wire."""
    wire = _cast_dtype(compression)
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    sent, dtypes = [], []
    for i in present:
        g = grads[i]
        dtype = keras.backend.standardize_dtype(g.dtype)
        dtypes.append(dtype)
        sent.append(keras.ops.cast(g, wire) if wire and "float" in dtype and dtype != wire
                    else g)
    reduced = _reduce_raw(sent, op, prescale, postscale, name, process_set)
    out = list(grads)
    for i, r, dtype in zip(present, reduced, dtypes):
        out[i] = keras.ops.cast(r, dtype) if keras.backend.standardize_dtype(r.dtype) != dtype \
            else r
    return out


def to_numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def eager_allreduce(value, op, prescale, postscale, name):
    """allreduce of a concrete value (any backend), outside traced code."""
    return nezha.allreduce(np.ascontiguousarray(to_numpy(value)), op=op, name=name,
                           prescale_factor=prescale, postscale_factor=postscale)
