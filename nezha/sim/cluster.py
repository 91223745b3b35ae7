"""What the simulator models: a cluster's hosts and rails, and the software costs of its machines.

A rail is one network plane: every host has one link on it (full duplex, `gbps` each way), of one
protocol. A `Profile` holds what the network does not: the time a message step costs the transport
and the engine beside the bytes (per rail kind), the engine's per-operation negotiation, the host's
reduction rate, the shared-memory rate between a host's ranks, and, for a testbed whose hosts share
one machine's cores, the bytes per second that machine moves in all.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# Rail kinds the simulator models and how a share's collective runs on them.
#   tcp, ofi, mptcp: point to point (ring / log-step / chain); agg: reduces in the network (one
#   round trip through an aggregator whose link is as fast as all hosts' links together).
RAIL_KINDS = ("tcp", "ofi", "mptcp", "agg")

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(k|m|g|t)?(bit|bps)?\s*$", re.IGNORECASE)
_UNIT = {None: 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0, "t": 1e3}


def parse_rate_gbps(text: str) -> float:
    """'1gbit', '250mbit', '100g', '1.5gbit' -> Gbit/s (tc's units: bits per second)."""
    m = _RATE.match(text)
    if not m:
        raise ValueError(f"rate '{text}' is not a number with an optional k/m/g/t unit (e.g. 1gbit, 250mbit)")
    value = float(m.group(1)) * _UNIT[(m.group(2) or "").lower() or None]
    if value <= 0:
        raise ValueError(f"rate '{text}' must be positive")
    return value


@dataclass(frozen=True)
class RailModel:
    name: str
    kind: str      # one of RAIL_KINDS
    gbps: float    # each host's link on this plane, each direction

    @property
    def point_to_point(self) -> bool:
        return self.kind != "agg"


def parse_rails(spec: str) -> List[RailModel]:
    """'1gbit,250mbit' or 'ofi:100gbit,tcp:25gbit,agg:100gbit' -> rails (default kind tcp)."""
    rails: List[RailModel] = []
    for i, item in enumerate(p.strip() for p in spec.split(",")):
        if not item:
            raise ValueError(f"rails '{spec}': empty item")
        kind, _, rate = item.rpartition(":")
        kind = kind or "tcp"
        if kind not in RAIL_KINDS:
            raise ValueError(f"rail '{item}': kind '{kind}' is not one of {', '.join(RAIL_KINDS)}")
        rails.append(RailModel(f"rail{i}:{kind}", kind, parse_rate_gbps(rate)))
    if not rails:
        raise ValueError("at least one rail is needed")
    return rails


@dataclass(frozen=True)
class Cluster:
    hosts: int
    ranks_per_host: int
    rails: List[RailModel]

    def __post_init__(self):
        if self.hosts < 1 or self.ranks_per_host < 1:
            raise ValueError(f"hosts ({self.hosts}) and ranks per host ({self.ranks_per_host}) must be >= 1")

    @property
    def ranks(self) -> int:
        return self.hosts * self.ranks_per_host


@dataclass(frozen=True)
class Profile:
    """Software costs; every field in microseconds or Gbit/s. `source` says where they came from."""
    name: str
    source: str
    step_us: Dict[str, float]          # per message step of a collective, by rail kind
    op_us: float                       # one operation's negotiation and completion, beside its steps
    per_rank_us: float                 # rank 0's work per rank per negotiated operation
    range_us: float                    # one balanced range: the claim message and the ring's restart
    reduce_gbps: float                 # one host reducing (reads two inputs, writes one)
    shm_gbps: float                    # a host's memory for copies between its ranks, shared by them
                                       # (with machine_gbps: the machine's, shared by every rank)
    # Where all ranks share a few cores (the testbed: every host is a namespace of one machine), the
    # machine's CPU is a budget of cpu_cores shared by the runnable processes (processor sharing):
    # every process also burns background_cpu of a core on its own while the job runs (its loops'
    # timers and wake-ups), the rest is left for the work. A collective step costs each rank's worker
    # step_cpu_us[kind] of CPU, a negotiated operation costs each rank negotiation_cpu_us, so a step
    # (an operation) lasts at least the CPU of all its processes divided by what is left of the
    # cores. The bytes are moved by the same cores, so the machine's byte budgets (machine_gbps,
    # shaped_machine_gbps, shm_gbps: what the whole machine moves) shrink by the background's share
    # as well. None: every host has its own cores.
    cpu_cores: Optional[float] = None
    background_cpu: float = 0.0
    step_cpu_us: Dict[str, float] = field(default_factory=dict)
    negotiation_cpu_us: float = 0.0
    # Where the processes outnumber the cores, a worker woken by its step's message finds its core
    # taken by another process with probability 1 - cores/processes and waits about wake_us for it
    # (the testbed: a 4-16 KB allreduce on one shaped rail takes 570 us at 6 hosts and 1.2 ms at
    # 12, a quarter to a half more than its negotiation, bytes and CPU). Network steps only: the
    # host lane's step CPU is fitted to one-host runs of 8-32 ranks, which hold its wake-ups.
    wake_us: float = 0.0
    # A striped operation's hand-offs: the caller runs its largest share itself and wakes one worker
    # per other rail, which wakes it again at the end (executor.cc). Each costs every rank this much
    # CPU, so on shared cores a handed-off share starts, and its end reaches the caller, that late.
    handoff_cpu_us: float = 0.0
    # Rank 0's work per byte of an inline operation (its inputs in, its results out, each through
    # the control messages' encoding): 2 (n - 1) x bytes on the coordinator's path.
    inline_ns_per_byte: float = 0.0
    machine_gbps: Optional[float] = None  # testbed: wire bytes all hosts together move per second
    # The same while the busy links are shaped (slower than line_gbps: every packet also passes a
    # token bucket, on the same cores): measured lower. None: machine_gbps either way.
    shaped_machine_gbps: Optional[float] = None
    # Links shaped by a token bucket (the testbed's `tc tbf`): its depth, as seconds of the rate but
    # at least min_burst_bytes, sent at line_gbps. 0: a plain link at its rate.
    burst_s: float = 0.0
    # Payload per wire byte, by rail kind (TCP over Ethernet at MTU 1500: 1448 of 1514 bytes).
    payload_fraction: Dict[str, float] = field(default_factory=dict)
    min_burst_bytes: int = 0
    line_gbps: float = 0.0
    inline_bytes: int = 16384          # NEZHA_CONTROL_INLINE_BYTES
    hierarchical: bool = True          # NEZHA_HIERARCHICAL (False: a flat ring over every rank)
    logstep_max_bytes: int = 65536     # NEZHA_LOGSTEP_MAX_BYTES
    halving_max_bytes: int = 256 << 10  # NEZHA_HALVING_MAX_BYTES
    balance_bytes: int = 1 << 20       # NEZHA_BALANCE_BYTES
    fusion_bytes: int = 64 << 20       # NEZHA_FUSION_THRESHOLD
    unfused_bytes: int = 1 << 20       # NEZHA_UNFUSED_BYTES
    cycle_ms: float = 1.0              # NEZHA_CYCLE_TIME_MS
    # Training: the hosts' cores run the compute, so communication waits for the backward pass to
    # end (the testbed: every rank shares one machine's two cores); False: they overlap (GPUs).
    compute_blocks_communication: bool = False
    link_tick_ms: float = 10.0         # a cut is noticed at the watchdog's link tick (lost carrier)
    extra: Dict[str, float] = field(default_factory=dict)

    def step(self, kind: str) -> float:
        return self.step_us.get(kind, self.step_us["tcp"])

    def cpu_left(self, processes: int) -> float:
        """Cores the work of `processes` running processes gets: the machine's less their background
        (never below a tenth of it). inf where hosts have their own cores."""
        if not self.cpu_cores:
            return float("inf")
        return max(0.1 * self.cpu_cores, self.cpu_cores - processes * self.background_cpu)

    def step_cpu_floor(self, kind: str, workers: int, processes: int) -> float:
        """Seconds a step of `workers` workers lasts at least on the shared cores, beside its bytes
        (0: own cores)."""
        cpu = self.step_cpu_us.get(kind, self.step_cpu_us.get("tcp", 0.0))
        return workers * cpu * 1e-6 / self.cpu_left(processes)

    def wake_seconds(self, processes: int) -> float:
        """The wait a message step's wake-up adds where `processes` share the cores (0: own cores)."""
        if not self.cpu_cores or not self.wake_us or processes <= self.cpu_cores:
            return 0.0
        return self.wake_us * 1e-6 * (1 - self.cpu_cores / processes)

    def handoff_seconds(self, ranks: int, handed_off: int) -> float:
        """How late `handed_off` shares (all ranks' at once) start on the shared cores (0: own cores)."""
        if not self.cpu_cores or handed_off < 1:
            return 0.0
        return handed_off * ranks * self.handoff_cpu_us * 1e-6 / self.cpu_left(ranks)

    def machine_budget_gbps(self, link_gbps: Sequence[float], processes: int) -> Optional[float]:
        """The machine's byte budget while links of these rates carry traffic and `processes` run
        (their background takes its share of the cores that move the bytes; None: no budget)."""
        budget = self.machine_gbps
        if self.shaped_machine_gbps and any(g < self.line_gbps for g in link_gbps):
            budget = self.shaped_machine_gbps
        return budget * self.background_left(processes) if budget else budget

    def background_left(self, processes: int) -> float:
        """The fraction of the machine's cores `processes` leave to the work (1: own cores)."""
        return self.cpu_left(processes) / self.cpu_cores if self.cpu_cores else 1.0

    def with_overrides(self, **kw) -> "Profile":
        return replace(self, **kw)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (nezha/sim/profiles/<name>.json) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.json"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.json"))
        raise ValueError(f"no profile '{name_or_path}' (known: {', '.join(known)}; or give a .json path)")
    data = json.loads(path.read_text())
    try:
        return Profile(**data)
    except TypeError as e:
        raise ValueError(f"profile {path}: {e}") from None
