"""One host, 4 ranks: allreduce with the one-host rails with and without the automatic shm collective
rail (NEZHA_AUTO_SHM_COLL=0: the loopback TCP rail with the automatic shm lane, the ring; =1: that
and the collective rail `shmcoll`, the rail table giving each allreduce to one of them) vs Nezha over
loopback TCP alone (NEZHA_AUTO_SHM=0; --skip-loopback leaves it out) vs Gloo on lo, in one run;
--with-shm-rail adds `--rails shm` (the shm rail alone), --with-shmcoll-rail `--rails shmcoll` with
NEZHA_AUTO_SHM=0 (the collective rail alone). The knob is set either way, so the labels mean the same
whatever the default. Gloo is timed inside the first job's processes (--baseline gloo); the other
jobs run right after. Prints a markdown table for benchmarks/SHM.md, and which rail carried each size
in the job with both rails.

    .venv/bin/python benchmarks/shm_compare.py [--sizes 8,64K,1M,64M] [--out DIR]
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


def run(label, json_path, sizes, rails=None, gloo=False, env=None):
    cmd = RUNNER + (["--rails", rails] if rails else []) + ["--"] + BENCH + [
        "--sizes", sizes, "--json", json_path, "--impl-label", label]
    if gloo:
        cmd += ["--baseline", "gloo", "--gloo-ifname", "lo", "--baseline-label", "gloo-lo"]
    print("$ " + " ".join(f"{k}={v}" for k, v in (env or {}).items()) + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    with open(json_path) as f:
        return json.load(f)


def fmt_time(us):
    return f"{us / 1000:.1f} ms" if us >= 10000 else f"{us:.0f} us"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="shm-compare-"))
    p.add_argument("--with-shm-rail", action="store_true", help="also time --rails shm")
    p.add_argument("--skip-loopback", action="store_true", help="leave out NEZHA_AUTO_SHM=0")
    p.add_argument("--with-shmcoll-rail", action="store_true",
                   help="also time --rails shmcoll with NEZHA_AUTO_SHM=0 (the collective rail alone)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    records = run("nezha-ring", os.path.join(args.out, "ring.json"), args.sizes, gloo=True,
                  env={"NEZHA_AUTO_SHM_COLL": "0"})
    records += run("nezha-auto-shmcoll", os.path.join(args.out, "auto_shmcoll.json"), args.sizes,
                   env={"NEZHA_AUTO_SHM_COLL": "1"})
    impls = ["nezha-ring", "nezha-auto-shmcoll", "gloo-lo"]
    if not args.skip_loopback:
        records += run("nezha-loopback", os.path.join(args.out, "tcp.json"), args.sizes,
                       env={"NEZHA_AUTO_SHM": "0"})
        impls.insert(2, "nezha-loopback")
    if args.with_shmcoll_rail:
        records += run("nezha-shmcoll", os.path.join(args.out, "shmcoll.json"), args.sizes,
                       rails="shmcoll", env={"NEZHA_AUTO_SHM": "0"})
        impls.insert(2, "nezha-shmcoll")
    if args.with_shm_rail:
        records += run("nezha-shm", os.path.join(args.out, "shm.json"), args.sizes, rails="shm")
        impls.insert(2, "nezha-shm")
    by = {(r["impl"], r["bytes"]): r for r in records}
    sizes = sorted({r["bytes"] for r in records})
    print("\n| size | " + " | ".join(f"{i} time" for i in impls) + " | " +
          " | ".join(f"{i} busbw" for i in impls) + " | ring vs gloo | auto-shmcoll vs gloo |")
    print("|---:|" + "---:|" * (2 * len(impls) + 2))
    for b in sizes:
        row = [by.get((i, b)) for i in impls]
        times = [fmt_time(r["time_us"]) if r else "-" for r in row]
        bws = [f"{r['busbw_gbps']:.3f}" if r else "-" for r in row]
        gloo = row[impls.index("gloo-lo")]
        ratios = [f"{gloo['time_us'] / r['time_us']:.2f}x" if r and gloo else "-" for r in row[:2]]
        print(f"| {b} | " + " | ".join(times) + " | " + " | ".join(bws) + " | " + " | ".join(ratios) + " |")
    print("\nnezha-auto-shmcoll, bytes per rail (rank 0, the timed iterations and warm-up):")
    for b in sizes:
        r = by.get(("nezha-auto-shmcoll", b))
        if r:
            print(f"  {b}: " + ", ".join(f"{x['name']} {x['share']:.0%}" for x in r.get("rails", [])))


if __name__ == "__main__":
    main()
