"""`import nezha.tensorflow as hvd`: Horovod's TensorFlow 2 API on the Nezha engine.

Collectives run eagerly and inside tf.function (see _host for how tensors reach the engine) with
Horovod's gradients; `DistributedGradientTape` and `DistributedOptimizer` average a step's
gradients in one fused submission. `nezha.tensorflow.keras` is nezha.keras under Horovod's path.
What does not touch TensorFlow (process sets, build probes, ops, object collectives) is nezha's.
"""
try:
    import tensorflow as _tf  # noqa: F401
except ImportError as _exc:  # a clear message instead of a bare ModuleNotFoundError deep inside
    raise ImportError("nezha.tensorflow needs TensorFlow: pip install 'nezha[tensorflow]' "
                      "(tensorflow-cpu and keras)") from _exc

from nezha import (
    NezhaError, cross_rank, cross_size, is_initialized, local_rank, local_size, rank, shutdown,
    size)
from nezha.horovod_api import (
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, barrier, ccl_built, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rocm_built, start_timeline, stop_timeline)
from nezha.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from nezha.tensorflow.compression import Compression
from nezha.tensorflow.functions import (
    allgather_object, allreduce, broadcast_, broadcast_global_variables, broadcast_object,
    broadcast_object_fn, broadcast_variables, grouped_allreduce, grouped_reducescatter,
    local_rank_op, local_size_op, rank_op, reducescatter, size_op)
from nezha.tensorflow.gradient_tape import (
    DistributedGradientTape, DistributedOptimizer, PartialDistributedGradientTape)
from nezha.tensorflow.mpi_ops import (
    allgather, alltoall, broadcast, grouped_allgather, join)
from nezha.tensorflow.sync_batch_norm import SyncBatchNormalization
from nezha.tensorflow import elastic

__all__ = [name for name in dir() if not name.startswith("_")]
