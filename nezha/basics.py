"""Process-level state: init(), shutdown(), rank(), size(), ... and rail_stats()."""
from __future__ import annotations

import atexit
import os
import socket
import threading
from typing import Any, Dict, List, Optional

from . import _core, environ, rails as rails_mod
from .rendezvous import bootstrap, protocol

NezhaError = _core.NezhaError


class NotInitializedError(NezhaError, ValueError):
    """Raised by calls made before ``nezha.init()`` or after ``nezha.shutdown()``."""


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.engine: Optional[Any] = None
        self.info: Optional[environ.WorldInfo] = None
        self.generation = 0


_state = _State()


def _engine():
    eng = _state.engine
    if eng is None:
        raise NotInitializedError("nezha is not initialized: call nezha.init() first")
    return eng


def init(rails: Optional[str] = None, timeout_s: Optional[float] = None) -> None:
    """Joins the job: finds this process's rank from the environment, meets the other ranks and
    connects every rail.

    The rank layout comes from nezharun (``NEZHA_*``), torchrun (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``), Open MPI, MPICH or Slurm; with none of these the process
    is a job of one. ``rails`` (or ``NEZHA_RAILS``) is a comma list of rails: interface names or
    subnets, each optionally prefixed with its kind (``tcp:``, ``mptcp:``), or another kind the
    core knows (``shm``, ``ofi:``, ``agg:``; ``nezha._core.rail_kinds()``); see nezha/rails.py.
    ``timeout_s`` overrides ``NEZHA_TIMEOUT_S``. Calling
    init() again while initialized does nothing.
    """
    with _state.lock:
        if _state.engine is not None:
            return
        _start(environ.detect(), rails, timeout_s, store=None, host_id=None)


def init_with_store(info: environ.WorldInfo, store: Any, host_id: str,
                    rails: Optional[str] = None, timeout_s: Optional[float] = None) -> bool:
    """Joins the job described by ``info`` through ``store`` (set/get/wait/add with timeouts, as
    nezha.rendezvous' StoreClient has), another framework's store: how torch.distributed's
    ``init_process_group("nezha")`` starts the engine. ``host_id`` places this rank for host-local
    rails. Returns False (and does nothing) when nezha is initialized already."""
    with _state.lock:
        if _state.engine is not None:
            return False
        _start(info, rails, timeout_s, store=store, host_id=host_id)
        return True


def _start(info: environ.WorldInfo, rails: Optional[str], timeout_s: Optional[float],
           store: Any, host_id: Optional[str]) -> None:
    config = _core.EngineConfig()
    if timeout_s is not None:
        config.timeout_s = float(timeout_s)
    config.rank, config.size = info.rank, info.size
    config.local_rank, config.local_size = info.local_rank, info.local_size
    config.cross_rank, config.cross_size = info.cross_rank, info.cross_size
    config.secret = info.secret
    specs = rails_mod.resolve_rails(rails or info.rails, info.rendezvous_addr)
    config.rails = [_core.RailConfig(s.name, s.local_addr, s.kind, dict(s.options))
                    for s in specs] + _automatic_rails(specs, info)
    # The launcher's host entry (placement): a host-local rail (shm) joins only ranks with the
    # same entry (and boot id and network namespace, which the rail checks itself).
    config.host_id = host_id or (os.environ.get("NEZHA_HOST_ID") or os.environ.get("HOROVOD_HOSTNAME")
                                 or socket.gethostname())
    if not all(s.binds_local_address for s in specs):
        # A rail without an IPv4 address of its own (shm, ofi:shm, agg) still needs the control
        # channel's path; an ofi rail over an IP provider opens it on its own address.
        config.control_addr = rails_mod.route_source_address(info.rendezvous_addr)
    engine = _core.Engine(config)
    if info.size == 1:
        engine.connect_and_start([engine.listen_addresses()])
    elif store is not None:
        _exchange_addresses(engine, info, store, config.connect_timeout_s)
    else:
        _meet_peers(engine, info, config.connect_timeout_s)
    _state.engine, _state.info = engine, info
    _state.generation += 1
    _core.attach_engine(engine)  # for native callers: nezha.jax's XLA FFI handlers


# The automatic shmcoll rail pays for itself up to this many ranks on the host. Every rank maps
# every other rank's workspace at start-up, and a chunk is reduced only once all ranks have copied
# theirs in: past a few ranks per core, start-up grows 3-5x (0.09 -> 0.32 s at 32 ranks, 0.89 ->
# 2.7 s at 128 on 2 cores) and 4 MB allreduces fall behind the ring (benchmarks/SCALE.md). A larger
# job lists it (--rails shmcoll,...) where it wins.
_AUTO_SHM_COLL_MAX_RANKS = 8


def _automatic_rails(specs: List[rails_mod.RailSpec], info: environ.WorldInfo) -> List[Any]:
    """The shared-memory rails nezha adds by itself. ``shm`` (``NEZHA_AUTO_SHM``) where the
    launcher places several ranks on some host (fewer hosts than ranks: decided alike on every
    rank, which must agree on the rails, a rank alone on its host included) and no rail of the spec
    is host-local already: the core makes it the network rails' host lane (hierarchical allreduce;
    on one host it carries the allreduces); the shm rail itself checks who really shares a host.
    ``shmcoll`` (``NEZHA_AUTO_SHM_COLL``, on by default) where the whole job is on one host and
    has at most ``_AUTO_SHM_COLL_MAX_RANKS`` ranks: the collective rail that takes the allreduces,
    broadcasts, allgathers and reducescatters of 64 KiB and more (faster than the ring and loopback
    TCP there, benchmarks/SHM.md). ``NEZHA_AUTO_SHM=0`` turns
    both off (only the rails listed)."""
    if info.size <= 1 or info.cross_size >= info.size or _core.knob_value("NEZHA_AUTO_SHM") == "0":
        return []
    added = []
    if "shm" in _core.rail_kinds() and not any(s.kind == "shm" for s in specs):
        lane = _core.RailConfig("shm", "", "shm", {})
        lane.automatic = True
        added.append(lane)
    # Every rank on one host: the collective shm rail too, for the allreduces, broadcasts, allgathers
    # and reducescatters the rail table gives it (the shm lane keeps what needs messages). It joins the whole job or fails at connect, so it
    # is added only where the launcher puts the whole job on one host.
    if (info.local_size >= info.size and info.size <= _AUTO_SHM_COLL_MAX_RANKS
            and _core.knob_value("NEZHA_AUTO_SHM_COLL") != "0"
            and "shmcoll" in _core.rail_kinds() and not any(s.kind == "shmcoll" for s in specs)):
        coll = _core.RailConfig("shmcoll", "", "shmcoll", {})
        coll.automatic = True
        added.append(coll)
    return added


def _meet_peers(engine: Any, info: environ.WorldInfo, timeout_s: float) -> None:
    """Publishes this rank's listen addresses in the rendezvous store and connects to everyone's.

    Rank 0 serves the store itself when no launcher does (torchrun, MPI, Slurm); it keeps serving
    until every rank has read the addresses it needs."""
    rv = bootstrap.join(info, timeout_s)
    try:
        prefix = _exchange_addresses(engine, info, rv.client, timeout_s)
        if rv.server is not None:
            rv.client.wait([f"{prefix}/connected/{r}" for r in range(info.size)],
                           timeout_s=timeout_s)
    finally:
        rv.close()


def _exchange_addresses(engine: Any, info: environ.WorldInfo, client: Any,
                        timeout_s: float) -> str:
    """Publishes this rank's listen addresses in ``client``'s store, connects to everyone's and
    returns the generation's key prefix."""
    # Each init() of a job is a new generation so re-initialising never reads stale addresses.
    generation = client.add(f"nezha/generation/{info.rank}", 1)
    prefix = f"nezha/{generation}"
    client.set(f"{prefix}/addrs/{info.rank}", encode_addresses(engine.listen_addresses()))
    blobs = client.get_many([f"{prefix}/addrs/{r}" for r in range(info.size)], timeout_s=timeout_s)
    addrs = [decode_addresses(blob, r) for r, blob in enumerate(blobs)]
    engine.connect_and_start(addrs)
    client.set(f"{prefix}/connected/{info.rank}", b"")
    return prefix


# A rank's rail addresses in the rendezvous store: the store protocol's value list (a count, then
# each address as its length and its bytes; addresses are opaque: a transport may put any byte in
# them, NUL included). Every rank reads every rank's entry at start-up, so decoding is one slice
# per address (0.19 ms for 128 ranks' entries): as JSON with base64 it took 0.45 ms, about a tenth
# of a 128-rank job's start-up CPU on one host (benchmarks/SCALE.md).
def encode_addresses(addresses: List[bytes]) -> bytes:
    """A rank's rail addresses as one rendezvous store value (decode_addresses reads it)."""
    return protocol.encode_value_list(addresses)


def decode_addresses(blob: bytes, rank: int) -> List[bytes]:
    """The inverse of encode_addresses; ValueError names the rank whose entry is malformed."""
    try:
        reader = protocol.Reader(bytes(blob))
        addresses = reader.value_list()
        reader.end()
        return addresses
    except protocol.ProtocolError as exc:
        raise ValueError(f"rank {rank}'s rail addresses in the rendezvous store are malformed: "
                         f"{exc}") from None


def shutdown() -> None:
    """Finishes pending work, agrees with the other ranks to stop, and closes every connection.
    Safe to call more than once; init() may be called again afterwards."""
    with _state.lock:
        engine, _state.engine = _state.engine, None
        if engine is not None:
            _core.attach_engine(None)
            engine.shutdown()


atexit.register(shutdown)


def is_initialized() -> bool:
    """True between init() and shutdown()."""
    return _state.engine is not None


def _info() -> environ.WorldInfo:
    _engine()
    return _state.info


def rank() -> int:
    """This process's rank in the job, 0 <= rank < size()."""
    return _info().rank


def size() -> int:
    """Number of ranks in the job."""
    return _info().size


def local_rank() -> int:
    """Rank among the processes on this host."""
    return _info().local_rank


def local_size() -> int:
    """Number of ranks on this host."""
    return _info().local_size


def cross_rank() -> int:
    """Index of this host among the job's hosts."""
    return _info().cross_rank


def cross_size() -> int:
    """Number of hosts in the job."""
    return _info().cross_size


def engine_stats() -> Dict[str, int]:
    """How this rank's tensors were scheduled so far (counts): through rank 0
    (tensors_via_coordinator; of those done by rank 0 without a rail: tensors_done_by_coordinator),
    by cache rounds, by host votes (tensors_by_host_vote, host_votes_diverted), the requests sent to
    rank 0, the operations run on the rails and the times a caller ran the engine's loop itself."""
    return _engine().engine_stats()


def rail_stats() -> List[Dict[str, Any]]:
    """Per rail: name, local_addr, kind, state
    ('up'/'down'/'probing'), bytes_sent, bytes_received, the cost model's alpha_us,
    beta_gbps, bulk_alpha_us, mid_alpha_us and mid_beta_gbps (0 until measured),
    min_striped_bytes (allreduces below it run whole on one rail: striping them was measured
    slower; 0: none), and share (of bytes scheduled)."""
    return _engine().rail_stats()
