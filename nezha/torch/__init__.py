"""`import nezha.torch as hvd`: Horovod's PyTorch API on the Nezha engine.

A thin adapter: tensors go to the framework-agnostic `nezha` API without copies where the device
allows (see _buffers), and Horovod's semantics are kept (names, signatures, gradient conventions,
DistributedOptimizer behaviour). No communication logic lives here.
"""

from nezha.torch.basics import (
    Adasum, Average, HorovodInternalError, Max, Min, NezhaError, ProcessSet, Product, Sum,
    add_process_set, ccl_built, cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
    gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, remove_process_set,
    rocm_built, shutdown, size, start_timeline, stop_timeline)
from nezha.torch.autograd_ops import (
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, reducescatter)
from nezha.torch.mpi_ops import (
    allgather_async, allreduce_, allreduce_async, allreduce_async_, alltoall_async, barrier,
    broadcast_, broadcast_async, broadcast_async_, grouped_allgather_async, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter_async, join,
    reducescatter_async, sparse_allreduce_async)
from nezha.torch.handles import poll, synchronize
from nezha.torch.compression import Compression
from nezha.torch.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from nezha.torch.optimizer import DistributedOptimizer
from nezha.torch.sync_batch_norm import SyncBatchNorm
from nezha.torch import elastic

__all__ = [name for name in dir() if not name.startswith("_")]
