"""`import nezha.torch as hvd`: Horovod's PyTorch API on the Nezha engine.

A thin adapter: tensors go to the framework-agnostic `nezha` API without copies where the device
allows (see _buffers), and Horovod's semantics are kept (names, signatures, gradient conventions,
DistributedOptimizer behaviour). What does not touch torch (handles, process sets, build probes,
compression, gradient bookkeeping, object collectives, elastic state) is nezha's, shared by every
adapter; this package holds only what does. No communication logic lives here.
"""

from nezha import (
    NezhaError, cross_rank, cross_size, is_initialized, local_rank, local_size, rank, shutdown,
    size)
from nezha.handle import poll, synchronize
from nezha.horovod_api import (
    Adasum, Average, HorovodInternalError, Max, Min, Product, Sum, barrier, ccl_built, cuda_built,
    ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rocm_built, start_timeline, stop_timeline)
from nezha.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from nezha.torch.autograd_ops import (
    allgather, allreduce, alltoall, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, reducescatter)
from nezha.torch.mpi_ops import (
    allgather_async, allreduce_, allreduce_async, allreduce_async_, alltoall_async,
    broadcast_, broadcast_async, broadcast_async_, grouped_allgather_async, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter_async, join,
    reducescatter_async, sparse_allreduce_async)
from nezha.torch.compression import Compression
from nezha.torch.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from nezha.torch.optimizer import DistributedOptimizer
from nezha.torch.sync_batch_norm import SyncBatchNorm
from nezha.torch import elastic
from nezha.torch import backend as _backend

_backend.register()  # torch.distributed's backend "nezha"

__all__ = [name for name in dir() if not name.startswith("_")]
