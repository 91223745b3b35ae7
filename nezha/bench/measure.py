"""The measuring loop for one (implementation, op, size): verify, warm up, time, agree over ranks."""
from __future__ import annotations

import time
from typing import List, Protocol, Sequence

from nezha.bench.backend import Backend
from nezha.bench.records import BenchRecord, rail_shares
from nezha.bench.sizes import format_size
from nezha.bench.timing import IterationPolicy, median_us, time_iterations
from nezha.bench.workloads import element_count, expected_output, numpy_dtype, verify


class Coordinator(Protocol):
    """Cross-rank agreement the loop needs (served by nezha whatever the backend under test)."""
    rank: int
    world: int

    def barrier(self) -> None: ...
    def max_over_ranks(self, value: float) -> float: ...
    def sum_over_ranks(self, values: Sequence[int]) -> List[int]: ...


def measure(backend: Backend, coord: Coordinator, op: str, num_bytes: int, dtype: str,
            policy: IterationPolicy) -> BenchRecord:
    """Runs one size on every rank and returns the record every rank agrees on."""
    count = element_count(op, num_bytes, numpy_dtype(dtype).itemsize, coord.world)
    label = f"{backend.impl} {op} {format_size(num_bytes)} ({count} x {dtype}) on rank {coord.rank}"
    step = backend.prepare(op, count, dtype)

    # The first iteration is checked against the reference; it also serves as warm-up.
    expected = expected_output(op, coord.rank, coord.world, count, dtype)
    checked_us = time_iterations(lambda: verify(label, step.run_checked(), expected), 1)
    del expected
    warmup = time_iterations(step.run, policy.warmup)
    estimate_us = coord.max_over_ranks(median_us(warmup or checked_us)) if policy.is_auto else 0.0
    iterations = policy.timed_iterations(estimate_us)

    coord.barrier()
    names, before = backend.rail_bytes()
    # The process's CPU (every thread: the caller's and the engine's) over the timed calls: where
    # ranks share a machine's cores, their sum per call bounds the call's time (the simulator's
    # calibration fits it).
    cpu_start = time.process_time()
    samples = time_iterations(step.run, iterations)
    cpu_ns = int((time.process_time() - cpu_start) * 1e9)
    _, after = backend.rail_bytes()
    time_us = coord.max_over_ranks(median_us(samples))
    *moved, cpu_ns_all_ranks = coord.sum_over_ranks([a - b for a, b in zip(after, before)] + [cpu_ns])
    cpu_us = cpu_ns_all_ranks / 1e3 / coord.world / max(1, iterations)
    return BenchRecord.measured(op=op, num_bytes=count * numpy_dtype(dtype).itemsize, dtype=dtype,
                                ranks=coord.world, impl=backend.impl, time_us=time_us, count=count,
                                iters=iterations, rails=rail_shares(names, moved) if names else [],
                                cpu_us=cpu_us)
