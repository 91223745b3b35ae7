"""``ProcessGroupNezha``: a torch.distributed ProcessGroup written in Python over nezha's engine.

A Python subclass of ``torch.distributed.ProcessGroup`` (the route of torch's own
``test_c10d_pypg.py`` and of torchft): torch's C++ callers (DDP's reducer, functional collectives)
reach its methods through torch's trampoline, so nothing is compiled against torch's headers and
one wheel serves every torch that has this interface. Every operation is an engine operation:
negotiated, fused, striped over every rail, failed over when a rail is lost.

The default group is the engine's job. ``new_group(ranks)`` (and so DeviceMesh's sub-groups) is
delegated by torch to the default group on every rank, so its ranks become a nezha process set
registered collectively, with its id agreed on every rank; groups of the same ranks share one set,
and the sets go with the default group (which also shuts the engine down if it started it).
Collectives are named by each group's call count: every rank calls a group's collectives in the
same order, as torch requires.
"""
from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import nezha
from nezha import basics, process_sets
from nezha.handle import Handle
from nezha.ops import started_by_waiter
from nezha.runner.torch_store import client_mode_for_nezharun_store
from nezha.torch.backend.bootstrap import start_engine
from nezha.torch.backend.collectives import Collectives
from nezha.torch.backend.completion import stop_completing
from nezha.torch.backend.launch_env import fill_torch_env
from nezha.torch.backend.p2p import PointToPoint
from nezha.torch.backend.work import NezhaBackendError, NezhaWork

BACKEND_NAME = "nezha"


class ProcessGroupNezha(Collectives, PointToPoint, dist.ProcessGroup):
    """A process group whose collectives run on nezha's engine (module docstring)."""

    def __init__(self, rank: int, size: int, job_ranks: List[int], process_set: Any,
                 timeout: timedelta, prefix: str, default: Optional["ProcessGroupNezha"] = None,
                 owns_engine: bool = False) -> None:
        super().__init__(rank, size)
        self._ranks = list(job_ranks)  # group rank -> job rank
        self._set = process_set
        self._timeout = timeout
        self._prefix = prefix
        self._seq = itertools.count()
        self._p2p_counts = {}
        self._deferred: Optional[List[Tuple[NezhaWork, Callable, Callable, str]]] = None
        self._closed = False
        self._default = default or self
        self._owns_engine = owns_engine
        self._generation = basics._state.generation
        self._group_name, self._group_desc = prefix, ""
        # Kept by the default group: the sub-groups' process sets by ranks.
        self._sets: Dict[Tuple[int, ...], Any] = {}

    # --- identity ---------------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # torch's ProcessGroup keeps its name and description in its backends: a group written in
    # Python has none, so it keeps them itself.
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def name(self) -> str:
        return BACKEND_NAME

    @property
    def ranks(self) -> List[int]:
        """The job ranks of this group's ranks, in group rank order."""
        return list(self._ranks)

    def __repr__(self) -> str:
        return (f"ProcessGroupNezha(rank={self.rank()}, size={self.size()}, "
                f"ranks={self._ranks if self.size() <= 16 else '...'})")

    # --- sub-groups -------------------------------------------------------------------------------

    def new_group(self, ranks: List[int], timeout: Optional[timedelta] = None, pg_options=None,
                  group_name: Optional[str] = None, group_desc: Optional[str] = None):
        """Called by torch on the default group, on every rank, for ``dist.new_group``."""
        if self is not self._default:
            raise RuntimeError("new_group is the default group's")
        ranks = [int(r) for r in ranks]
        if group_name is not None and not str(group_name).isdigit():
            # torch names a group by its count unless use_local_synchronization=True (a hash):
            # then the ranks outside never get here, and a set is registered by every rank.
            raise NotImplementedError("the nezha backend registers every group on every rank: "
                                      "new_group(use_local_synchronization=True) is not supported")
        if ranks != sorted(ranks):
            raise NotImplementedError("the nezha backend orders a group's ranks as the job's: "
                                      "new_group(sort_ranks=False) with unsorted ranks is not "
                                      "supported")
        process_set = self._acquire_set(ranks)
        if self.rank() not in ranks:
            return None
        group = ProcessGroupNezha(ranks.index(self.rank()), len(ranks), ranks, process_set,
                                  timeout or self._timeout, f"tdist.{group_name}", default=self)
        group._set_group_name(group_name)
        if group_desc:
            group._set_group_desc(group_desc)
        return group

    def _acquire_set(self, ranks: List[int]) -> Any:
        """The process set of `ranks`, registered (collectively) the first time a group of them
        is made. It stays until the default group goes: torch destroys a sub-group on its
        members only, so only the default group's end is seen alike on every rank, and the
        table of sets must evolve alike on every rank."""
        if len(ranks) == self.size():
            return process_sets.global_process_set
        key = tuple(ranks)
        if key not in self._sets:
            self._sets[key] = nezha.add_process_set(ranks)  # collective
        return self._sets[key]

    # --- lifecycle --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """torch's destroy_process_group: a sub-group takes no more operations; the default
        group frees every sub-group's process set, and shuts the engine down if it started it."""
        if self._closed:
            return
        self._closed = True
        if self is not self._default:
            return
        if self._current():
            for process_set in self._sets.values():
                process_sets.forget_process_set(process_set)
            if self._owns_engine:
                nezha.shutdown()  # completes what is in flight (failed, if a peer is gone)
        self._sets.clear()
        stop_completing("the default process group was destroyed before it finished")

    def abort(self) -> None:
        self.shutdown()

    def _current(self) -> bool:
        """True while the engine this group was made on still runs."""
        return nezha.is_initialized() and basics._state.generation == self._generation

    # --- running operations -----------------------------------------------------------------------

    def _run(self, kind: str, start: Callable[[str], Handle], finish: Callable[[Any], List],
             opts: Any, sequenced: bool = True) -> NezhaWork:
        """Submits an operation (start(name) -> Handle) and returns its work, which completes
        with finish(the handle's result) as outputs. Between start_coalescing and end_coalescing
        the submission waits for end_coalescing."""
        if self._closed or not self._current():
            raise NezhaBackendError(f"{kind} on {self!r}: the process group has been destroyed")
        name = f"{self._prefix}.{kind}.{next(self._seq)}" if sequenced else f"{self._prefix}.{kind}"
        work = NezhaWork(f"{kind} '{name}' of {self!r}", self._timeout_s(opts))
        if self._deferred is not None:
            work.coalescing = True
            self._deferred.append((work, start, finish, name))
            return work
        if getattr(opts, "asyncOp", True) is False:
            # torch says the caller waits at once (`dist.all_reduce(t)`, async_op=False: it calls
            # wait() before it returns): the submission leads the engine's loop, as a synchronous
            # nezha call does, and the waiter completes the work on its own thread.
            return work.start(started_by_waiter(start, name), finish, waited_at_once=True)
        return work.start(start(name), finish)

    def _done(self, outputs: List[torch.Tensor]) -> NezhaWork:
        return NezhaWork("an empty operation", 0).finish_now(outputs)

    def _timeout_s(self, opts: Any) -> float:
        own = getattr(opts, "timeout", None)
        if isinstance(own, timedelta) and own.total_seconds() > 0:
            return own.total_seconds()
        return self._timeout.total_seconds()

    def _one_tensor(self, tensors: List[torch.Tensor], what: str) -> None:
        if len(tensors) != 1:
            raise ValueError(f"{what}: the nezha backend takes one tensor per call (one device per "
                             f"process), got {len(tensors)}")

    def _job_rank(self, group_rank: int, what: str) -> int:
        if not 0 <= int(group_rank) < self.size():
            raise ValueError(f"{what} {group_rank} is not a rank of {self!r}")
        return self._ranks[int(group_rank)]

    # --- coalescing -------------------------------------------------------------------------------

    def start_coalescing(self, device: Any = None) -> None:
        """Operations until end_coalescing are submitted together there: negotiated in one round,
        fused where they can be."""
        if self._deferred is not None:
            raise ValueError(f"{self!r} is coalescing already")
        self._deferred = []

    def end_coalescing(self, device: Any = None) -> NezhaWork:
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            raise ValueError(f"end_coalescing on {self!r} without start_coalescing")
        if not deferred:
            return self._done([])
        for work, *_ in deferred:
            work.coalescing = False
        handles = [start(name) for _, start, _, name in deferred]

        def finish(results):
            outputs = []
            for (work, _, deliver, _), result in zip(deferred, results):
                outputs.extend(work.finish_now(deliver(result))._outputs)
            return outputs

        group = NezhaWork(f"{len(deferred)} coalesced operations of {self!r}",
                          max(w._timeout_s for w, *_ in deferred))
        return group.start(Handle.gather(handles), finish, members=[w for w, *_ in deferred])

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing


def create_process_group(store: dist.Store, rank: int, size: int,
                         timeout: timedelta) -> ProcessGroupNezha:
    """torch.distributed's creator for the default group (and for groups torch creates without
    delegating to ``new_group``)."""
    default = dist.GroupMember.WORLD if dist.is_initialized() else None
    if isinstance(default, ProcessGroupNezha) and default._current():
        # A group torch made through the helper rather than new_group: the whole job only.
        if size != default.size():
            raise NotImplementedError("the nezha backend makes sub-groups through new_group")
        return ProcessGroupNezha(rank, size, list(range(size)), process_sets.global_process_set,
                                 timeout, f"tdist.world{next(_extra_worlds)}", default=default)
    owns = start_engine(store, rank, size, timeout)
    return ProcessGroupNezha(rank, size, list(range(size)), process_sets.global_process_set,
                             timeout, "tdist.world", owns_engine=owns)


_extra_worlds = itertools.count(1)


def register() -> None:
    """Registers the backend "nezha" for CPU and CUDA tensors, and fills in torch's env://
    variables under an MPI or Slurm launch (launch_env.py). Idempotent."""
    fill_torch_env()
    client_mode_for_nezharun_store()
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group,
                                      devices=["cpu", "cuda"])
