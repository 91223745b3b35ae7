"""Process topology, reduction ops and build probes under Horovod's names.

Everything here forwards to the framework-agnostic `nezha` API; the only logic is translating
Horovod's conventions (the deprecated `average=` flag, `Adasum`, process sets, build probes).
"""

import nezha

# Reduction ops are the engine's own enum values (exposed by the bindings, never mirrored by hand).
Sum = nezha.Sum
Average = nezha.Average
Min = nezha.Min
Max = nezha.Max
Product = nezha.Product


class _AdasumOp:
    """Placeholder so that `hvd.Adasum` exists; every op that receives it raises."""

    def __repr__(self):
        return "Adasum"


Adasum = _AdasumOp()

NezhaError = nezha.NezhaError
# Horovod scripts catch these names around collectives.
HorovodInternalError = nezha.NezhaError

shutdown = nezha.shutdown
is_initialized = nezha.is_initialized
rank = nezha.rank
size = nezha.size
local_rank = nezha.local_rank
local_size = nezha.local_size
cross_rank = nezha.cross_rank
cross_size = nezha.cross_size


def is_homogeneous():
    """True when every host runs the same number of ranks.

    Decided locally (no communication, so one rank may call it alone): with homogeneous hosts every
    rank sees size == local_size * cross_size; with uneven hosts the ranks of the smaller hosts do not.
    """
    engine_answer = getattr(nezha, "is_homogeneous", None)
    if engine_answer is not None:
        return bool(engine_answer())
    return size() == local_size() * cross_size()


def resolve_op(op, average, default=None):
    """Horovod's `op`/`average` pair -> a nezha ReduceOp; Adasum is refused with a clear message."""
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


class _GlobalProcessSet:
    """Nezha has one process set: every rank. Accepted wherever Horovod takes `process_set=`."""

    process_set_id = 0

    def size(self):
        return size()

    def rank(self):
        return rank()

    def included(self):
        return True

    def __repr__(self):
        return "ProcessSet(global)"


global_process_set = _GlobalProcessSet()


class ProcessSet:
    """Horovod's `ProcessSet(ranks)`. Nezha runs every collective over all ranks, so a set of every
    rank works (it is the global set) and any smaller one is refused with NotImplementedError when it
    is registered or used, instead of a script failing on a missing name."""

    def __init__(self, ranks_or_comm):
        if not isinstance(ranks_or_comm, (list, tuple, range)):
            raise NotImplementedError("ProcessSet from an MPI communicator: Nezha does not use MPI; "
                                      "pass a list of ranks")
        self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.process_set_id = None

    def _check_is_every_rank(self):
        if self.ranks != list(range(size())):
            raise NotImplementedError(
                "process set of ranks %s: Nezha runs collectives over all %d ranks only (use the "
                "global process set)" % (self.ranks, size()))

    def size(self):
        return len(self.ranks)

    def rank(self):
        return self.ranks.index(rank()) if rank() in self.ranks else -1

    def included(self):
        return rank() in self.ranks

    def __repr__(self):
        return "ProcessSet(ranks=%s)" % (self.ranks,)


def add_process_set(process_set):
    """Registers a process set (Horovod's name); only the set of every rank is supported."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    process_set._check_is_every_rank()
    process_set.process_set_id = global_process_set.process_set_id
    return process_set


def remove_process_set(process_set):
    """Horovod's name; the only set Nezha has (every rank) cannot be removed, so this returns False."""
    return False


def init(comm=None, process_sets=None, **nezha_options):
    """Horovod's `init(comm=None, process_sets=None)`: joins the job (`nezha.init`, which also takes
    `nezha_options`); `comm` (an MPI communicator) is not supported, and `process_sets` may only
    hold the set of every rank."""
    if comm is not None:
        raise NotImplementedError("init(comm=...): Nezha does not use MPI; start the job with nezharun")
    nezha.init(**nezha_options)
    for process_set in process_sets or ():
        add_process_set(process_set)


def check_process_set(process_set):
    if process_set is None or process_set is global_process_set:
        return
    if isinstance(process_set, ProcessSet):
        process_set._check_is_every_rank()
        return
    raise NotImplementedError("Nezha supports only the global process set; got %r." % (process_set,))


# Build probes, answered truthfully: Nezha's core is one CPU library with its own TCP transports. It
# links neither MPI, Gloo, NCCL, DDL, CCL nor CUDA; CUDA tensors work by staging through pinned host
# memory in this adapter, which is not what `cuda_built()` promises (device-side collectives).
def mpi_built(verbose=False):
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built(verbose=False):
    return False


def gloo_enabled():
    return False


def nccl_built(verbose=False):
    return 0


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    return False


def rocm_built(verbose=False):
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts the engine's Chrome-trace timeline, if this engine can start one at run time."""
    engine_start = getattr(nezha, "start_timeline", None)
    if engine_start is None:
        raise NotImplementedError(
            "This Nezha engine writes a timeline only when started with NEZHA_TIMELINE=<file> "
            "(nezharun --timeline FILE); it cannot be started at run time.")
    return engine_start(file_path, mark_cycles=mark_cycles)


def stop_timeline():
    engine_stop = getattr(nezha, "stop_timeline", None)
    if engine_stop is None:
        raise NotImplementedError(
            "This Nezha engine cannot stop its timeline at run time; it ends at shutdown().")
    return engine_stop()
