"""What the measuring loop needs from an implementation under test (nezha or a baseline)."""
from __future__ import annotations

from typing import Callable, List, Protocol, Tuple

import numpy as np


class Step(Protocol):
    """One prepared collective (buffers allocated once, outside the timed loop)."""

    def run(self) -> None:
        """One iteration, as timed."""

    def run_checked(self) -> np.ndarray:
        """One iteration from pristine inputs, returning this rank's output for verification."""


class Backend(Protocol):
    impl: str

    def prepare(self, op: str, count: int, dtype: str) -> Step:
        ...

    def rail_bytes(self) -> Tuple[List[str], List[int]]:
        """Names and cumulative bytes sent per rail ([] when the implementation has no counters)."""


class CallableStep:
    """A Step from two closures; enough for every op of both backends."""

    def __init__(self, run: Callable[[], None], run_checked: Callable[[], np.ndarray]):
        self.run = run
        self.run_checked = run_checked
