"""nezha for JAX: collectives on arrays and pytrees (eager and inside ``jax.jit``), a multi-process
``pmap``, and an optax ``DistributedOptimizer``.

Inside ``jit`` each collective is an asynchronous, side-effecting XLA FFI custom call into nezha's
engine (zero-copy on CPU buffers; ranks matched by name); ``ffi_available()`` says whether this
build has it, else an ordered ``io_callback`` is used (a warning says so once). See docs/jax.md.
"""
try:
    import jax as _jax  # noqa: F401
except ImportError as error:  # nezha itself never needs jax
    raise ImportError("nezha.jax needs jax: pip install 'nezha[jax]' (jax, jaxlib, optax, "
                      "flax)") from error

from ..basics import (cross_rank, cross_size, is_initialized, local_rank, local_size, rank,
                      shutdown, size)
from ..basics import init as _init
from ..compression import Compression
from ..handle import NezhaError
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ._primitive import ffi_available
from .collectives import (Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier,
                          broadcast, grouped_allreduce, reducescatter)
from .pmap import all_gather, axis_index, pmap, pmax, pmean, pmin, psum

from .broadcasts import (allgather_object, broadcast_object, broadcast_optimizer_state,
                         broadcast_parameters)

try:
    from .optimizer import DistributedOptimizer, allreduce_gradients
except ImportError as _optax_missing:  # optax is needed only by the optimizer
    def _needs_optax(*args, _error=_optax_missing, **kwargs):
        raise ImportError(str(_error))
    DistributedOptimizer = allreduce_gradients = _needs_optax


def init(rails=None, timeout_s=None, process_sets=None) -> None:
    """Joins the job (as ``nezha.init``), registers the XLA FFI handlers with jax, then registers
    ``process_sets`` (ProcessSets or lists of ranks, the same on every rank) in order."""
    _init(rails=rails, timeout_s=timeout_s)
    ffi_available()
    for process_set in process_sets or ():
        add_process_set(process_set)


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank",
    "cross_size", "NezhaError", "Compression", "Sum", "Average", "Min", "Max", "Product",
    "allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
    "barrier", "ffi_available", "pmap", "psum", "pmean", "pmax", "pmin", "all_gather",
    "axis_index", "DistributedOptimizer", "allreduce_gradients", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set",
]
