"""Nezha: multi-rail, Horovod-style data-parallel training.

One native engine stripes every collective across all of a cluster's network rails, balanced by
each rail's measured cost. Use it directly on numpy arrays (this module), or through the adapters
``nezha.torch``, ``nezha.tensorflow`` and ``nezha.jax``.
"""
from . import _core
from ._core import NezhaError
from .basics import (NotInitializedError, cross_rank, cross_size, engine_stats, init, is_initialized,
                     local_rank, local_size, rail_stats, rank, shutdown, size)
from .handle import Handle, poll, synchronize
from .objects import allgather_object, broadcast_object
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .ops import (Average, Max, Min, Product, ReduceOp, Sum, allgather, allgather_async,
                  allreduce, allreduce_async, alltoall, alltoall_async, barrier, barrier_async, broadcast,
                  broadcast_async, grouped_allgather, grouped_allgather_async,
                  grouped_allreduce, grouped_allreduce_async, grouped_reducescatter,
                  grouped_reducescatter_async, join, reducescatter, reducescatter_async)

DataType = _core.DataType
Device = _core.Device

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "engine_stats", "rail_stats", "NezhaError", "NotInitializedError", "Handle",
    "ReduceOp", "DataType", "Device", "Sum", "Average", "Min", "Max", "Product",
    "allreduce", "allreduce_async", "grouped_allreduce", "grouped_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_async", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "barrier", "barrier_async", "join", "poll", "synchronize",
    "broadcast_object", "allgather_object",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
]
