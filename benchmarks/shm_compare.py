"""One host, 4 ranks: allreduce over the shm rail vs Nezha over loopback TCP vs Gloo on lo, in one
run (issue 17). Gloo is timed inside the shm job's processes (--baseline gloo); the TCP job runs right
after. Prints a markdown table for benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/shm_compare.py [--sizes 8,1K,64K,1M,16M,64M] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

RUNNER = [sys.executable, "-m", "nezha.runner", "-np", "4"]
BENCH = [sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--dtype", "float32",
         "--iters", "auto", "--warmup", "2"]


def run(label, json_path, sizes, rails=None, gloo=False):
    cmd = RUNNER + (["--rails", rails] if rails else []) + ["--"] + BENCH + [
        "--sizes", sizes, "--json", json_path, "--impl-label", label]
    if gloo:
        cmd += ["--baseline", "gloo", "--gloo-ifname", "lo", "--baseline-label", "gloo-lo"]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)


def fmt_time(us):
    return f"{us / 1000:.1f} ms" if us >= 10000 else f"{us:.0f} us"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="shm-compare-"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    records = run("nezha-shm", os.path.join(args.out, "shm.json"), args.sizes, rails="shm", gloo=True)
    records += run("nezha-loopback", os.path.join(args.out, "tcp.json"), args.sizes)
    impls = ["nezha-shm", "nezha-loopback", "gloo-lo"]
    by = {(r["impl"], r["bytes"]): r for r in records}
    sizes = sorted({r["bytes"] for r in records})
    print("\n| size | " + " | ".join(f"{i} time" for i in impls) + " | " +
          " | ".join(f"{i} busbw" for i in impls) + " | shm vs gloo |")
    print("|---:|" + "---:|" * (2 * len(impls) + 1))
    for b in sizes:
        row = [by.get((i, b)) for i in impls]
        times = [fmt_time(r["time_us"]) if r else "-" for r in row]
        bws = [f"{r['busbw_gbps']:.3f}" if r else "-" for r in row]
        ratio = f"{row[2]['time_us'] / row[0]['time_us']:.2f}x" if row[0] and row[2] else "-"
        print(f"| {b} | " + " | ".join(times) + " | " + " | ".join(bws) + f" | {ratio} |")


if __name__ == "__main__":
    main()
