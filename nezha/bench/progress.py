"""Progress on rank 0: a rich bar on a terminal, one line per finished size otherwise (logs, nezharun)."""
from __future__ import annotations

import sys
from typing import Optional, TextIO

from nezha.bench.records import BenchRecord
from nezha.bench.sizes import format_size


def describe(record: BenchRecord) -> str:
    return (f"{record.impl} {record.op} {format_size(record.bytes)} {record.dtype}: "
            f"{record.time_us:.1f} us, busbw {record.busbw_gbps:.3f} Gbit/s ({record.iters} iters)")


class ProgressReporter:
    """Use as a context manager; `starting()` before each measurement, `finished()` after."""

    def __init__(self, total: int, enabled: bool, stream: Optional[TextIO] = None):
        self._stream = stream or sys.stderr
        self._enabled = enabled
        self._total = total
        self._bar = None
        self._task = None

    def __enter__(self) -> "ProgressReporter":
        if self._enabled and self._stream.isatty():
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
                    TimeElapsedColumn
            except ImportError:
                return self
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(file=self._stream),
                                 transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("nezha-bench", total=self._total)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None

    def starting(self, impl: str, op: str, num_bytes: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=f"{impl} {op} {format_size(num_bytes)}")

    def finished(self, record: BenchRecord) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.advance(self._task)
        else:
            print(f"nezha-bench: {describe(record)}", file=self._stream, flush=True)
