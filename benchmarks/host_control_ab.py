"""One host: small allreduces with negotiation through shared memory (the control channel's host path,
today's default) and through loopback TCP (NEZHA_SHM_CONTROL=0), against Gloo on lo timed in the same
job. The two configurations alternate, --runs times each, for every job size in --ranks; prints the
median of each (the slowest rank's per-size time, as nezha-bench reports it) and the ratio to Gloo,
and every run's figures, as markdown for benchmarks/SHM.md.

    .venv/bin/python benchmarks/host_control_ab.py [--ranks 2,4] [--runs 5] [--sizes 8,1K,64K]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CONFIGS = (("tcp", {"NEZHA_SHM_CONTROL": "0"}), ("shm", {"NEZHA_SHM_CONTROL": "1"}))


def one_job(ranks, sizes, env, json_path):
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(ranks), "--", sys.executable, "-m", "nezha.bench",
           "--op", "allreduce", "--dtype", "float32", "--iters", "auto", "--warmup", "20", "--sizes", sizes,
           "--baseline", "gloo", "--gloo-ifname", "lo", "--baseline-label", "gloo", "--json", json_path]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **env})
    with open(json_path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sizes", default="8,1K,64K")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="host-control-"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # times[(ranks, config, bytes)] = [us per run]; gloo[(ranks, config, bytes)] likewise (same job)
    times, gloo = {}, {}
    for ranks in (int(r) for r in args.ranks.split(",")):
        for run in range(args.runs):
            for name, env in CONFIGS:
                path = os.path.join(args.out, f"np{ranks}-{name}-{run}.json")
                for rec in one_job(ranks, args.sizes, env, path):
                    table = gloo if rec["impl"] == "gloo" else times
                    table.setdefault((ranks, name, rec["bytes"]), []).append(rec["time_us"])
    print("| ranks | size | nezha, TCP control | nezha, shm control (default) | Gloo (median of both jobs) | "
          "TCP vs Gloo | shm vs Gloo |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for (ranks, name, size) in sorted(k for k in times if k[1] == "tcp"):
        tcp = statistics.median(times[(ranks, "tcp", size)])
        shm = statistics.median(times[(ranks, "shm", size)])
        g = statistics.median(gloo[(ranks, "tcp", size)] + gloo[(ranks, "shm", size)])
        print(f"| {ranks} | {size} | {tcp:.0f} us | {shm:.0f} us | {g:.0f} us | 1/{g / tcp:.1f} | 1/{g / shm:.1f} |")
    print("\nEvery run (TCP / shm, us; each job's own Gloo in brackets):\n")
    for (ranks, name, size) in sorted(k for k in times if k[1] == "tcp"):
        runs = zip(times[(ranks, "tcp", size)], gloo[(ranks, "tcp", size)], times[(ranks, "shm", size)],
                   gloo[(ranks, "shm", size)])
        cells = "; ".join(f"{t:.0f} ({gt:.0f}) / {s:.0f} ({gs:.0f})" for t, gt, s, gs in runs)
        print(f"- {ranks} ranks, {size} B: {cells}")
    print(f"\nrecords: {args.out}")


if __name__ == "__main__":
    main()
