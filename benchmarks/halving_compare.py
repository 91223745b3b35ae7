"""Testbed, H hosts x 1 rank, two shaped rails: allreduce with the pipelined ring
(NEZHA_HALVING_MAX_BYTES=0) against halving/doubling (NEZHA_HALVING_MAX_BYTES=1G: every share above
the log-step bound), on one rail and striped over both, in the same testbed run, alternating the two
algorithms so that load from elsewhere on the machine falls on both alike. Prints a markdown table
(slowest rank's median time, ring / halving) for benchmarks/SCALE.md. Needs root; brings the
testbed up and down.

    .venv/bin/python benchmarks/halving_compare.py [--hosts 8,16] [--sizes 64K,...,16M]
        [--rates 1gbit,1gbit] [--repeats 1] [--out DIR]

The size rule is per rail share: striped over two rails, a 1 MiB allreduce runs two shares of about
512 KiB, each choosing its algorithm by its own size.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

BENCH = [sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--dtype", "float32",
         "--iters", "auto", "--warmup", "2"]
ALGORITHMS = {"ring": "0", "halving": str(1 << 30)}


def run(testbed, rails, algorithm, json_path, sizes):
    args = testbed.nezharun_args()
    args[args.index("--rails") + 1] = ",".join(testbed.rail_subnets[:rails])
    label = f"{algorithm}-{rails}rail"
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(len(testbed.hosts)), "--start-timeout", "300", *args,
           "--", *BENCH, "--sizes", sizes, "--json", json_path, "--impl-label", label]
    env = {"NEZHA_HALVING_MAX_BYTES": ALGORITHMS[algorithm]}
    print(f"$ NEZHA_HALVING_MAX_BYTES={env['NEZHA_HALVING_MAX_BYTES']} " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **env}, timeout=1200)
    with open(json_path) as f:
        return json.load(f)


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} us"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", default="8,16")
    p.add_argument("--sizes", default="64K,128K,256K,512K,1M,2M,4M,16M")
    p.add_argument("--rates", default="1gbit,1gbit")
    p.add_argument("--rails", default="1,2", help="rail counts to run (the first N rails)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each algorithm; the best median counts")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="halving-compare-"))
    p.add_argument("--prefix", default="nzhalv")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from nezha.testbed import Testbed
    records = []
    for hosts in [int(h) for h in args.hosts.split(",")]:
        with Testbed(hosts=hosts, rails=2, rates=args.rates.split(","), prefix=args.prefix) as tb:
            for rails in [int(r) for r in args.rails.split(",")]:
                for rep in range(args.repeats):
                    for algorithm in ALGORITHMS:
                        path = os.path.join(args.out, f"h{hosts}-{rails}rail-{algorithm}-{rep}.json")
                        for rec in run(tb, rails, algorithm, path, args.sizes):
                            records.append({**rec, "hosts": hosts, "rails_used": rails, "algorithm": algorithm})
    with open(os.path.join(args.out, "all.json"), "w") as f:
        json.dump(records, f, indent=1)
    best = {}
    for r in records:
        key = (r["hosts"], r["rails_used"], r["bytes"], r["algorithm"])
        best[key] = min(best.get(key, float("inf")), r["time_us"])
    print(f"\nraw: {args.out}/all.json\n")
    print("| hosts x 1 | rails | size | ring | halving | ring / halving |")
    print("|---|---:|---:|---:|---:|---:|")
    for hosts, rails, size in sorted({k[:3] for k in best}):
        ring, halving = best.get((hosts, rails, size, "ring")), best.get((hosts, rails, size, "halving"))
        ratio = f"{ring / halving:.2f}x" if ring and halving else "-"
        print(f"| {hosts} x 1 | {rails} | {size} | {fmt_us(ring)} | {fmt_us(halving)} | {ratio} |")


if __name__ == "__main__":
    main()
