#!/usr/bin/env python3
"""How every cost grows with the job on one host (issue 42): init, memory, fds and collectives of
8 B to 4 MB, for nezha and for torch.distributed on Gloo, at each job size in turn.

    .venv/bin/python benchmarks/scale_one_host.py --ranks 8,16,32,64,128 --impls nezha,gloo \\
        --sizes 8,64K,4M --iters 20 --json benchmarks/out/scale_one_host.json --timeout 600

One `nezharun -np N python benchmarks/scale_worker.py` job per rank count and implementation; a job
that fails or runs past --timeout is recorded with the tail of its output and the rest go on.
Prints markdown tables, the growth factor between consecutive rank counts, and draws a log-log
plot (--plot) when matplotlib imports. `--report A.json B.json` prints and plots from recorded runs
(e.g. each implementation's series run alone) without running anything.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nezha.bench.sizes import format_size, parse_sizes

BENCH_DIR = Path(__file__).resolve().parent
WORKER = BENCH_DIR / "scale_worker.py"
ERROR_TAIL_CHARS = 3000
STOP_GRACE_S = 20  # nezharun stops its ranks on SIGTERM; it is killed only if it has not by then


def nezharun_command():
    beside = Path(sys.executable).parent / "nezharun"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "nezha.runner"]


def run_job(impl, ranks, args, json_path):
    """Runs one job; returns its record (the worker's, plus wall time) or a failure record."""
    argv = nezharun_command() + ["-np", str(ranks), "--", sys.executable, str(WORKER),
                                 "--impl", impl, "--sizes", args.sizes, "--iters", str(args.iters),
                                 "--ops", args.ops, "--json", str(json_path)]
    started = time.perf_counter()
    # Same process group as the driver: a Ctrl-C reaches nezharun too, which stops its ranks.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=args.timeout)
        error = None if proc.returncode == 0 else f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        proc.terminate()  # the ranks run in sessions of their own: only nezharun can stop them
        try:
            output, _ = proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        error = f"timeout expired after {args.timeout:g} s"
    wall_s = time.perf_counter() - started
    if error is None and not json_path.exists():
        error = "the worker wrote no record"
    if error:
        return {"impl": impl, "ranks": ranks, "wall_s": wall_s, "error": error,
                "output_tail": output[-ERROR_TAIL_CHARS:], "command": argv}
    record = json.loads(json_path.read_text())
    record["wall_s"] = wall_s
    return record


def op_time(record, op, size):
    for entry in record.get("ops", ()):
        if entry["op"] == op and entry["bytes"] == size:
            return entry["time_us"]
    return None


def fmt(value, unit=""):
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:.0f}{unit}"
    return f"{value:.3g}{unit}"


def ratio(a, b):
    return fmt(a / b, "x") if a is not None and b else "—"


# (column, record field) of the per-job table
JOB_COLUMNS = (("wall s", "wall_s"), ("slowest rank's init s", "init_s"),
               ("start skew s", "start_skew_s"),
               ("store wait s", "store_wait_s"), ("RSS max MB", "rss_mb_max"),
               ("RSS mean MB", "rss_mb_mean"), ("RSS init MB", "rss_init_mb_max"),
               ("fds max", "fds_max"), ("fds mean", "fds_mean"), ("/dev/shm", "shm_entries"),
               ("shm segs", "shm_segments_max"), ("shm mapped MB", "shm_mapped_mb_max"))


def print_table(title, header, rows):
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def print_tables(records, rank_counts, impls, sizes, ops):
    by_key = {(r["impl"], r["ranks"]): r for r in records}
    cols = ["init s"] + [f"{format_size(s)}B µs" for s in sizes]
    header = ["ranks"] + [f"{impl} {c}" for impl in impls for c in cols]
    if len(impls) == 2:
        header += [f"{impls[0]}/{impls[1]} {c.split()[0]}" for c in cols]
    for op in ops:
        rows = []
        for n in rank_counts:
            row, values = [str(n)], {}
            for impl in impls:
                rec = by_key.get((impl, n), {})
                values[impl] = [rec.get("init_after_last_s")] + [op_time(rec, op, s) for s in sizes]
                row += [fmt(v) for v in values[impl]] if "error" not in rec else \
                    ["failed: " + rec["error"]] + [""] * len(sizes)
            if len(impls) == 2:
                row += [ratio(a, b) for a, b in zip(values[impls[0]], values[impls[1]])]
            rows.append(row)
        print_table(f"{op} (init: from the last rank's call to the last return; times: slowest "
                    "rank's median)", header, rows)
    cpu_rows = []
    for n in rank_counts:
        for impl in impls:
            rec = by_key.get((impl, n), {})
            cells = []
            for op in ops:
                for size in sizes:
                    entry = next((e for e in rec.get("ops", ()) if e["op"] == op and e["bytes"] == size), {})
                    cells.append(f"{fmt(entry.get('cpu_us_rank0'))} / {fmt(entry.get('cpu_us_others_mean'))}")
            cpu_rows.append([str(n), impl] + cells)
    print_table("CPU µs per call, rank 0 / the other ranks' mean (process CPU time, all threads)",
                ["ranks", "impl"] + [f"{op} {format_size(s)}B" for op in ops for s in sizes], cpu_rows)
    rows = [[str(n), impl] + [fmt(by_key.get((impl, n), {}).get(field)) for _, field in JOB_COLUMNS]
            for n in rank_counts for impl in impls]
    print_table("per job", ["ranks", "impl"] + [c for c, _ in JOB_COLUMNS], rows)


def print_growth(records, rank_counts, impls, sizes, ops):
    """Factor by which each cost grows from one rank count to the next (the ranks' own factor:
    linear growth)."""
    by_key = {(r["impl"], r["ranks"]): r for r in records if "error" not in r}
    print("\n### growth between consecutive rank counts\n")
    for impl in impls:
        for small, large in zip(rank_counts, rank_counts[1:]):
            a, b = by_key.get((impl, small)), by_key.get((impl, large))
            if not a or not b:
                print(f"- {impl} {small}→{large}: a run failed")
                continue
            parts = [f"init {ratio(b['init_after_last_s'], a['init_after_last_s'])}",
                     f"slowest rank's init {ratio(b['init_s'], a['init_s'])}",
                     f"RSS {ratio(b['rss_mb_max'], a['rss_mb_max'])}",
                     f"fds {ratio(b['fds_max'], a['fds_max'])}",
                     f"shm mapped {ratio(b['shm_mapped_mb_max'], a['shm_mapped_mb_max'])}",
                     f"wall {ratio(b['wall_s'], a['wall_s'])}"]
            parts += [f"{op} {format_size(s)}B {ratio(op_time(b, op, s), op_time(a, op, s))}"
                      for op in ops for s in sizes]
            print(f"- {impl} {small}→{large}: " + ", ".join(parts))


def plot(records, rank_counts, impls, sizes, ops, path):
    """Log-log, one panel for init and one per op; a colour per size, a line style per impl."""
    if all("error" in r for r in records):
        print("\nno plot: no job succeeded")
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError as exc:
        print(f"\nno plot: matplotlib does not import ({exc})")
        return
    panels = ["init"] + list(ops)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for impl, style in zip(impls, ("-", "--")):
            done = sorted((r for r in records if r["impl"] == impl and "error" not in r),
                          key=lambda r: r["ranks"])
            xs = [r["ranks"] for r in done]
            if panel == "init":
                ax.plot(xs, [r["init_after_last_s"] for r in done], style, color="C0", marker="o",
                        label=impl)
                continue
            for i, size in enumerate(sizes):
                ax.plot(xs, [op_time(r, panel, size) for r in done], style, color=f"C{i}",
                        marker="o", label=f"{impl} {format_size(size)}B")
        unit = "s (last call to last return)" if panel == "init" else "µs (slowest rank)"
        ax.set(xscale="log", yscale="log", xlabel="ranks", ylabel=unit,
               title=panel)
        ax.set_xticks(rank_counts, [str(n) for n in rank_counts])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def report(args):
    """Tables, growth and plot from the records of earlier runs (--json files of this script)."""
    records = []
    for path in args.report:
        run = json.loads(Path(path).read_text())
        print(f"{path}: started {run['started']}, load average at start {run['loadavg_at_start']}")
        records += run["records"]
    rank_counts = sorted({r["ranks"] for r in records})
    impls = [i for i in ("nezha", "gloo") if any(r["impl"] == i for r in records)]
    done = [r for r in records if "error" not in r]
    sizes = sorted({e["bytes"] for r in done for e in r["ops"]})
    ops = [op for op in ("allreduce", "broadcast") if any(e["op"] == op for r in done for e in r["ops"])]
    print_tables(records, rank_counts, impls, sizes, ops)
    print_growth(records, rank_counts, impls, sizes, ops)
    plot(records, rank_counts, impls, sizes, ops, args.plot)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,16,32,64,128", help="comma list of job sizes")
    parser.add_argument("--impls", default="nezha,gloo", help="nezha, gloo or both")
    parser.add_argument("--sizes", default="8,64K,4M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--ops", default="allreduce,broadcast")
    parser.add_argument("--json", default=str(BENCH_DIR / "out" / "scale_one_host.json"))
    parser.add_argument("--plot", default=str(BENCH_DIR / "scale_one_host.png"))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job")
    parser.add_argument("--report", nargs="+", metavar="JSON",
                        help="print and plot the records of these earlier runs instead of running")
    args = parser.parse_args()
    if args.report:
        report(args)
        return
    rank_counts = [int(n) for n in args.ranks.split(",")]
    impls = [i for i in args.impls.split(",") if i]
    if not impls or set(impls) - {"nezha", "gloo"}:
        parser.error("--impls: a comma list of nezha and gloo")
    sizes = parse_sizes(args.sizes)
    ops = [op for op in args.ops.split(",") if op]

    # The load matters: on a shared machine the other jobs' CPU time shows up in every number.
    started, load = time.strftime("%Y-%m-%d %H:%M"), os.getloadavg()
    records = []
    with tempfile.TemporaryDirectory(prefix="scale_one_host.") as tmp:
        for n in rank_counts:
            for impl in impls:
                record = run_job(impl, n, args, Path(tmp) / f"{impl}-{n}.json")
                status = record.get("error") or f"init {record['init_after_last_s']:.3f} s"
                print(f"{impl:5} {n:4} ranks: {status} (wall {record['wall_s']:.1f} s)", flush=True)
                records.append(record)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"started": started, "argv": sys.argv[1:], "cpus": os.cpu_count(),
                   "loadavg_at_start": load, "records": records}, f, indent=1)
    print_tables(records, rank_counts, impls, sizes, ops)
    print_growth(records, rank_counts, impls, sizes, ops)
    plot(records, rank_counts, impls, sizes, ops, args.plot)
    print(f"records: {args.json}")


if __name__ == "__main__":
    main()
