"""Iteration counts and per-iteration timing.

Every rank must run the same number of iterations (each one is a collective), so `--iters auto`
derives the count from the warm-up time agreed over ranks (the max), never from a local clock.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

AUTO_TARGET_S = 1.0
AUTO_MIN_ITERS = 5
AUTO_MAX_ITERS = 200


@dataclass(frozen=True)
class IterationPolicy:
    """`iters` fixed, or None for auto (repeat for about `target_s`, within [min_iters, max_iters])."""
    iters: Optional[int] = None
    warmup: int = 2
    target_s: float = AUTO_TARGET_S
    min_iters: int = AUTO_MIN_ITERS
    max_iters: int = AUTO_MAX_ITERS

    @property
    def is_auto(self) -> bool:
        return self.iters is None

    def timed_iterations(self, warmup_time_us: float) -> int:
        """How many timed iterations to run, given the agreed per-iteration warm-up time."""
        if self.iters is not None:
            return self.iters
        if warmup_time_us <= 0:
            return self.max_iters
        wanted = math.ceil(self.target_s * 1e6 / warmup_time_us)
        return max(self.min_iters, min(self.max_iters, wanted))


def parse_iters(text: str) -> Optional[int]:
    """"auto" -> None, "N" -> N (N >= 1)."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"bad --iters {text!r}: expected a positive integer or 'auto'") from None
    if value < 1:
        raise ValueError(f"bad --iters {text!r}: must be >= 1")
    return value


def time_iterations(step: Callable[[], object], iterations: int) -> List[float]:
    """Runs `step` `iterations` times and returns each run's wall time in microseconds."""
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        step()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def median_us(samples: List[float]) -> float:
    if not samples:
        raise ValueError("no timing samples")
    return float(statistics.median(samples))
