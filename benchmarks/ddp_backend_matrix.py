#!/usr/bin/env python3
"""DDP on the torch.distributed backend "nezha" against DDP on Gloo, nezha.torch's
DistributedOptimizer and no communication at all, on the testbed, in one run (issue 38 point 7).

    .venv/bin/python benchmarks/ddp_backend_matrix.py            # from the repository root, as root

4 hosts (network namespaces, one rank each), mlp46m (46M parameters, 184 MB of gradients per
step), batch 16 per rank; per rail configuration (2 x 1 Gbit/s, then 1 Gbit/s + 250 Mbit/s):
compute only, DDP on "nezha" over both rails, nezha.torch on both rails, DDP on Gloo over rail 0,
over rail 1 and over both (GLOO_SOCKET_IFNAME round-robins its pairs); then dist.all_reduce of
64 MB through the backend against nezha.allreduce on both rails (benchmarks/dist_allreduce_bench.py).
Prints the table and writes benchmarks/out/ddp-backend.json; the figures are in RESULTS.md.
"""
from __future__ import annotations

import datetime
import json
import shlex
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

from matrix_cases import replace_flag  # noqa: E402
from run_matrix import interface_tx_bytes, run_job  # noqa: E402
from train_matrix import HOSTS, bring_up, log  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
CONFIGS = (("2 x 1 Gbit/s", ("1gbit", "1gbit")), ("1 Gbit/s + 250 Mbit/s", ("1gbit", "250mbit")))
STEPS = ["--model", "mlp46m", "--batch-size", "16", "--num-warmup-batches", "2",
         "--num-batches-per-iter", "3", "--num-iters", "3", "--num-threads", "1"]
RUN_TIMEOUT_S = 240.0
# (key, script, rails it uses, extra flags): "ddp-gloo" runs name their NICs themselves.
RUNS = (
    ("compute-only", "ddp", (0,), ["--compute-only"]),
    ("ddp-nezha", "ddp", (0, 1), ["--backend", "nezha"]),
    ("nezha.torch", "example", (0, 1), []),
    ("ddp-gloo-rail0", "ddp-gloo", (0,), []),
    ("ddp-gloo-rail1", "ddp-gloo", (1,), []),
    ("ddp-gloo-rail0+rail1", "ddp-gloo", (0, 1), []),
)


def command(testbed, key, kind, rails, extra, json_path, port):
    subnets = ",".join(testbed.rail_subnets[r] for r in (0, 1) if r in rails or kind == "ddp-gloo")
    launcher = [sys.executable, "-m", "nezha.runner", "-np", str(HOSTS),
                *replace_flag(testbed.nezharun_args(), "--rails", subnets)]
    if kind == "example":
        script = [sys.executable, str(REPO_ROOT / "examples" / "pytorch_synthetic_benchmark.py")]
    else:
        script = [sys.executable, str(BENCH_DIR / "ddp_synthetic_benchmark.py")]
    flags = STEPS + extra + ["--json", str(json_path)]
    if kind == "ddp-gloo":
        flags += ["--master-addr", testbed.host_addr(0, 0), "--master-port", str(port),
                  "--gloo-ifname", ",".join(testbed.interface(r) for r in rails)]
    return launcher + ["--"] + script + flags


def main():
    from nezha.testbed import Testbed, testbed_available

    ok, reason = testbed_available()
    if not ok:
        raise SystemExit(f"ddp_backend_matrix: the testbed is not available: {reason}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    summary = {"started": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "configs": []}
    testbed = bring_up(Testbed, "nzddp")
    port = 29710
    try:
        for title, rates in CONFIGS:
            for rail, rate in enumerate(rates):
                testbed.set_rate(rail, rate)
            log(f"rails {title}")
            entry = {"rails": title, "runs": {}, "commands": []}
            for key, kind, rails, extra in RUNS:
                port += 1
                stem = f"ddp-backend-{rates[1]}-{key}"
                json_path, log_path = OUT_DIR / f"{stem}.json", OUT_DIR / f"{stem}.log"
                json_path.unlink(missing_ok=True)
                argv = command(testbed, key, kind, rails, extra, json_path, port)
                entry["commands"].append(shlex.join(argv))
                before = interface_tx_bytes(testbed)
                error = run_job(argv, log_path, RUN_TIMEOUT_S)
                traffic = [a - b for a, b in zip(interface_tx_bytes(testbed), before)]
                result = None if error else json.loads(json_path.read_text())
                entry["runs"][key] = {"result": result, "error": error, "traffic": traffic}
                log(f"  {key}: " + (error or "%.1f samples/s, step %.2f s, tx %s" % (
                    result["img_sec_total"], result["step_s"],
                    " / ".join("%.2f GB" % (t / 1e9) for t in traffic))))
            json_path = OUT_DIR / f"ddp-backend-{rates[1]}-allreduce.json"
            argv = [sys.executable, "-m", "nezha.runner", "-np", str(HOSTS),
                    *replace_flag(testbed.nezharun_args(), "--rails",
                                  ",".join(testbed.rail_subnets)), "--", sys.executable,
                    str(BENCH_DIR / "dist_allreduce_bench.py"), "--bytes", "64M", "--rounds", "5",
                    "--iters", "3", "--json", str(json_path)]
            entry["commands"].append(shlex.join(argv))
            error = run_job(argv, OUT_DIR / f"ddp-backend-{rates[1]}-allreduce.log", RUN_TIMEOUT_S)
            entry["allreduce"] = {"error": error,
                                  "result": None if error else json.loads(json_path.read_text())}
            log("  allreduce 64 MB: " + (error or ", ".join(
                "%s %.3f Gbit/s" % (r["impl"], r["busbw_gbps"])
                for r in entry["allreduce"]["result"]["records"])))
            summary["configs"].append(entry)
    finally:
        testbed.down()
    (OUT_DIR / "ddp-backend.json").write_text(json.dumps(summary, indent=1))
    print(render(summary))


def render(summary):
    lines = []
    for entry in summary["configs"]:
        runs = entry["runs"]
        rate = {k: r["result"]["img_sec_total"] for k, r in runs.items() if r["result"]}
        gloo = {k: v for k, v in rate.items() if k.startswith("ddp-gloo")}
        best = max(gloo, key=gloo.get) if gloo else None
        lines += ["", f"Rails {entry['rails']} (started {summary['started']}):", "",
                  "| run | samples/s | step | vs best Gloo DDP | vs nezha.torch | tx rail0 / rail1 |",
                  "|---|---:|---:|---:|---:|---|"]
        for key, r in runs.items():
            if not r["result"]:
                lines.append(f"| {key} | failed: {r['error']} | | | | |")
                continue
            v = r["result"]["img_sec_total"]
            lines.append("| %s | %.1f | %.2f s | %s | %s | %s |" % (
                key, v, r["result"]["step_s"],
                "%.2f x" % (v / rate[best]) if best else "-",
                "%.2f x" % (v / rate["nezha.torch"]) if "nezha.torch" in rate else "-",
                " / ".join("%.2f GB" % (t / 1e9) for t in r["traffic"])))
        ar = entry["allreduce"]["result"]
        if ar:
            lines.append("")
            lines.append("64 MB allreduce, 4 ranks, both rails: " + "; ".join(
                "%s %.1f ms (busbw %.3f Gbit/s)" % (r["impl"], r["time_us"] / 1e3, r["busbw_gbps"])
                for r in ar["records"]) + "; ratio %.3f" % ar["ratio"])
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--render"]:
        print(render(json.loads((OUT_DIR / "ddp-backend.json").read_text())))
    else:
        main()
