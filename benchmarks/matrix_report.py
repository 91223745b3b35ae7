"""RESULTS.md for the benchmark matrix: commands, one table per case, the targets and whether each
is met. Pure functions of the records, so they are tested on sample data."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from nezha.bench.records import BenchRecord
from nezha.bench.report import format_rails
from nezha.bench.sizes import format_size

from matrix_cases import Case

# Bandwidth targets are judged at a case's largest size: 64 MB in the full run, 16 MB with --quick.
# Below this the link is not the bottleneck and the figures say little about striping.
BANDWIDTH_MIN_BYTES = 16 * 1024 * 1024
LARGEST = None  # a target's size: the case's largest measured size


@dataclass
class CaseResult:
    case: Case
    records: List[BenchRecord] = field(default_factory=list)
    commands: List[str] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    traffic: Dict[str, List[int]] = field(default_factory=dict)  # run key -> tx bytes per rail interface

    def find(self, impl: str, num_bytes: int) -> Optional[BenchRecord]:
        for rec in self.records:
            if rec.impl == impl and rec.bytes == num_bytes:
                return rec
        return None

    def impls(self) -> List[str]:
        seen = [impl for impl in self.case.impls if any(r.impl == impl for r in self.records)]
        return seen + sorted({r.impl for r in self.records} - set(seen))

    def sizes(self) -> List[int]:
        return sorted({r.bytes for r in self.records})


# --- targets -------------------------------------------------------------------------------------
# Figures from DESIGN.md (this testbed, 4 hosts, 64 MB float32 allreduce): Gloo 0.95 Gbit/s busbw,
# MPTCP 1.33 Gbit/s on two 1 Gbit/s rails and 0.59 with one rail at 250 Mbit/s; the limit is the
# sum of the rails, 2.0 and 1.25 Gbit/s.

Verdict = Tuple[Optional[bool], str]   # (met, detail); met None = not measured


def _size_for(res: CaseResult, num_bytes: Optional[int]) -> Optional[int]:
    """`num_bytes`, or for LARGEST the case's largest size when it is big enough to judge bandwidth."""
    if num_bytes is not LARGEST:
        return num_bytes
    sizes = res.sizes()
    return sizes[-1] if sizes and sizes[-1] >= BANDWIDTH_MIN_BYTES else None


@dataclass(frozen=True)
class Target:
    case: str
    text: str
    check: Callable[[CaseResult], Verdict]


def _busbw_at_least(impl: str, floor: float) -> Callable[[CaseResult], Verdict]:
    def check(res: CaseResult) -> Verdict:
        size = _size_for(res, LARGEST)
        rec = res.find(impl, size) if size else None
        if rec is None:
            return None, f"{impl}: no size >= {format_size(BANDWIDTH_MIN_BYTES)} measured"
        return rec.busbw_gbps >= floor, \
            f"{impl} at {format_size(size)}: {rec.busbw_gbps:.3f} Gbit/s (target >= {floor:.3f})"
    return check


def _faster_than(impl: str, other: str) -> Callable[[CaseResult], Verdict]:
    def check(res: CaseResult) -> Verdict:
        size = _size_for(res, LARGEST)
        ours, theirs = (res.find(impl, size), res.find(other, size)) if size else (None, None)
        if ours is None or theirs is None:
            return None, "not measured"
        return ours.busbw_gbps >= theirs.busbw_gbps, (
            f"at {format_size(size)}: {impl} {ours.busbw_gbps:.2f} vs {other} "
            f"{theirs.busbw_gbps:.2f} Gbit/s")
    return check


def _busbw_at_size(impl: str, size: int, floor: float) -> Callable[[CaseResult], Verdict]:
    def check(res: CaseResult) -> Verdict:
        rec = res.find(impl, size)
        if rec is None:
            return None, f"{impl} at {format_size(size)} not measured"
        return rec.busbw_gbps >= floor, \
            f"{impl} at {format_size(size)}: {rec.busbw_gbps:.3f} Gbit/s (target >= {floor:.2f})"
    return check


def _latency_ratio(impl: str, other: str, sizes: Sequence[int],
                   max_ratio: float) -> Callable[[CaseResult], Verdict]:
    def check(res: CaseResult) -> Verdict:
        details, met = [], True
        for num_bytes in sizes:
            ours, theirs = res.find(impl, num_bytes), res.find(other, num_bytes)
            if ours is None or theirs is None:
                return None, f"{format_size(num_bytes)} not measured for both"
            met = met and ours.time_us <= max_ratio * theirs.time_us
            details.append(f"{format_size(num_bytes)}: {ours.time_us:.0f} vs {theirs.time_us:.0f} us")
        return met, "; ".join(details)
    return check


def _vs_best_single_rail(impl: str, singles: Sequence[str], factor: float,
                         min_bytes: int) -> Callable[[CaseResult], Verdict]:
    def check(res: CaseResult) -> Verdict:
        worst, met = None, True
        for size in res.sizes():
            if size < min_bytes:
                continue
            ours = res.find(impl, size)
            best = max((r.busbw_gbps for s in singles if (r := res.find(s, size))), default=None)
            if ours is None or best is None:
                return None, f"{format_size(size)} not measured"
            ratio = ours.busbw_gbps / best if best else float("inf")
            met = met and ratio >= factor
            if worst is None or ratio < worst[1]:
                worst = (size, ratio)
        if worst is None:
            return None, "no size >= 1M measured"
        return met, f"lowest ratio {worst[1]:.2f} x the best single rail, at {format_size(worst[0])}"
    return check


MB = 1 << 20
# The targets of issue #3, case by case (Gloo and MPTCP are measured in the same run).
TARGETS: Tuple[Target, ...] = (
    Target("a", "two 1 Gbit/s rails, 64 MB busbw >= 1.85 Gbit/s",
           _busbw_at_least("nezha-2rails", 1.85)),
    Target("a", "two 1 Gbit/s rails, 1 MB busbw >= 1.5 Gbit/s",
           _busbw_at_size("nezha-2rails", MB, 1.5)),
    Target("b", "1 Gbit/s + 250 Mbit/s, 64 MB busbw >= 1.12 Gbit/s",
           _busbw_at_least("nezha-2rails", 1.12)),
    Target("a", "any size >= 1 MB: >= 0.95 x the best single rail",
           _vs_best_single_rail("nezha-2rails", ("nezha-rail0", "nezha-rail1"), 0.95, MB)),
    Target("b", "any size >= 1 MB: >= 0.95 x the best single rail",
           _vs_best_single_rail("nezha-2rails", ("nezha-rail0", "nezha-rail1"), 0.95, MB)),
    Target("c", "unshaped, 8 B / 1 KB / 64 KB median latency <= 1/3 of Gloo's",
           _latency_ratio("nezha-2rails", "gloo-rail0", (8, 1024, 65536), 1 / 3)),
    Target("c", "unshaped, 64 MB busbw >= Gloo's",
           _faster_than("nezha-2rails", "gloo-rail0")),
    Target("d", "loopback, 4 ranks, 64 MB: nezha at least as fast as Gloo (issue #2)",
           _faster_than("nezha-loopback", "gloo-lo")),
)


def evaluate_targets(results: Sequence[CaseResult]) -> List[Tuple[Target, Verdict]]:
    by_case = {res.case.key: res for res in results}
    out = []
    for target in TARGETS:
        res = by_case.get(target.case)
        out.append((target, target.check(res) if res else (None, "case not run")))
    return out


# --- rendering -----------------------------------------------------------------------------------

def _markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _time_text(time_us: float) -> str:
    return f"{time_us / 1000:.1f} ms" if time_us >= 10_000 else f"{time_us:.0f} us"


def case_tables(res: CaseResult) -> List[str]:
    """Two tables side by side per impl: busbw (Gbit/s) and median time; then the rail split."""
    impls, sizes = res.impls(), res.sizes()
    if not sizes:
        return ["_no results_"]
    lines = ["busbw (Gbit/s):", ""]
    lines += _markdown_table(["size"] + impls, [
        [format_size(n)] + [f"{r.busbw_gbps:.3f}" if (r := res.find(i, n)) else "-" for i in impls]
        for n in sizes])
    lines += ["", "time (median over iterations, max over ranks):", ""]
    lines += _markdown_table(["size"] + impls, [
        [format_size(n)] + [_time_text(r.time_us) if (r := res.find(i, n)) else "-" for i in impls]
        for n in sizes])
    largest = sizes[-1]
    splits = [(i, r) for i in impls if (r := res.find(i, largest)) and len(r.rails) > 1]
    if splits:
        lines += ["", f"Rail split at {format_size(largest)} (bytes sent per rail, all ranks):", ""]
        lines += [f"- {impl}: {format_rails(rec.rails)}" for impl, rec in splits]
    if res.traffic:
        lines += ["", "Interface traffic per run (tx bytes on each rail interface, all hosts; a run "
                  "with a Gloo baseline counts both):", ""]
        lines += [f"- {key}: {traffic_text(counts)}" for key, counts in res.traffic.items()]
    return lines


def traffic_text(counts: Sequence[int]) -> str:
    """"rail0 1.20 GB (80%), rail1 0.30 GB (20%)"."""
    total = sum(counts)
    return ", ".join(f"rail{i} {n / 1e9:.2f} GB ({(n / total if total else 0) * 100:.0f}%)"
                     for i, n in enumerate(counts))


def render_results(results: Sequence[CaseResult], *, quick: bool, started: str, duration_s: float,
                   testbed: str) -> str:
    mark = {True: "met", False: "NOT met", None: "not measured"}
    lines = ["# Nezha benchmark matrix", "",
             f"Generated by `python benchmarks/run_matrix.py{' --quick' if quick else ''}` on {started} "
             f"({duration_s:.0f} s). Testbed: {testbed}. allreduce, float32, 4 ranks (one per host); "
             "busbw = algbw * 2(n-1)/n (nccl-tests). Gloo is torch.distributed's gloo backend timed in "
             "the same processes (`--baseline gloo`). Bandwidth targets are judged at each case's "
             "largest size (64 MB; 16 MB with --quick).", "",
             "## Targets", ""]
    rows = [[t.case, t.text, mark[met], detail] for t, (met, detail) in evaluate_targets(results)]
    lines += ["| case | target | result | measured |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    for res in results:
        rates = ", ".join(f"rail{i} {rate}" for i, rate in enumerate(res.case.rates))
        lines += ["", f"## Case ({res.case.key}): {res.case.title}", "", f"Shaping: {rates}.", ""]
        lines += case_tables(res)
        if res.errors:
            lines += ["", "Errors:", ""] + [f"- {err}" for err in res.errors]
        lines += ["", "Commands:", "", "```"] + res.commands + ["```"]
    return "\n".join(lines) + "\n"
