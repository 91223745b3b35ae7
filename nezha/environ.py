"""Where this process sits in the job: rank, sizes and the rendezvous store, read from the launcher.

Sources, first match wins: nezharun (``NEZHA_*``), torchrun, Open MPI, MPICH/Hydra, Slurm; with
nothing set the process is a job of one. ``NEZHA_RENDEZVOUS_ADDR``/``PORT``, ``NEZHA_CROSS_RANK``/
``SIZE``, ``NEZHA_SECRET`` and ``NEZHA_RAILS`` override what the launcher provides.

Security note: nezharun generates a per-job secret. Under torchrun, MPI or Slurm there is none
unless ``NEZHA_SECRET`` (hex) is exported to every rank; without it the store accepts any peer that
can reach it (the HMAC handshake still runs, with an empty key).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, List, Mapping, Optional

# Slurm jobs get a store port derived from the job id, below Linux's ephemeral range (32768+) so it
# does not collide with outgoing connections.
_SLURM_PORT_BASE = 15000
_SLURM_PORT_SPAN = 15000


@dataclasses.dataclass(frozen=True)
class WorldInfo:
    """This process's place in the job and how to reach the rendezvous store."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    rendezvous_addr: str
    rendezvous_port: int
    secret: bytes = dataclasses.field(repr=False)
    rails: Optional[str]
    source: str  # "nezharun", "torchrun", "openmpi", "mpich", "slurm" or "single"
    host_store: bool  # True when this process (rank 0) must serve the store itself


def detect(env: Mapping[str, str] = None) -> WorldInfo:
    """Reads the job layout from ``env`` (default ``os.environ``); ``ValueError`` names bad vars."""
    if env is None:
        env = os.environ
    for _, present, read in _SOURCES:
        if present(env):
            return read(env)
    return _single(env)


# --- per-source readers ------------------------------------------------------------------------

def _from_nezharun(env: Mapping[str, str]) -> WorldInfo:
    rank, size = _int(env, "NEZHA_RANK"), _int(env, "NEZHA_SIZE")
    local_rank, local_size = _int(env, "NEZHA_LOCAL_RANK"), _int(env, "NEZHA_LOCAL_SIZE")
    return _build(env, "nezharun", rank, size, local_rank, local_size,
                  cross=("NEZHA_CROSS_RANK", "NEZHA_CROSS_SIZE"),
                  addr=_required(env, "NEZHA_RENDEZVOUS_ADDR"),
                  port=_port(env, "NEZHA_RENDEZVOUS_PORT"), host_store=False)


def _from_torchrun(env: Mapping[str, str]) -> WorldInfo:
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    local_rank = _int(env, "LOCAL_RANK")
    local_size = _int(env, "LOCAL_WORLD_SIZE")
    addr = env.get("NEZHA_RENDEZVOUS_ADDR") or _required(env, "MASTER_ADDR")
    if env.get("NEZHA_RENDEZVOUS_PORT"):
        port = _port(env, "NEZHA_RENDEZVOUS_PORT")
    else:
        # torchrun's own TCPStore owns MASTER_PORT; ours takes the next one.
        port = _port(env, "MASTER_PORT") + 1
        if port > 65535:
            raise ValueError("MASTER_PORT=65535 leaves no port for Nezha's store; set "
                             "NEZHA_RENDEZVOUS_PORT")
    return _build(env, "torchrun", rank, size, local_rank, local_size,
                  cross=("GROUP_RANK", "GROUP_WORLD_SIZE"), addr=addr, port=port,
                  host_store=rank == 0)


def _from_openmpi(env: Mapping[str, str]) -> WorldInfo:
    return _from_mpi_like(env, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _from_mpich(env: Mapping[str, str]) -> WorldInfo:
    return _from_mpi_like(env, "mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                          "MPI_LOCALNRANKS")


def _from_mpi_like(env, source, rank_var, size_var, local_rank_var, local_size_var) -> WorldInfo:
    rank, size = _int(env, rank_var), _int(env, size_var)
    local_rank, local_size = _int(env, local_rank_var), _int(env, local_size_var)
    addr, port = _store_address(env, source, fallback=None)
    return _build(env, source, rank, size, local_rank, local_size, cross=None, addr=addr,
                  port=port, host_store=rank == 0)


def _from_slurm(env: Mapping[str, str]) -> WorldInfo:
    rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    local_rank = _int(env, "SLURM_LOCALID")
    node_id = _int(env, "SLURM_NODEID")
    tasks_per_node = _slurm_tasks_per_node(env)
    if node_id >= len(tasks_per_node):
        raise ValueError(f"SLURM_NODEID={node_id} but the tasks-per-node list has only "
                         f"{len(tasks_per_node)} nodes")
    local_size = tasks_per_node[node_id]
    if sum(tasks_per_node) == size:
        # Heterogeneous layouts are fine here: Slurm tells us every node's task count.
        cross_size = len(tasks_per_node)
    else:  # SLURM_NTASKS_PER_NODE is one number: homogeneous by construction
        cross_size = _int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else size // local_size
    addr, port = _store_address(env, "slurm", fallback=_slurm_default_store)
    cross_env = {"NEZHA_CROSS_RANK": str(node_id), "NEZHA_CROSS_SIZE": str(cross_size)}
    merged = {**env, **{k: v for k, v in cross_env.items() if k not in env}}
    return _build(merged, "slurm", rank, size, local_rank, local_size,
                  cross=("NEZHA_CROSS_RANK", "NEZHA_CROSS_SIZE"), addr=addr, port=port,
                  host_store=rank == 0)


def _single(env: Mapping[str, str]) -> WorldInfo:
    port = _port(env, "NEZHA_RENDEZVOUS_PORT", allow_zero=True) \
        if env.get("NEZHA_RENDEZVOUS_PORT") else 0
    return _build(env, "single", 0, 1, 0, 1, cross=None,
                  addr=env.get("NEZHA_RENDEZVOUS_ADDR") or "127.0.0.1", port=port,
                  host_store=True)


_SOURCES: List = [
    ("nezharun", lambda e: "NEZHA_RANK" in e or "NEZHA_SIZE" in e, _from_nezharun),
    ("torchrun", lambda e: "RANK" in e and "WORLD_SIZE" in e, _from_torchrun),
    ("openmpi", lambda e: "OMPI_COMM_WORLD_RANK" in e, _from_openmpi),
    ("mpich", lambda e: "PMI_RANK" in e, _from_mpich),
    ("slurm", lambda e: "SLURM_PROCID" in e, _from_slurm),
]


# --- shared helpers ----------------------------------------------------------------------------

def _build(env, source, rank, size, local_rank, local_size, cross, addr, port,
           host_store) -> WorldInfo:
    if size < 1:
        raise ValueError(f"{source}: world size must be at least 1, got {size}")
    if not 0 <= rank < size:
        raise ValueError(f"{source}: rank {rank} is outside [0, {size})")
    if not 1 <= local_size <= size:
        raise ValueError(f"{source}: local size {local_size} must be in [1, {size}]")
    if not 0 <= local_rank < local_size:
        raise ValueError(f"{source}: local rank {local_rank} is outside [0, {local_size})")
    cross_rank, cross_size = _cross(env, source, rank, size, local_size, cross)
    return WorldInfo(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                     cross_rank=cross_rank, cross_size=cross_size, rendezvous_addr=addr,
                     rendezvous_port=port, secret=secret_from(env),
                     rails=env.get("NEZHA_RAILS") or None,
                     source=source, host_store=host_store)


def _cross(env, source, rank, size, local_size, cross_vars):
    """Cross rank/size from the environment if given (NEZHA_CROSS_* win), else derived."""
    rank_var, size_var = "NEZHA_CROSS_RANK", "NEZHA_CROSS_SIZE"
    if rank_var not in env and size_var not in env and cross_vars is not None:
        rank_var, size_var = cross_vars
    if rank_var in env and size_var not in env and size % local_size == 0:
        env = {**env, size_var: str(size // local_size)}  # e.g. GROUP_RANK alone: homogeneous
    if rank_var in env or size_var in env:
        cross_rank, cross_size = _int(env, rank_var), _int(env, size_var)
        if not 0 <= cross_rank < cross_size:
            raise ValueError(f"{rank_var}={cross_rank} is outside [0, {size_var}={cross_size})")
        if cross_size > size:
            raise ValueError(f"{size_var}={cross_size} exceeds the world size {size}")
        return cross_rank, cross_size
    if size % local_size:
        raise ValueError(f"{source}: cannot derive the cross rank: world size {size} is not a "
                         f"multiple of local size {local_size} (hosts run different numbers of "
                         f"ranks); set NEZHA_CROSS_RANK and NEZHA_CROSS_SIZE")
    return rank // local_size, size // local_size


def _store_address(env, source, fallback: Optional[Callable]):
    if env.get("NEZHA_RENDEZVOUS_ADDR") or env.get("NEZHA_RENDEZVOUS_PORT"):
        return _required(env, "NEZHA_RENDEZVOUS_ADDR"), _port(env, "NEZHA_RENDEZVOUS_PORT")
    if env.get("MASTER_ADDR") or env.get("MASTER_PORT"):
        return _required(env, "MASTER_ADDR"), _port(env, "MASTER_PORT")
    if fallback is not None:
        return fallback(env)
    raise ValueError(f"{source}: no rendezvous address: set NEZHA_RENDEZVOUS_ADDR and "
                     f"NEZHA_RENDEZVOUS_PORT (or MASTER_ADDR and MASTER_PORT) to an address of "
                     f"rank 0's host and a free port")


def _slurm_default_store(env):
    nodes = expand_slurm_nodelist(_required(env, "SLURM_JOB_NODELIST"))
    job_id = _int(env, "SLURM_JOB_ID")
    return nodes[0], _SLURM_PORT_BASE + job_id % _SLURM_PORT_SPAN


def _slurm_tasks_per_node(env) -> List[int]:
    if env.get("SLURM_TASKS_PER_NODE"):
        return parse_slurm_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
    if env.get("SLURM_NTASKS_PER_NODE"):
        return [_int(env, "SLURM_NTASKS_PER_NODE")]
    raise ValueError("slurm: neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE is set")


def secret_from(env: Mapping[str, str]) -> bytes:
    """NEZHA_SECRET (hex) as bytes; empty when unset. ValueError for anything but hex."""
    value = env.get("NEZHA_SECRET", "")
    try:
        return bytes.fromhex(value)
    except ValueError:
        message = "NEZHA_SECRET must be a hex string (nezharun sets 64 hex digits)"
        raise ValueError(message) from None


def _required(env, var: str) -> str:
    value = env.get(var, "").strip()
    if not value:
        raise ValueError(f"environment variable {var} is not set")
    return value


def _int(env, var: str) -> int:
    raw = _required(env, var)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None


def _port(env, var: str, allow_zero: bool = False) -> int:
    port = _int(env, var)
    if not (0 if allow_zero else 1) <= port <= 65535:
        raise ValueError(f"environment variable {var}={port} is not a valid TCP port")
    return port


# --- Slurm list formats --------------------------------------------------------------------------

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_slurm_tasks_per_node(value: str) -> List[int]:
    """Expands SLURM_TASKS_PER_NODE, e.g. ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: List[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"SLURM_TASKS_PER_NODE={value!r}: cannot parse {item!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def expand_slurm_nodelist(nodelist: str) -> List[str]:
    """Expands Slurm's compressed host list: ``"node[01-03,07],gpu5"`` -> node01..node03, node07,
    gpu5. Several bracket groups in one name expand as a product (``"r[1-2]n[1-2]"``)."""
    hosts: List[str] = []
    for item in _split_top_level(nodelist):
        hosts.extend(_expand_host_pattern(item, nodelist))
    if not hosts:
        raise ValueError(f"SLURM_JOB_NODELIST={nodelist!r} names no host")
    return hosts


def _split_top_level(text: str) -> List[str]:
    items, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"SLURM_JOB_NODELIST={text!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise ValueError(f"SLURM_JOB_NODELIST={text!r}: unbalanced '['")
    items.append("".join(current))
    return [i.strip() for i in items if i.strip()]


def _expand_host_pattern(pattern: str, whole: str) -> List[str]:
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.index("]", open_at)
    prefix, ranges = pattern[:open_at], pattern[open_at + 1:close_at]
    suffix = pattern[close_at + 1:]
    tails = _expand_host_pattern(suffix, whole)
    expanded = []
    for part in ranges.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"SLURM_JOB_NODELIST={whole!r}: bad range {part!r}")
        width = len(lo)  # keep zero padding: node[01-03] -> node01
        for n in range(int(lo), int(hi if sep else lo) + 1):
            expanded.extend(f"{prefix}{n:0{width}d}{tail}" for tail in tails)
    return expanded
