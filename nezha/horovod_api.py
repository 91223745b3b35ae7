"""Horovod's top-level names that do not depend on a framework, which every adapter re-exports:
reduction ops with the `op`/`average` convention and Adasum, `init(comm, process_sets)`,
`barrier(process_set)`, `HorovodInternalError`, `is_homogeneous`, the build probes and the timeline
calls.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from . import basics, ops
from ._core import NezhaError
from .ops import Average, Max, Min, Product, ReduceOp, Sum
from .process_sets import add_process_set, global_process_set

# Horovod scripts catch this name around collectives.
HorovodInternalError = NezhaError


class _AdasumOp:
    """Placeholder so that `hvd.Adasum` exists; every op that receives it raises."""

    def __repr__(self) -> str:
        return "Adasum"


Adasum = _AdasumOp()


def resolve_op(op: Any, average: Optional[bool], default: Optional[ReduceOp] = None) -> ReduceOp:
    """Horovod's `op`/`average` pair -> a ReduceOp; Adasum is refused with a clear message."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average; pass only one of them.")
    if op is None:
        if average is None:
            op = Average if default is None else default
        else:
            op = Average if average else Sum
    if op is Adasum:
        raise NotImplementedError(
            "Adasum is not implemented by Nezha; use op=hvd.Average or hvd.Sum.")
    return op


def init(comm: Any = None, process_sets: Optional[Iterable[Any]] = None,
         **nezha_options: Any) -> None:
    """Horovod's `init(comm=None, process_sets=None)`: joins the job (`nezha.init`, which also takes
    `nezha_options`); `comm` (an MPI communicator) is not supported; `process_sets` (ProcessSets
    or lists of ranks, the same on every rank) are registered in order."""
    if comm is not None:
        raise NotImplementedError("init(comm=...): Nezha does not use MPI; start the job with "
                                  "nezharun")
    basics.init(**nezha_options)
    for process_set in process_sets or ():
        add_process_set(process_set)


def barrier(process_set: Any = global_process_set) -> None:
    """Horovod's `barrier(process_set)`: returns when every rank (of the set) has called it."""
    ops.barrier(process_set=process_set)


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks.

    Decided locally (no communication, so one rank may call it alone): with homogeneous hosts every
    rank sees size == local_size * cross_size; with uneven hosts the ranks of the smaller hosts do
    not.
    """
    return basics.size() == basics.local_size() * basics.cross_size()


# Build probes, answered truthfully: Nezha's core is one CPU library with its own transports. It
# links neither MPI, Gloo, NCCL, DDL, CCL nor CUDA; adapters stage device tensors through host
# memory, which is not what `cuda_built()` promises (device-side collectives).
def mpi_built(verbose: bool = False) -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def gloo_built(verbose: bool = False) -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def nccl_built(verbose: bool = False) -> int:
    return 0


def ddl_built(verbose: bool = False) -> bool:
    return False


def ccl_built(verbose: bool = False) -> bool:
    return False


def cuda_built(verbose: bool = False) -> bool:
    return False


def rocm_built(verbose: bool = False) -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """The engine writes a timeline only when started with one; it cannot start one at run time."""
    raise NotImplementedError(
        "This Nezha engine writes a timeline only when started with NEZHA_TIMELINE=<file> "
        "('{rank}' in it becomes the rank) or nezharun --timeline FILE; it cannot be started at "
        "run time.")


def stop_timeline() -> None:
    """The timeline ends at shutdown(); it cannot be stopped at run time."""
    raise NotImplementedError(
        "This Nezha engine cannot stop its timeline at run time; it ends at shutdown().")


__all__ = ["Sum", "Average", "Min", "Max", "Product", "Adasum", "HorovodInternalError",
           "resolve_op", "init", "barrier", "is_homogeneous", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built", "ddl_built",
           "ccl_built", "cuda_built", "rocm_built", "start_timeline", "stop_timeline"]
