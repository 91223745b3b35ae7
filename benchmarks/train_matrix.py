#!/usr/bin/env python3
"""Training benchmark of issue #5 (item 6) on the testbed: samples/s of nezha.torch against torch
DDP over Gloo, same models, batch, seeds and steps, and writes benchmarks/TRAINING.md (raw JSON and
logs in benchmarks/out/train-*).

    .venv/bin/python benchmarks/train_matrix.py            # from the repository root, as root
    .venv/bin/python benchmarks/train_matrix.py --render   # rewrite TRAINING.md from the last run

4 hosts, two 1 Gbit/s rails. Per model: a compute-only run (every rank steps alone, no allreduce:
the step's compute time under the same CPU sharing), one allreduce of the gradients' bytes with no
compute (nezha-bench on both rails and on rail 0, Gloo on rail 0), then nezha.torch on both rails
and on rail 0, DDP with GLOO_SOCKET_IFNAME=rail0 and =rail0,rail1. Every run is a nezharun job over
the testbed hosts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/train_matrix.py` puts only benchmarks/ on the path
    sys.path.append(str(REPO_ROOT))

from matrix_cases import replace_flag  # noqa: E402
from nezha.testbed import TestbedError  # noqa: E402
from run_matrix import interface_tx_bytes, run_job  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
SUMMARY_PATH = OUT_DIR / "train-matrix.json"
REPORT_PATH = BENCH_DIR / "TRAINING.md"
HOSTS, RAILS, RATES = 4, 2, ("1gbit", "1gbit")
RAIL_BITS_PER_S = 10**9
RUN_TIMEOUT_S = 180.0
MATRIX_BUDGET_S = 900.0
WAIT_FOR_TESTBED_S = 1800.0  # other engineers' benchmarks hold the testbed for up to ~15 minutes
DDP_BASE_PORT = 29610
# Two 1-thread ranks per core already: more threads would only spin against each other.
THREADS_PER_RANK = 1
# Step-by-step losses of two correct gradient averagings differ only by summation order.
LOSS_RTOL = 1e-3


@dataclass(frozen=True)
class Workload:
    model: str
    role: str
    batch: int
    warmup: int
    batches_per_iter: int
    iters: int


# Step counts keep the whole matrix near 10 minutes on a 2-core machine (4 ranks, 1 thread each).
WORKLOADS = (
    Workload("mlp46m", "communication-heavy", batch=16, warmup=2, batches_per_iter=3, iters=4),
    Workload("convnet", "compute-heavy", batch=8, warmup=2, batches_per_iter=2, iters=3),
)


@dataclass(frozen=True)
class TrainRun:
    key: str
    kind: str                      # "compute", "comm", "nezha" or "ddp"
    rail_indices: Sequence[int]    # nezharun --rails (nezha) / GLOO_SOCKET_IFNAME (ddp)


# The split's two halves first: compute with no allreduce, then the allreduce of the gradients'
# bytes with no compute (nezha-bench: nezha, and on one rail Gloo too, in the same job).
SPLIT_RUNS = (
    TrainRun("compute-only", "compute", (0,)),
    TrainRun("allreduce-only-2rails", "comm", (0, 1)),
    TrainRun("allreduce-only-rail0", "comm", (0,)),
)
TRAINING_RUNS = (
    TrainRun("nezha-2rails", "nezha", (0, 1)),
    TrainRun("ddp-rail0+rail1", "ddp", (0, 1)),
    TrainRun("nezha-rail0", "nezha", (0,)),
    TrainRun("ddp-rail0", "ddp", (0,)),
)
RUNS = SPLIT_RUNS + TRAINING_RUNS
# Which allreduce-only figure is each training run's communication alone. A single Gloo allreduce
# uses one pair, hence one NIC, whatever GLOO_SOCKET_IFNAME lists, so it stands for DDP on one rail
# only (DDP on both rails gets its spread from several buckets in flight).
ALLREDUCE_ALONE = {"nezha-2rails": ("allreduce-only-2rails", "nezha"),
                   "nezha-rail0": ("allreduce-only-rail0", "nezha"),
                   "ddp-rail0": ("allreduce-only-rail0", "gloo")}
DDP_KEYS = ("ddp-rail0", "ddp-rail0+rail1")


def log(message: str) -> None:
    print(f"[train_matrix {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_command(run: TrainRun, work: Workload, testbed, json_path: Path, port: int,
                python: str = sys.executable) -> List[str]:
    """The exact argv of one run: nezharun over the testbed hosts, the training script per rank."""
    rails = ",".join(testbed.rail_subnets[r] for r in run.rail_indices)
    launcher = [python, "-m", "nezha.runner", "-np", str(HOSTS),
                *replace_flag(testbed.nezharun_args(), "--rails", rails)]
    steps = ["--model", work.model, "--batch-size", str(work.batch),
             "--num-warmup-batches", str(work.warmup), "--num-batches-per-iter", str(work.batches_per_iter),
             "--num-iters", str(work.iters), "--num-threads", str(THREADS_PER_RANK), "--json", str(json_path)]
    if run.kind == "comm":
        bench = [python, "-m", "nezha.bench", "--op", "allreduce", "--sizes", str(4 * model_params(work.model)),
                 "--dtype", "float32", "--iters", "3", "--warmup", "1", "--json", str(json_path),
                 "--impl-label", "nezha"]
        if len(run.rail_indices) == 1:
            bench += ["--baseline", "gloo", "--gloo-ifname", testbed.interface(run.rail_indices[0]),
                      "--baseline-label", "gloo"]
        return launcher + ["--"] + bench
    if run.kind == "nezha":
        script = [python, str(REPO_ROOT / "examples" / "pytorch_synthetic_benchmark.py")]
    else:
        script = [python, str(BENCH_DIR / "ddp_synthetic_benchmark.py")]
        if run.kind == "compute":
            steps.append("--compute-only")
        else:
            ifnames = ",".join(testbed.interface(r) for r in run.rail_indices)
            steps += ["--master-addr", testbed.host_addr(0, 0), "--master-port", str(port),
                      "--gloo-ifname", ifnames]
    return launcher + ["--"] + script + steps


def run_matrix(prefix: str) -> dict:
    from nezha.testbed import Testbed, testbed_available

    ok, reason = testbed_available()
    if not ok:
        raise SystemExit(f"train_matrix: the testbed is not available: {reason}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    summary = {"started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "runs": []}
    log(f"bringing up the testbed: {HOSTS} hosts, {RAILS} rails at {'+'.join(RATES)}, prefix {prefix} "
        f"(waits while another testbed is up)")
    testbed = bring_up(Testbed, prefix)
    try:
        start = time.monotonic()  # the budget counts from here, not from waiting for the testbed
        deadline = start + MATRIX_BUDGET_S
        port = DDP_BASE_PORT
        for work in WORKLOADS:
            for run in RUNS:
                port += 1  # a fresh TCPStore port per DDP job: no TIME_WAIT surprises
                summary["runs"].append(run_one(testbed, work, run, port, deadline))
        summary["duration_s"] = time.monotonic() - start
    finally:
        log("bringing the testbed down")
        testbed.down()
    SUMMARY_PATH.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def bring_up(testbed_class, prefix: str, wait_s: float = WAIT_FOR_TESTBED_S):
    """The testbed, up; waits while another one is up (the machine lock only covers testbeds whose
    owner is alive: one left behind by a killed owner is seen by its addresses instead)."""
    deadline = time.monotonic() + wait_s
    while True:
        testbed = testbed_class(hosts=HOSTS, rails=RAILS, rates=list(RATES), prefix=prefix,
                                wait_for_other_s=max(1.0, deadline - time.monotonic()))
        try:
            return testbed.up()
        except TestbedError as exc:
            if "another testbed is up" not in str(exc) or time.monotonic() > deadline:
                raise
            log(f"waiting: {exc}")
            time.sleep(15)


def run_one(testbed, work: Workload, run: TrainRun, port: int, deadline: float) -> dict:
    stem = f"train-{work.model}-{run.key}"
    json_path, log_path = OUT_DIR / f"{stem}.json", OUT_DIR / f"{stem}.log"
    json_path.unlink(missing_ok=True)
    argv = run_command(run, work, testbed, json_path, port)
    entry = {"model": work.model, "run": run.key, "command": shlex.join(argv), "result": None,
             "error": None, "traffic": None, "wall_s": None, "load_before": os.getloadavg()[0]}
    left = deadline - time.monotonic()
    if left < 20:
        entry["error"] = "skipped: the matrix's time budget is spent"
        log(f"{stem}: skipped (time budget spent)")
        return entry
    tx_before = interface_tx_bytes(testbed)
    started = time.monotonic()
    error = run_job(argv, log_path, min(RUN_TIMEOUT_S, left))
    entry["wall_s"] = time.monotonic() - started
    entry["load_after"] = os.getloadavg()[0]  # ~4 of it is this run's own ranks
    entry["traffic"] = [after - before for after, before in zip(interface_tx_bytes(testbed), tx_before)]
    if error is None and not json_path.exists():
        error = f"no JSON written (log {log_path})"
    if error:
        entry["error"] = error
        log(f"{stem}: FAILED after {entry['wall_s']:.0f} s: {error}")
        return entry
    entry["result"] = json.loads(json_path.read_text(encoding="utf-8"))
    if run.kind == "comm":  # nezha-bench records: keep each implementation's time
        entry["result"] = {"allreduce_s": {r["impl"]: r["time_us"] / 1e6 for r in entry["result"]}}
        figures = ", ".join(f"{impl} {t:.2f} s" for impl, t in entry["result"]["allreduce_s"].items())
    else:
        figures = f"{entry['result']['img_sec_total']:.1f} samples/s, step {entry['result']['step_s']:.2f} s"
    log(f"{stem}: {figures} ({entry['wall_s']:.0f} s)")
    return entry


# --- the report ------------------------------------------------------------------------------------


def ideal_allreduce_s(params: int, rails: int, ranks: int = HOSTS) -> float:
    """A ring allreduce of the fp32 gradients at the rails' line rate: 2(n-1)/n of the bytes per rank."""
    return 4 * params * 2 * (ranks - 1) / ranks * 8 / (rails * RAIL_BITS_PER_S)


def fmt_ratio(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} x"


def traffic_text(traffic: Optional[List[int]]) -> str:
    if not traffic:
        return "-"
    total = sum(traffic)
    if total < 10**6:
        return "(< 1 MB)"
    unit, scale = ("GB", 1e9) if total >= 10**9 else ("MB", 1e6)
    return " / ".join(f"{b / scale:.2f} {unit} ({100 * b / total:.0f}%)" for b in traffic)


def model_params(model: str) -> int:
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    from pytorch_synthetic_benchmark import MODELS
    return sum(p.numel() for p in MODELS[model][0]().parameters())


def last_gradient(model: str):
    """(name, parameters) of the model's first layer: backward produces its gradients last, so
    their allreduce can never overlap with compute."""
    sys.path.insert(0, str(REPO_ROOT / "examples"))
    from pytorch_synthetic_benchmark import MODELS
    net = MODELS[model][0]()
    for name, module in net.named_modules():
        own = list(module.parameters(recurse=False))
        if own:
            return name, sum(p.numel() for p in own)
    raise ValueError(f"model {model!r} has no parameters")


class ModelResults:
    """The runs of one model, by run key, with the derived figures."""

    def __init__(self, work: Workload, entries: List[dict]):
        self.work = work
        self.entries = {e["run"]: e for e in entries if e["model"] == work.model}

    def result(self, key: str) -> Optional[dict]:
        entry = self.entries.get(key)
        return entry["result"] if entry else None

    def rate(self, key: str) -> Optional[float]:
        res = self.result(key)
        return res["img_sec_total"] if res else None

    @property
    def compute_s(self) -> Optional[float]:
        res = self.result("compute-only")
        return res["step_s"] if res else None

    @property
    def params(self) -> Optional[int]:
        return next((e["result"]["params"] for e in self.entries.values()
                     if e["result"] and "params" in e["result"]), None)

    def allreduce_alone_s(self, key: str) -> Optional[float]:
        """The run's communication with no compute (see ALLREDUCE_ALONE), or None."""
        if key not in ALLREDUCE_ALONE:
            return None
        comm_key, impl = ALLREDUCE_ALONE[key]
        res = self.result(comm_key)
        return res["allreduce_s"].get(impl) if res else None

    def best_ddp(self) -> Optional[str]:
        rated = [(self.rate(k), k) for k in DDP_KEYS if self.rate(k) is not None]
        return max(rated)[1] if rated else None

    def ratio(self, key: str, baseline: Optional[str]) -> Optional[float]:
        if baseline is None or self.rate(key) is None or self.rate(baseline) is None:
            return None
        return self.rate(key) / self.rate(baseline)


def render(summary: dict) -> str:
    results = [ModelResults(w, summary["runs"]) for w in WORKLOADS]
    lines = [
        "# Training benchmark: nezha.torch against torch DDP (Gloo)",
        "",
        f"Generated by `python benchmarks/train_matrix.py` on {summary['started']} "
        f"({summary.get('duration_s', 0):.0f} s). Testbed: {HOSTS} network namespaces (one rank each), "
        f"{RAILS} rails shaped to {' + '.join(RATES)} (tc tbf), launched with "
        "`nezharun --launcher 'ip netns exec {host}'`. The machine has 2 CPU cores for the 4 ranks: "
        f"every rank runs {THREADS_PER_RANK} torch thread, so compute is shared 2 ranks per core and "
        "the step times below are this machine's, not a cluster's.",
        "",
        "Both sides run the same models (defined once in examples/pytorch_synthetic_benchmark.py), "
        "the same per-rank batch, seeds, SGD learning rate (0.01 x ranks) and step counts; samples/s "
        "is rank 0's timed steps x 4 ranks (mean over iterations, +- 1.96 sigma). "
        "*compute* is the step time of the compute-only run (4 ranks at once, no allreduce); "
        "*exposed communication* = step - compute: the part of the gradient exchange not hidden "
        "behind backward (on this machine it also includes the CPU the exchange itself takes from "
        "the ranks' compute). *allreduce alone* is one allreduce of the gradients' bytes with no "
        "compute (nezha-bench; Gloo's stands for DDP on one rail only); *overlap* = compute + "
        "allreduce alone - step: positive when communication hides behind backward, negative when "
        "the two slow each other down (they share the 2 cores). "
        "Other processes share the machine too: *load* is the 1-minute load "
        "average before and after each run (about 4 of it is the run's own ranks).",
        "",
        "Issue #5 quotes DDP at 24.2 (one rail) and 35.3 (both rails) samples/s for mlp46m; the ratios "
        "below use the DDP figures measured in this same run, on the same loaded machine.",
        "",
    ]
    lines += render_targets(results[0])
    for res in results:
        lines += render_model(res)
    lines += render_losses(results)
    lines += ["## Commands", "", "```"]
    lines += [e["command"] for e in summary["runs"]]
    lines += ["```", ""]
    errors = [f"- {e['model']} {e['run']}: {e['error']}" for e in summary["runs"] if e["error"]]
    if errors:
        lines += ["## Errors", ""] + errors + [""]
    return "\n".join(lines)


def load_text(entry: dict) -> str:
    if entry.get("load_before") is None or entry.get("load_after") is None:
        return "-"
    return f"{entry['load_before']:.1f} / {entry['load_after']:.1f}"


def render_model(res: ModelResults) -> List[str]:
    work, params = res.work, res.params
    lines = [f"## {work.model} ({work.role})", ""]
    if params:
        lines.append(
            f"{params / 1e6:.1f}M parameters ({4 * params / 1e6:.0f} MB of fp32 gradients per step), batch "
            f"{work.batch} per rank, {work.warmup} warm-up + {work.iters} x {work.batches_per_iter} timed steps. "
            f"A ring allreduce of the gradients at line rate takes {ideal_allreduce_s(params, 1):.2f} s on one "
            f"1 Gbit/s rail and {ideal_allreduce_s(params, 2):.2f} s on two.")
        lines.append("")
    best = res.best_ddp()
    compute = res.compute_s
    compute_text = "-" if compute is None else f"{compute:.3f} s"
    alone = []
    for run in SPLIT_RUNS[1:]:
        r = res.result(run.key)
        if r:
            alone += [f"{impl} on {'both rails' if len(run.rail_indices) == 2 else 'rail0'} {t:.3f} s"
                      for impl, t in r["allreduce_s"].items()]
    lines += [f"The split's halves, each measured alone: compute (every rank stepping on its own, no "
              f"allreduce) {compute_text} per step; one allreduce of the gradients' bytes with no compute: "
              + (", ".join(alone) if alone else "not measured") + ".", ""]
    lines += ["| run | samples/s | step | compute | exposed communication | allreduce alone | overlap "
              "| vs DDP rail0 | vs best DDP | tx bytes rail0 / rail1 | load before / after |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for run in TRAINING_RUNS:
        entry = res.entries.get(run.key)
        if not entry or not entry["result"]:
            lines.append(f"| {run.key} | failed | | | | | | | | | |")
            continue
        r = entry["result"]
        exposed, comm_alone, overlap = "-", "-", "-"
        if compute is not None:
            comm = max(0.0, r["step_s"] - compute)
            exposed = f"{comm:.3f} s ({100 * comm / r['step_s']:.0f}%)"
        alone_s = res.allreduce_alone_s(run.key)
        if alone_s is not None:
            comm_alone = f"{alone_s:.3f} s"
            if compute is not None:
                overlap = f"{compute + alone_s - r['step_s']:+.3f} s"
        vs_rail0 = fmt_ratio(res.ratio(run.key, "ddp-rail0"))
        vs_best = fmt_ratio(res.ratio(run.key, best))
        lines.append(f"| {run.key} | {r['img_sec_total']:.1f} +-{r.get('img_sec_conf_total', 0):.1f} "
                     f"| {r['step_s']:.3f} s | {compute_text} | {exposed} | {comm_alone} | {overlap} "
                     f"| {vs_rail0} | {vs_best} | {traffic_text(entry['traffic'])} | {load_text(entry)} |")
    waits = [f"{k} {100 * res.result(k)['comm_wait_share']:.0f}%" for k in ("nezha-2rails", "nezha-rail0")
             if res.result(k) and "comm_wait_share" in res.result(k)]
    if waits:
        lines += ["", "Share of nezha.torch's step spent in `optimizer.step()` waiting for gradients "
                  "(the allreduce not overlapped with backward): " + ", ".join(waits) + "."]
    lines.append("")
    return lines


def render_targets(res: ModelResults) -> List[str]:
    """Issue #5's targets, all for the communication-heavy model on two 1 Gbit/s rails."""
    best = res.best_ddp()
    targets = [
        ("nezha.torch on both rails >= 1.4 x the better DDP", "nezha-2rails", best, 1.4, 2),
        ("nezha.torch on both rails >= 2.0 x DDP on one rail", "nezha-2rails", "ddp-rail0", 2.0, 2),
        ("nezha.torch on one rail >= 1.0 x DDP on one rail", "nezha-rail0", "ddp-rail0", 1.0, 1),
    ]
    lines = [f"## Targets ({res.work.model}, {res.work.role})", "",
             "| target | result | measured | why |", "|---|---|---|---|"]
    for text, key, baseline, factor, rails in targets:
        ratio = res.ratio(key, baseline)
        if ratio is None:
            lines.append(f"| {text} | not measured | - | a run failed (see Errors) |")
            continue
        verdict = "met" if ratio >= factor else "NOT met"
        measured = (f"{key} {res.rate(key):.1f} vs {baseline} {res.rate(baseline):.1f} samples/s = "
                    f"{ratio:.2f} x")
        lines.append(f"| {text} | {verdict} | {measured} | {explain(res, key, baseline, rails, factor)} |")
    lines.append("")
    return lines


def explain(res: ModelResults, key: str, baseline: str, rails: int, factor: float) -> str:
    """The step budget behind a ratio: compute, nezha's exposed communication against the line-rate
    allreduce, and the best ratio the compute time allows at all."""
    step, base_step, compute, params = (res.result(key)["step_s"], res.result(baseline)["step_s"],
                                        res.compute_s, res.params)
    if compute is None or params is None:
        return "compute-only run missing"
    wire = ideal_allreduce_s(params, rails)
    exposed = max(0.0, step - compute)
    first_layer, first_params = last_gradient(res.work.model)
    last_wire = ideal_allreduce_s(first_params, rails)
    no_overlap = base_step / (compute + wire)
    best_overlap = base_step / (compute + last_wire)
    alone = res.allreduce_alone_s(key)
    alone_text = "" if alone is None else (f"; nezha's allreduce alone takes {alone:.2f} s, "
                                           f"{100 * wire / alone:.0f}% of line rate")
    return (f"{key} step {step:.2f} s = compute {compute:.2f} s + exposed communication {exposed:.2f} s "
            f"(the allreduce at line rate takes {wire:.2f} s{alone_text}); {baseline} step {base_step:.2f} s. "
            f"With the allreduce at line rate the ratio would be {no_overlap:.2f} x with no overlap, and "
            f"at most {best_overlap:.2f} x with all of it hidden behind backward except the first layer's "
            f"({first_layer}: {100 * first_params / params:.0f}% of the bytes, {last_wire:.2f} s), whose "
            f"gradients backward produces last (target {factor:.1f} x)")


def render_losses(results: List[ModelResults]) -> List[str]:
    """Correctness: rank 0's loss per step. Correct averaging on both sides gives the same losses
    (up to summation order); the compute-only run (no averaging) shows the check can tell."""
    lines = ["## Training correctness", "",
             "Every rank trains on its own batch, so the averaged gradient differs from each local one. "
             f"Two correct averagings give the same loss at every step (relative tolerance {LOSS_RTOL:g}); "
             "the compute-only run (local gradients only) is the control that differs.", "",
             "| model | run | loss first -> last | decreasing | max relative difference to ddp-rail0 |",
             "|---|---|---|---|---|"]
    for res in results:
        reference = res.result("ddp-rail0")
        for run in (SPLIT_RUNS[0],) + TRAINING_RUNS:
            r = res.result(run.key)
            if not r:
                continue
            losses = r["losses"]
            decreasing = "yes" if losses[-1] < losses[0] else "NO"
            if reference and run.key != "ddp-rail0" and len(reference["losses"]) == len(losses):
                diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference["losses"]))
                agrees = "agrees" if diff <= LOSS_RTOL else "differs"
                vs = f"{diff:.1e} ({agrees})"
            else:
                vs = "(reference)" if run.key == "ddp-rail0" else "-"
            lines.append(f"| {res.work.model} | {run.key} | {losses[0]:.4f} -> {losses[-1]:.4f} "
                         f"| {decreasing} | {vs} |")
    lines.append("")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="nztrain", help="testbed name prefix (default nztrain)")
    parser.add_argument("--render", action="store_true",
                        help=f"only rewrite {REPORT_PATH.name} from {SUMMARY_PATH.relative_to(REPO_ROOT)}")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        summary = json.loads(SUMMARY_PATH.read_text(encoding="utf-8"))
    else:
        summary = run_matrix(args.prefix)
    REPORT_PATH.write_text(render(summary), encoding="utf-8")
    log(f"wrote {REPORT_PATH}")
    return 1 if any(e["error"] for e in summary["runs"]) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("train_matrix: interrupted; the testbed was brought down", file=sys.stderr)
        sys.exit(130)
