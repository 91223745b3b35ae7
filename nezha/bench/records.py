"""One measured (op, size, implementation) point, and its JSON form (the DESIGN.md contract)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, List, Sequence

from nezha.bench.metrics import algbw_gbps, busbw_gbps, op_data_bytes


@dataclass(frozen=True)
class RailShare:
    name: str
    bytes: int
    share: float


@dataclass(frozen=True)
class BenchRecord:
    op: str
    bytes: int          # per rank, as given on the command line (after rounding to whole elements)
    dtype: str
    ranks: int
    impl: str
    time_us: float      # median over iterations, max over ranks
    algbw_gbps: float
    busbw_gbps: float
    count: int = 0      # elements per rank
    iters: int = 0
    rails: List[RailShare] = field(default_factory=list)
    cpu_us: float = 0.0  # process CPU (all threads) per timed call, mean over ranks; 0: not measured

    @classmethod
    def measured(cls, *, op: str, num_bytes: int, dtype: str, ranks: int, impl: str, time_us: float,
                 count: int, iters: int, rails: Sequence[RailShare] = (), cpu_us: float = 0.0) -> "BenchRecord":
        """Builds a record, deriving the bandwidths from the time."""
        algbw = algbw_gbps(op_data_bytes(op, num_bytes, ranks), time_us)
        return cls(op=op, bytes=num_bytes, dtype=dtype, ranks=ranks, impl=impl, time_us=time_us,
                   algbw_gbps=algbw, busbw_gbps=busbw_gbps(op, algbw, ranks), count=count,
                   iters=iters, rails=list(rails), cpu_us=cpu_us)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "BenchRecord":
        rails = [RailShare(**rail) for rail in data.get("rails", [])]
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "rails"}
        return cls(rails=rails, **known)


def rail_shares(names: Sequence[str], byte_counts: Sequence[int]) -> List[RailShare]:
    """Per-rail bytes and their fraction of the total (all zero when nothing moved)."""
    if len(names) != len(byte_counts):
        raise ValueError(f"{len(names)} rail names but {len(byte_counts)} byte counts")
    total = sum(byte_counts)
    return [RailShare(name=name, bytes=int(count), share=(count / total) if total else 0.0)
            for name, count in zip(names, byte_counts)]


def write_json(path: str, records: Iterable[BenchRecord]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump([record.to_json() for record in records], out, indent=2)
        out.write("\n")


def read_json(path: str) -> List[BenchRecord]:
    with open(path, encoding="utf-8") as src:
        return [BenchRecord.from_json(item) for item in json.load(src)]
