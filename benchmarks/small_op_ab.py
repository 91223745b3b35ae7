"""One host: small allreduces of two builds of nezha (two checkouts' interpreters, e.g. main's
virtual environment and a branch's) alternating in one run, Gloo on lo timed inside every job.
For every job size in --ranks, the two builds take turns, --runs times each; prints the median of
each (the slowest rank's per-size time, as nezha-bench reports it) and the ratio to Gloo, and every
run's figures, as markdown for benchmarks/SHM.md.

    .venv/bin/python benchmarks/small_op_ab.py --before /work/main/.venv/bin/python \\
        --after .venv/bin/python [--ranks 2,4] [--runs 5] [--sizes 8,1K,64K]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def one_job(python, ranks, sizes, json_path):
    cmd = [python, "-m", "nezha.runner", "-np", str(ranks), "--", python, "-m", "nezha.bench",
           "--op", "allreduce", "--dtype", "float32", "--iters", "auto", "--warmup", "20", "--sizes", sizes,
           "--baseline", "gloo", "--gloo-ifname", "lo", "--baseline-label", "gloo", "--json", json_path]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True, help="python of the build measured first in each pair")
    p.add_argument("--after", required=True, help="python of the other build")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sizes", default="8,1K,64K")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="small-op-"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    builds = (("before", args.before), ("after", args.after))
    times, gloo = {}, {}  # [(ranks, build, bytes)] = [us per run], Gloo's from the same jobs
    for ranks in (int(r) for r in args.ranks.split(",")):
        for run in range(args.runs):
            for name, python in builds:
                path = os.path.join(args.out, f"np{ranks}-{name}-{run}.json")
                for rec in one_job(python, ranks, args.sizes, path):
                    table = gloo if rec["impl"] == "gloo" else times
                    table.setdefault((ranks, name, rec["bytes"]), []).append(rec["time_us"])
    print("| ranks | size | nezha before | nezha after | Gloo (median of both jobs) | before vs Gloo | "
          "after vs Gloo |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    keys = sorted(k for k in times if k[1] == "before")
    for (ranks, _, size) in keys:
        b = statistics.median(times[(ranks, "before", size)])
        a = statistics.median(times[(ranks, "after", size)])
        g = statistics.median(gloo[(ranks, "before", size)] + gloo[(ranks, "after", size)])
        print(f"| {ranks} | {size} | {b:.0f} us | {a:.0f} us | {g:.0f} us | 1/{g / b:.1f} | 1/{g / a:.1f} |")
    print("\nEvery run (before / after, us; each job's own Gloo in brackets):\n")
    for (ranks, _, size) in keys:
        runs = zip(times[(ranks, "before", size)], gloo[(ranks, "before", size)],
                   times[(ranks, "after", size)], gloo[(ranks, "after", size)])
        cells = "; ".join(f"{b:.0f} ({gb:.0f}) / {a:.0f} ({ga:.0f})" for b, gb, a, ga in runs)
        print(f"- {ranks} ranks, {size} B: {cells}")
    print(f"\nrecords: {args.out}")


if __name__ == "__main__":
    main()
