"""Horovod's process sets, for every adapter. Nezha runs each collective over all ranks, so only the
set of every rank exists (the global set); a smaller one is refused with NotImplementedError when it
is registered or used, instead of a script failing on a missing name."""
from __future__ import annotations

from typing import Any

from .basics import rank, size


class _GlobalProcessSet:
    """Every rank. Accepted wherever Horovod takes `process_set=`."""

    process_set_id = 0

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
    """Horovod's `ProcessSet(ranks)`: a list of ranks (an MPI communicator is refused)."""

    def __init__(self, ranks_or_comm: Any) -> None:
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise NotImplementedError("ProcessSet from an MPI communicator: Nezha does not use "
                                      "MPI; pass a list of ranks")
        self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.process_set_id = None

    def _check_is_every_rank(self) -> None:
        if self.ranks != list(range(size())):
            raise NotImplementedError(
                "process set of ranks %s: Nezha runs collectives over all %d ranks only (use the "
                "global process set)" % (self.ranks, size()))

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        return self.ranks.index(rank()) if rank() in self.ranks else -1

    def included(self) -> bool:
        return rank() in self.ranks

    def __repr__(self) -> str:
        return "ProcessSet(ranks=%s)" % (self.ranks,)


def add_process_set(process_set: Any) -> ProcessSet:
    """Registers a process set (a ProcessSet or a list of ranks); only the set of every rank is
    supported, and it becomes the global set."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    process_set._check_is_every_rank()
    process_set.process_set_id = global_process_set.process_set_id
    return process_set


def remove_process_set(process_set: Any) -> bool:
    """The only set Nezha has (every rank) cannot be removed, so this returns False."""
    return False


def check_process_set(process_set: Any) -> None:
    """Raises NotImplementedError unless `process_set` is (equivalent to) the global set."""
    if process_set is None or process_set is global_process_set:
        return
    if isinstance(process_set, ProcessSet):
        process_set._check_is_every_rank()
        return
    raise NotImplementedError("Nezha supports only the global process set; got %r."
                              % (process_set,))
