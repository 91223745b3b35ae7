"""Horovod's process sets, for every adapter: subsets of the job's ranks that run collectives among
themselves. Each set's tensors are negotiated and fused apart from every other set's, and run over
every rail restricted to the set's members (core/src/engine/process_sets.h).

As in Horovod, registering and removing are collective: every rank of the job calls
`add_process_set` with the same ranks in the same order (ranks outside the set too), and
`init(process_sets=[...])` registers a list at start. The ranks then check that they registered the
same set under the same id; a disagreement raises `ValueError` on every rank. A collective given a
set this rank is not in raises `ValueError` naming the set.
"""
from __future__ import annotations

import itertools
from typing import Any, List, Optional

import numpy as np

from . import basics
from .basics import rank, size


class _GlobalProcessSet:
    """Every rank. Accepted wherever Horovod takes `process_set=`."""

    process_set_id = 0

    @property
    def ranks(self) -> List[int]:
        return list(range(size()))

    def size(self) -> int:
        return size()

    def rank(self) -> int:
        return rank()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = _GlobalProcessSet()


class ProcessSet:
    """Horovod's `ProcessSet(ranks)`: a list of ranks (an MPI communicator is refused). It gets its
    id when registered with `add_process_set` (or `init(process_sets=...)`)."""

    def __init__(self, ranks_or_comm: Any) -> None:
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise NotImplementedError("ProcessSet from an MPI communicator: Nezha does not use "
                                      "MPI; pass a list of ranks")
        self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.process_set_id: Optional[int] = None
        self._generation = -1  # the nezha.init() it was registered under

    def _registered(self) -> bool:
        return self.process_set_id is not None and self._generation == basics._state.generation

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set; -1 if it is not a member."""
        return self.ranks.index(rank()) if rank() in self.ranks else -1

    def included(self) -> bool:
        return rank() in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


_registered: List[ProcessSet] = []
_agreements = itertools.count()


def _agree(what: str, mine: List[int]) -> List[List[int]]:
    """Every rank's `mine` (a list of ints), gathered over every rank of the job."""
    from . import ops  # ops imports this module
    row = np.array(mine, np.int64)
    gathered = ops.allgather(row.reshape(1, -1) if row.size else row.reshape(0, 0),
                             name="__nezha_process_sets.%s.%d" % (what, next(_agreements)))
    return [list(map(int, r)) for r in gathered]


def add_process_set(process_set: Any) -> ProcessSet:
    """Registers a process set (a ProcessSet or a list of ranks) on this rank; every rank of the job
    must call it with the same ranks, in the same order. Returns the registered ProcessSet."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set._registered():
        raise ValueError("%r is registered already" % (process_set,))
    for other in [global_process_set, *_live_sets()]:
        if other.ranks == process_set.ranks:
            raise ValueError("a process set of ranks %s exists already: %r" % (process_set.ranks, other))
    engine = basics._engine()
    set_id = engine.add_process_set(process_set.ranks)
    # One fixed-length row per rank: the id, then the set's ranks as a membership mask.
    mask = [1 if r in process_set.ranks else 0 for r in range(size())]
    rows = _agree("add", [set_id, *mask])
    if any(row != rows[0] for row in rows):
        engine.remove_process_set(set_id)
        described = "; ".join("rank %d: set %d of ranks %s" % (r, row[0], [i for i, m in enumerate(row[1:]) if m])
                              for r, row in enumerate(rows))
        raise ValueError("add_process_set: the ranks registered different process sets (%s); every "
                         "rank must add the same sets in the same order" % described)
    process_set.process_set_id = set_id
    process_set._generation = basics._state.generation
    _registered.append(process_set)
    return process_set


def remove_process_set(process_set: Any) -> bool:
    """Unregisters a process set on every rank (collective, like add_process_set). Returns False for
    the global set, which cannot be removed, or for a set that is not registered."""
    if process_set is None or process_set is global_process_set or not isinstance(process_set, ProcessSet):
        return False
    if not process_set._registered():
        return False
    rows = _agree("remove", [process_set.process_set_id])
    if any(row != rows[0] for row in rows):
        raise ValueError("remove_process_set: the ranks removed different process sets (ids %s)"
                         % [row[0] for row in rows])
    removed = basics._engine().remove_process_set(process_set.process_set_id)
    _registered.remove(process_set)
    process_set.process_set_id = None
    return bool(removed)


def forget_process_set(process_set: ProcessSet) -> None:
    """Unregisters a set on this rank only, with no agreement among the ranks: for frameworks
    whose groups are destroyed by their members alone (torch.distributed). Ids are never reused,
    so ranks that still hold the set stay consistent; a set with operations in flight here is
    left registered (they finish with it)."""
    if not process_set._registered():
        return
    try:
        basics._engine().remove_process_set(process_set.process_set_id)
    except ValueError:  # operations of the set still in flight on this rank
        return
    if process_set in _registered:
        _registered.remove(process_set)
    process_set.process_set_id = None


def pair_set(a: int, b: int) -> ProcessSet:
    """Ranks ``a`` and ``b`` as a process set that needs no registration: the engine derives a pair
    set's members from its id on every rank, so two ranks alone can run a collective (a broadcast
    from one to the other is a point-to-point transfer) without the others calling anything.
    ValueError for a rank out of range or a == b."""
    set_id = int(basics._engine().pair_process_set(int(a), int(b)))
    pair = ProcessSet([a, b])
    pair.process_set_id = set_id
    pair._generation = basics._state.generation
    return pair


def _live_sets() -> List[ProcessSet]:
    _registered[:] = [s for s in _registered if s._registered()]
    return list(_registered)


def member_of(process_set: Any) -> bool:
    """Whether this rank is in `process_set`. Raises ValueError for anything but a registered
    process set. (Some objects may be bound to a set on any rank: Horovod's DistributedOptimizer
    of a set steps on local gradients on the ranks outside it.)"""
    if process_set is None or process_set is global_process_set:
        return True
    if not isinstance(process_set, ProcessSet):
        raise ValueError("process_set must be a ProcessSet (or the global one); got %r" % (process_set,))
    if not process_set._registered():
        raise ValueError("%r is not registered: call add_process_set(...) on every rank first"
                         % (process_set,))
    return process_set.included()


def reduces_gradients_over(process_set: Any) -> bool:
    """Whether a gradient reduction over `process_set` (a DistributedOptimizer's or tape's) joins
    this rank with others. Horovod leaves gradients local on a rank outside the set and on a set of
    one rank: nothing is submitted there. Raises ValueError for an unregistered set."""
    if not member_of(process_set):
        return False
    return (global_process_set if process_set is None else process_set).size() > 1


def by_id(set_id: int) -> Any:
    """The registered process set of engine id `set_id` (0: the global one); ValueError if none."""
    if not set_id:
        return global_process_set
    for s in _live_sets():
        if s.process_set_id == set_id:
            return s
    raise ValueError("no process set of id %d is registered" % set_id)


def process_set_id(process_set: Any) -> int:
    """The engine's id for `process_set` (0: every rank). Raises ValueError for a set that is not
    registered, or that does not include this rank."""
    if not member_of(process_set):
        raise ValueError("rank %d is not in %r" % (rank(), process_set))
    if process_set is None or process_set is global_process_set:
        return 0
    return int(process_set.process_set_id)

