"""The nccl-tests-style table rank 0 prints."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from nezha.bench.records import BenchRecord, RailShare
from nezha.bench.sizes import format_size


def format_rails(rails: Sequence[RailShare]) -> str:
    """"10.50.0.0/24 52% 10.51.0.0/24 48%"; "-" when the implementation has no rail counters; "none"
    when no data crossed a rail (small collectives done by rank 0 within negotiation)."""
    if not rails:
        return "-"
    if all(rail.bytes == 0 for rail in rails):
        return "none"
    return " ".join(f"{rail.name} {rail.share * 100:.0f}%" for rail in rails)


def _number(value: float) -> str:
    return f"{value:.2f}" if value < 1e5 else f"{value:.0f}"


def format_table(records: Sequence[BenchRecord],
                 baseline: Optional[Sequence[BenchRecord]] = None) -> str:
    """Aligned rows, one per size. With `baseline` (matched by op, bytes and dtype) adds its time,
    busbw and the ratio busbw(records) / busbw(baseline), i.e. how many times faster."""
    by_key: Dict[tuple, BenchRecord] = {(b.op, b.bytes, b.dtype): b for b in (baseline or [])}
    headers = ["size", "count", "dtype", "time(us)", "algbw(Gb/s)", "busbw(Gb/s)"]
    if baseline is not None:
        base_impl = baseline[0].impl if baseline else "baseline"
        headers += [f"{base_impl} time(us)", f"{base_impl} busbw", "ratio"]
    headers.append("rails")
    rows: List[List[str]] = []
    for rec in records:
        row = [format_size(rec.bytes), str(rec.count), rec.dtype, _number(rec.time_us),
               f"{rec.algbw_gbps:.3f}", f"{rec.busbw_gbps:.3f}"]
        if baseline is not None:
            base = by_key.get((rec.op, rec.bytes, rec.dtype))
            if base is None:
                row += ["-", "-", "-"]
            else:
                ratio = rec.busbw_gbps / base.busbw_gbps if base.busbw_gbps > 0 else float("inf")
                row += [_number(base.time_us), f"{base.busbw_gbps:.3f}", f"{ratio:.2f}x"]
        row.append(format_rails(rec.rails))
        rows.append(row)
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) if rows else len(headers[i])
              for i in range(len(headers))]
    # Every column right-aligned except the free-form rails column.
    def render(cells: List[str]) -> str:
        fixed = "  ".join(cell.rjust(widths[i]) for i, cell in enumerate(cells[:-1]))
        return f"{fixed}  {cells[-1]}"
    lines = [render(headers)] + [render(row) for row in rows]
    return "\n".join(lines)


def format_title(op: str, impl: str, ranks: int, dtype: str, iters_text: str) -> str:
    return f"# nezha-bench: op {op}, {ranks} ranks, dtype {dtype}, impl {impl}, iters {iters_text}"
