"""`import nezha.keras as hvd`: Horovod's Keras API for Keras 3, on the TensorFlow, torch and JAX
backends (KERAS_BACKEND). `DistributedOptimizer` reduces a step's gradients inside the backend's
traced train step (see optimizer); callbacks run between steps on numpy.
"""
import keras as _keras
import numpy as _np

import nezha as _nezha
from nezha import (
    NezhaError, cross_rank, cross_size, is_initialized, local_rank, local_size, rank, shutdown,
    size)
from nezha.compression import Compression
from nezha.horovod_api import (
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, barrier, ccl_built, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rocm_built, resolve_op)
from nezha.keras import callbacks
from nezha.keras._backend import eager_allreduce, to_numpy
from nezha.keras.callbacks import broadcast_keras_variables
from nezha.keras.optimizer import DistributedOptimizer
from nezha.objects import allgather_object, broadcast_object
from nezha.process_sets import ProcessSet, add_process_set, global_process_set


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """`value` (a backend tensor, numpy array or number) reduced over all ranks, as a backend
    tensor. Eager: for the train step's gradients use DistributedOptimizer."""
    op = resolve_op(op, average)
    array = _np.ascontiguousarray(to_numpy(value))
    sent, ctx = compression.compress(array)
    reduced = _nezha.allreduce(sent, op=op, name=None if name is None else "allreduce." + name,
                               prescale_factor=prescale_factor,
                               postscale_factor=postscale_factor)
    return _keras.ops.convert_to_tensor(compression.decompress(reduced, ctx))


def allgather(value, name=None):
    """Every rank's `value` concatenated along dim 0, as a backend tensor."""
    return _keras.ops.convert_to_tensor(_nezha.allgather(
        _np.ascontiguousarray(to_numpy(value)),
        name=None if name is None else "allgather." + name))


def broadcast(value, root_rank, name=None):
    """root_rank's `value` on every rank, as a backend tensor."""
    return _keras.ops.convert_to_tensor(_nezha.broadcast(
        _np.ascontiguousarray(to_numpy(value)), root_rank,
        name=None if name is None else "broadcast." + name))


def broadcast_variables(variables, root_rank=0):
    """Assigns root_rank's values to the Keras variables `variables`."""
    broadcast_keras_variables(variables, root_rank)


def broadcast_global_variables(root_rank):
    """Horovod's TF1-era call; Keras 3 has no global variable collection."""
    raise NotImplementedError("broadcast_global_variables: Keras 3 has no global variables; use "
                              "broadcast_variables(model.variables, root_rank) or "
                              "callbacks.BroadcastGlobalVariablesCallback")


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """keras.models.load_model, with the saved optimizer wrapped in DistributedOptimizer (its
    state restored)."""
    model = _keras.models.load_model(filepath, custom_objects=custom_objects)
    optimizer = model.optimizer
    if optimizer is None:
        return model
    wrapped = DistributedOptimizer(optimizer, compression=compression)
    if optimizer.built:
        wrapped.build(model.trainable_variables)
        for target, source in zip(wrapped.variables, optimizer.variables):
            target.assign(source.value)
    model.optimizer = wrapped
    return model


__all__ = [n for n in dir() if not n.startswith("_")]
