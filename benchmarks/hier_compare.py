"""Testbed, 2 hosts x 2 ranks, two 1 Gbit/s rails: allreduce hierarchical (the default: shm added
by itself, each host reduce-scatters over shared memory, slices cross hosts striped over both rails)
vs flat (NEZHA_HIERARCHICAL=0: the ring over all 4 ranks striped over both rails) vs Gloo on both
rails' interfaces, timed inside the hierarchical job (--baseline gloo). Needs root (the testbed);
brings it up and down. Prints a markdown table for benchmarks/SHM.md.

    .venv/bin/python benchmarks/hier_compare.py [--sizes 1M,16M,64M] [--slots 2,2] [--out DIR]

--slots 3,1 places 3 ranks on the first host and 1 on the second (the uneven placement). --rates
none leaves the rails unshaped (veth at memory speed: the host phases' share of the time shows).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

BENCH = [sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--dtype", "float32",
         "--iters", "auto", "--warmup", "2"]


def run(testbed, label, json_path, sizes, slots, env=None, gloo=False):
    args = testbed.nezharun_args()
    args[args.index("-H") + 1] = ",".join(f"{h}:{n}" for h, n in zip(testbed.hosts, slots))
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(sum(slots)), *args, "--", *BENCH, "--sizes", sizes,
           "--json", json_path, "--impl-label", label]
    if gloo:
        ifnames = ",".join(testbed.interface(r) for r in range(testbed.rails))
        cmd += ["--baseline", "gloo", "--gloo-ifname", ifnames, "--baseline-label", "gloo-2rails"]
    print("$ " + " ".join(f"{k}={v} " for k, v in (env or {}).items()) + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    with open(json_path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1M,16M,64M")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="hier-compare-"))
    p.add_argument("--prefix", default="nzhier")
    p.add_argument("--slots", default="2,2", help="ranks per host, e.g. 3,1")
    p.add_argument("--rates", default="1gbit,1gbit", help="per rail tc tbf rate, or none (unshaped)")
    args = p.parse_args()
    rates = None if args.rates == "none" else args.rates.split(",")
    slots = [int(n) for n in args.slots.split(",")]
    os.makedirs(args.out, exist_ok=True)
    from nezha.testbed import Testbed
    with Testbed(hosts=len(slots), rails=2, rates=rates, prefix=args.prefix) as tb:
        records = run(tb, "nezha-hierarchical", os.path.join(args.out, "hier.json"), args.sizes, slots,
                      gloo=True)
        records += run(tb, "nezha-flat", os.path.join(args.out, "flat.json"), args.sizes, slots,
                       env={"NEZHA_HIERARCHICAL": "0"})
    impls = ["nezha-hierarchical", "nezha-flat", "gloo-2rails"]
    by = {(r["impl"], r["bytes"]): r for r in records}
    print("\n| size | " + " | ".join(f"{i} algbw Gbit/s" for i in impls) + " | hier / flat | hier / gloo |")
    print("|---:|" + "---:|" * (len(impls) + 2))
    for b in sorted({r["bytes"] for r in records}):
        row = [by.get((i, b)) for i in impls]
        bws = [f"{r['algbw_gbps']:.3f}" if r else "-" for r in row]
        ratio = lambda a, c: f"{a['algbw_gbps'] / c['algbw_gbps']:.2f}x" if a and c else "-"
        print(f"| {b} | " + " | ".join(bws) + f" | {ratio(row[0], row[1])} | {ratio(row[0], row[2])} |")


if __name__ == "__main__":
    main()
