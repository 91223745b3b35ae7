#!/usr/bin/env python3
"""Reference measurements for validating the network simulator: allreduce latency/bandwidth and an
mlp46m training step on the network-namespace testbed, for H hosts x R ranks per host (default 1)
and two rail configurations, (A) two 1 Gbit/s rails and (B) 1 Gbit/s + 250 Mbit/s.

    /work/main/.venv/bin/python benchmarks/sim_validation.py [--hosts 4,8,16] [--cases A,B]
        [--ranks-per-host R] [--no-train] [--sizes LIST] [--tag T] [--out PATH]
        [--prefix nzsim]   # repo root, as root

With R > 1 every job runs R ranks on each testbed host (-np H*R, nezharun -H host:R): nezha adds a
shared-memory rail by itself and its allreduce goes hierarchical (docs/hierarchical.md); Gloo stays
a flat ring over rail0. Per-job files are then named h<H>r<R>-... (h<H>-... for R = 1), with
--tag T inserted after that prefix (h<H>r<R>-T-...) so reruns with other --sizes do not collide.

Per (hosts, case), on a freshly built testbed (torn down afterwards, also on errors and SIGTERM):
  bench-2rails   nezha-bench allreduce float32 on both rails, and Gloo on rail0 in the same job
  bench-rail0    nezha-bench on rail0 only (the single-rail reference)
  train-compute  mlp46m, batch 16, every rank stepping alone (no allreduce): the compute time
  train-nezha    mlp46m, batch 16, nezha.torch on both rails
The commands are those of benchmarks/run_matrix.py (matrix_cases.run_command) and
benchmarks/train_matrix.py (run_command, WORKLOADS[0]), with the host count and rates set here.
Per job: wall time, 1-minute load average before/after, the machine's CPU busy fraction over the
job (/proc/stat deltas), the lowest MemAvailable seen, bytes sent per rail interface, and the log
lines mentioning 'down', 'fail' (nezha's "rail ... failed on rank ...; continuing on ..."), 'timeout'
or 'timed out' (case-insensitive).

Raw per-job JSON and logs: benchmarks/out/sim-validation/; summary: benchmarks/out/sim_validation.json
(--out PATH to write it elsewhere). --no-train skips the two training jobs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/sim_validation.py` puts only benchmarks/ on the path
    sys.path.append(str(REPO_ROOT))

import matrix_cases  # noqa: E402
import train_matrix  # noqa: E402
from matrix_cases import Case, Run, replace_flag  # noqa: E402
from run_matrix import interface_tx_bytes, run_job  # noqa: E402

OUT_DIR = BENCH_DIR / "out" / "sim-validation"
SUMMARY_PATH = BENCH_DIR / "out" / "sim_validation.json"
SIZES = "8,1K,64K,256K,1M,4M,16M,64M"
RATE_CASES = {"A": ("1gbit", "1gbit"), "B": ("1gbit", "250mbit")}
JOB_TIMEOUT_S = 600.0          # per nezharun job (16 ranks on 2 cores are slow to start and to step)
DDP_PORT = 29710               # train_matrix.run_command's signature wants one; nezha/compute runs ignore it
FAILOVER_RE = re.compile(r"down|fail|timeout|timed out", re.IGNORECASE)  # "rail ... failed on rank"
MAX_FAILOVER_LINES = 30


def log(message: str) -> None:
    print(f"[sim_validation {time.strftime('%H:%M:%S')}] {message}", flush=True)


def use_hosts(hosts: int, rates, ranks_per_host: int = 1) -> None:
    """The reused command builders read their rank/host count (and train_matrix.bring_up its rates)
    from module constants fixed at 4 hosts, 1 Gbit/s: point them at this run's."""
    matrix_cases.RANKS = hosts * ranks_per_host
    train_matrix.HOSTS = hosts
    train_matrix.RATES = tuple(rates)


# --- what the machine did during a job -------------------------------------------------------------


def cpu_times() -> List[int]:
    """The aggregate `cpu` line of /proc/stat: user nice system idle iowait irq softirq steal ..."""
    with open("/proc/stat", encoding="ascii") as stat:
        return [int(v) for v in stat.readline().split()[1:]]


def cpu_fractions(before: List[int], after: List[int]) -> Dict[str, float]:
    """Busy (user+nice+system+irq+softirq), iowait and steal as fractions of all CPU time between two
    samples (guest time is already inside user, so only the first 8 fields are summed)."""
    delta = [a - b for a, b in zip(after[:8], before[:8])]
    total = sum(delta) or 1
    user, nice, system, idle, iowait, irq, softirq, steal = delta
    return {"cpu_busy": (user + nice + system + irq + softirq) / total,
            "cpu_iowait": iowait / total, "cpu_steal": steal / total}


def mem_available_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class MemoryLow:
    """Samples MemAvailable every second in a thread; `.lowest_mb` once stopped."""

    def __init__(self):
        self.lowest_mb = mem_available_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.wait(1.0):
            self.lowest_mb = min(self.lowest_mb, mem_available_mb())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def failover_lines(log_path: Path) -> List[str]:
    """Log lines that may report a rail going down, a failover or a timeout (the command line the
    log starts with is skipped)."""
    if not log_path.exists():
        return []
    lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[1:]
    hits = [line.strip() for line in lines if FAILOVER_RE.search(line)]
    return hits[:MAX_FAILOVER_LINES] + ([f"... {len(hits) - MAX_FAILOVER_LINES} more"]
                                        if len(hits) > MAX_FAILOVER_LINES else [])


def with_ranks(argv: List[str], testbed, ranks_per_host: int) -> List[str]:
    """A nezharun argv built for 1 rank per host (train_matrix.run_command), made to run
    `ranks_per_host` on each: -np H*R and -H host:R. Flags after `--` (the rank's) are untouched."""
    if ranks_per_host == 1:
        return argv
    cut = argv.index("--")
    launcher, rest = argv[:cut], argv[cut:]
    slots = testbed.nezharun_args(ranks_per_host)
    launcher = replace_flag(launcher, "-np", str(len(testbed.hosts) * ranks_per_host))
    launcher = replace_flag(launcher, "-H", slots[slots.index("-H") + 1])
    return launcher + rest


def stem_prefix(hosts: int, ranks_per_host: int, tag: str) -> str:
    """h8 (R = 1, as before), h8r4 for R ranks per host; '-tag' appended when given."""
    return f"h{hosts}" + (f"r{ranks_per_host}" if ranks_per_host != 1 else "") + (f"-{tag}" if tag else "")


def run_measured(testbed, stem: str, argv: List[str]) -> dict:
    """Runs one nezharun job (run_matrix.run_job: output to <stem>.log, bounded, stopped cleanly on
    timeout) and returns what the machine did meanwhile; 'json' is <stem>.json if the job wrote it."""
    json_path, log_path = OUT_DIR / f"{stem}.json", OUT_DIR / f"{stem}.log"
    job = {"job": stem, "command": shlex.join(argv), "load_before": list(os.getloadavg())}
    tx_before = interface_tx_bytes(testbed)
    cpu_before = cpu_times()
    started = time.monotonic()
    with MemoryLow() as memory:
        error = run_job(argv, log_path, JOB_TIMEOUT_S)
    job["wall_s"] = round(time.monotonic() - started, 2)
    job.update({k: round(v, 4) for k, v in cpu_fractions(cpu_before, cpu_times()).items()})
    job["load_after"] = list(os.getloadavg())
    job["mem_available_min_mb"] = round(memory.lowest_mb)
    job["tx_bytes_per_rail"] = [a - b for a, b in zip(interface_tx_bytes(testbed), tx_before)]
    job["failover_lines"] = failover_lines(log_path)
    if error is None and not json_path.exists():
        error = f"no JSON written (log {log_path})"
    job["error"] = error
    job["json"] = str(json_path) if error is None else None
    figures = f"{job['wall_s']:.0f} s, cpu_busy {job['cpu_busy']:.2f}, load {job['load_after'][0]:.1f}"
    log(f"  {stem}: {'FAILED: ' + error if error else 'ok'} ({figures})"
        + (f"; {len(job['failover_lines'])} failover/down/timeout lines" if job["failover_lines"] else ""))
    return job


# --- one (hosts, rates) case -------------------------------------------------------------------------


def job_fields(job: dict) -> dict:
    """The per-job figures each summary entry carries."""
    return {"job": job["job"], "wall_s": job["wall_s"], "cpu_busy": job["cpu_busy"],
            "cpu_steal": job["cpu_steal"], "load": job["load_before"][:1] + job["load_after"][:1],
            "mem_available_min_mb": job["mem_available_min_mb"], "tx_bytes_per_rail": job["tx_bytes_per_rail"],
            "failover_lines": job["failover_lines"], "error": job["error"]}


def bench_cases(testbed, hosts: int, key: str, rates, opts: argparse.Namespace) -> List[dict]:
    """The two nezha-bench jobs; one summary entry per implementation."""
    from nezha.bench.records import read_json

    subnets = testbed.rail_subnets
    runs = (Run("nezha-2rails", ",".join(subnets), "nezha-2rails", gloo_ifnames=testbed.interface(0)),
            Run("nezha-rail0", subnets[0], "nezha-rail0"))
    case = Case(key, f"{'+'.join(rates)} rails", tuple(rates), opts.sizes, runs)
    ranks_per_host = opts.ranks_per_host
    entries = []
    for run in runs:
        stem = f"{stem_prefix(hosts, ranks_per_host, opts.tag)}-{key}-bench-{run.key}"
        argv = matrix_cases.run_command(run, case, testbed.nezharun_args(ranks_per_host),
                                        str(OUT_DIR / f"{stem}.json"), quick=False)
        job = run_measured(testbed, stem, argv)
        records = read_json(job["json"]) if job["json"] else []
        for impl in run.impls:
            mine = sorted((r for r in records if r.impl == impl), key=lambda r: r.bytes)
            entries.append({"hosts": hosts, "ranks_per_host": ranks_per_host, "rates": list(rates), "case": key,
                            "impl": impl, "op": "allreduce", "dtype": "float32",
                            "records": [{"bytes": r.bytes, "time_us": round(r.time_us, 2),
                                         "busbw_gbps": round(r.busbw_gbps, 4),
                                         "algbw_gbps": round(r.algbw_gbps, 4), "iters": r.iters,
                                         "cpu_us": round(r.cpu_us, 2),
                                         "rail_bytes": {s.name: s.bytes for s in r.rails}}
                                        for r in mine],
                            **job_fields(job)})
        if records:
            top = max(r.bytes for r in records)
            log("    busbw at %d B: %s" % (top, ", ".join(f"{r.impl} {r.busbw_gbps:.3f} Gbit/s"
                                                        for r in records if r.bytes == top)))
    return entries


def training_case(testbed, hosts: int, key: str, rates, opts: argparse.Namespace) -> dict:
    """mlp46m: compute-only, then nezha.torch on both rails (train_matrix's flags, batch 16)."""
    work = train_matrix.WORKLOADS[0]
    assert work.model == "mlp46m" and work.batch == 16, work
    runs = {"compute": train_matrix.TrainRun("compute-only", "compute", (0,)),
            "nezha": train_matrix.TrainRun("nezha-2rails", "nezha", (0, 1))}
    ranks_per_host = opts.ranks_per_host
    entry = {"hosts": hosts, "ranks_per_host": ranks_per_host, "rates": list(rates), "case": key, "model": work.model,
             "batch_size": work.batch, "warmup_steps": work.warmup,
             "timed_steps": work.batches_per_iter * work.iters, "jobs": {}}
    results = {}
    for name, run in runs.items():
        stem = f"{stem_prefix(hosts, ranks_per_host, opts.tag)}-{key}-train-{run.key}"
        argv = with_ranks(train_matrix.run_command(run, work, testbed, OUT_DIR / f"{stem}.json", DDP_PORT),
                          testbed, ranks_per_host)
        job = run_measured(testbed, stem, argv)
        entry["jobs"][run.key] = job_fields(job)
        results[name] = json.loads(Path(job["json"]).read_text(encoding="utf-8")) if job["json"] else None
    compute, nezha = results["compute"], results["nezha"]
    params = (nezha or compute or {}).get("params")
    entry.update({
        "params": params, "gradient_bytes": 4 * params if params else None,
        "compute_only_step_s": compute["step_s"] if compute else None,
        "compute_only_samples_per_s": compute["img_sec_total"] if compute else None,
        "nezha_step_s": nezha["step_s"] if nezha else None,
        "samples_per_s": nezha["img_sec_total"] if nezha else None,
        "samples_per_s_conf": nezha["img_sec_conf_total"] if nezha else None,
        "nezha_comm_wait_share": nezha.get("comm_wait_share") if nezha else None,
        "nezha_losses": nezha.get("losses") if nezha else None,
    })
    if nezha and compute:
        entry["exposed_comm_s"] = nezha["step_s"] - compute["step_s"]
        log(f"    mlp46m: compute {compute['step_s']:.3f} s/step, nezha {nezha['step_s']:.3f} s/step, "
            f"{nezha['img_sec_total']:.1f} samples/s")
    return entry


def run_one(hosts: int, key: str, opts: argparse.Namespace, summary: dict) -> None:
    from nezha.testbed import Testbed

    rates = RATE_CASES[key]
    use_hosts(hosts, rates, opts.ranks_per_host)
    log(f"H={hosts} x {opts.ranks_per_host} ranks/host, case {key} ({'+'.join(rates)}): "
        f"bringing up the testbed, prefix {opts.prefix}")
    testbed = train_matrix.bring_up(Testbed, opts.prefix)  # waits while another testbed is up
    try:
        summary["cases"] += bench_cases(testbed, hosts, key, rates, opts)
        write_summary(summary, opts.out)
        if opts.train:
            summary["training"].append(training_case(testbed, hosts, key, rates, opts))
            write_summary(summary, opts.out)
    finally:
        log(f"H={hosts} case {key}: bringing the testbed down")
        testbed.down()


# --- summary ---------------------------------------------------------------------------------------


def git_state(path: Path) -> dict:
    def git(*args):
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True).stdout.strip()
    return {"rev": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def write_summary(summary: dict, path: Path = SUMMARY_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="4,8,16", help="comma list of host counts (default 4,8,16)")
    parser.add_argument("--cases", default="A,B", help="rate cases: A = 1gbit+1gbit, B = 1gbit+250mbit")
    parser.add_argument("--prefix", default="nzsim", help="testbed name prefix (default nzsim)")
    parser.add_argument("--ranks-per-host", type=int, default=1,
                        help="ranks on each testbed host (default 1; > 1: shm rail, hierarchical allreduce)")
    parser.add_argument("--no-train", dest="train", action="store_false", help="skip the training jobs")
    parser.add_argument("--sizes", default=SIZES, help=f"nezha-bench sizes (default {SIZES})")
    parser.add_argument("--tag", default="", help="inserted into per-job file names (h8r4-TAG-A-...)")
    parser.add_argument("--out", type=Path, default=SUMMARY_PATH,
                        help="summary JSON (default benchmarks/out/sim_validation.json)")
    args = parser.parse_args(argv)
    args.hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
    args.cases = [c.strip().upper() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.cases if c not in RATE_CASES]
    if unknown or any(h < 2 for h in args.hosts) or args.ranks_per_host < 1:
        parser.error(f"cases must be among {sorted(RATE_CASES)}, hosts >= 2 and ranks-per-host >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_.]*", args.tag):
        parser.error("--tag: letters, digits, '_' and '.' only")
    args.out = args.out.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from nezha.testbed import testbed_available
    import nezha

    ok, reason = testbed_available()
    if not ok:
        print(f"sim_validation: the testbed is not available: {reason}", file=sys.stderr)
        return 2
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    nezha_repo = Path(nezha.__file__).resolve().parent.parent
    started = time.monotonic()
    summary = {"generated": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "commit": git_state(REPO_ROOT)["rev"],
               "nezha_code": {"path": str(nezha_repo), **git_state(nezha_repo)},
               "command": shlex.join([sys.executable] + sys.argv),
               "machine": {"cpus": os.cpu_count(),
                           "mem_total_mb": round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20)},
               "ranks_per_host": args.ranks_per_host, "train": args.train,
               "sizes": args.sizes, "iters": "auto (about 1 s per size, 5 to 200), warmup 2",
               "busbw": "algbw x 2(n-1)/n (nccl-tests); time_us = median over iterations, max over ranks",
               "cases": [], "training": []}
    for hosts in args.hosts:
        for key in args.cases:
            run_one(hosts, key, args, summary)
    summary["duration_s"] = round(time.monotonic() - started)
    summary["nezha_code_at_end"] = git_state(nezha_repo)
    write_summary(summary, args.out)
    log(f"wrote {args.out} in {summary['duration_s']} s")
    failed = [e["job"] for e in summary["cases"] if e["error"]] + \
             [j["job"] for t in summary["training"] for j in t["jobs"].values() if j["error"]]
    if failed:
        log(f"failed jobs: {', '.join(sorted(set(failed)))}")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("sim_validation: interrupted; the testbed was brought down", file=sys.stderr)
        sys.exit(130)
