#!/usr/bin/env python3
"""Measures what `python -m nezha.sim calibrate` fits the testbed profile to, none of it a case of
the validation (benchmarks/sim_validation.py): the 8 B allreduce of 2 to 32 numpy ranks on one
host (negotiation alone), the 64 MB allreduce of 4 ranks on one host (the host lane: shared
memory), and nezha-bench on rail 0 of an unshaped 2- and 4-host testbed (the per-step cost and the
machine's byte budget).

    .venv/bin/python benchmarks/sim_calibration.py            # root; ~3 minutes
    .venv/bin/python -m nezha.sim calibrate --measured benchmarks/out/sim_calibration.json \\
        --out nezha/sim/profiles/testbed.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

from nezha.testbed import Testbed  # noqa: E402
from run_matrix import run_job  # noqa: E402

OUT_DIR = BENCH_DIR / "out" / "sim-calibration"
SUMMARY = BENCH_DIR / "out" / "sim_calibration.json"
UNSHAPED_SIZES = "8,64K,256K,1M,64M"
JOB_TIMEOUT_S = 300.0


def one_host(ranks: str, size: str, name: str) -> list:
    """The allreduce of `size` bytes of numpy ranks on one host (scale_one_host.py), per job size."""
    path = OUT_DIR / f"{name}.json"
    subprocess.run([sys.executable, str(BENCH_DIR / "scale_one_host.py"), "--ranks", ranks, "--impls", "nezha",
                    "--sizes", size, "--iters", "30", "--json", str(path), "--timeout", "300",
                    "--plot", str(OUT_DIR / f"{name}.png")],
                   check=True, cwd=REPO_ROOT)
    out = []
    for record in json.loads(path.read_text())["records"]:
        for entry in record.get("ops", ()):
            if entry["op"] == "allreduce":
                out.append({"ranks": record["ranks"], "bytes": entry["bytes"], "time_us": entry["time_us"]})
    return out


def unshaped(hosts: int) -> dict:
    testbed = Testbed(hosts, 1, rates="off", prefix="nzcal")
    testbed.up()
    try:
        path = OUT_DIR / f"unshaped-h{hosts}.json"
        argv = [sys.executable, "-m", "nezha.runner", "-np", str(hosts), *testbed.nezharun_args(), "--",
                sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--sizes", UNSHAPED_SIZES,
                "--dtype", "float32", "--iters", "auto", "--warmup", "2", "--json", str(path),
                "--impl-label", "nezha-rail0"]
        error = run_job(argv, OUT_DIR / f"unshaped-h{hosts}.log", JOB_TIMEOUT_S)
        if error:
            raise RuntimeError(f"unshaped {hosts}-host job failed: {error}")
    finally:
        testbed.down()
    records = [{"bytes": r["bytes"], "time_us": r["time_us"]} for r in json.loads(path.read_text())]
    return {"hosts": hosts, "rails": 1, "records": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4,8,16,32")
    parser.add_argument("--hosts", default="2,4")
    args = parser.parse_args()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    summary = {"generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=REPO_ROOT).stdout.strip(),
               "one_host_small": one_host(args.ranks, "8", "one_host_small"),
               "one_host_large": one_host("4", "64M", "one_host_large"),
               "unshaped": [unshaped(int(h)) for h in args.hosts.split(",")]}
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
