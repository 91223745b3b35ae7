"""The ofi rail (libfabric's tcp provider) against the TCP rail on the testbed, in one run (issue 22):
4 hosts, two 1 Gbit/s shaped rails; one rail ofi(tcp) vs tcp, two rails tcp+ofi(tcp) vs tcp+tcp;
allreduce busbw at 1 MB and 64 MB. Prints a markdown table for benchmarks/OFI.md. Needs root.

    .venv/bin/python benchmarks/ofi_compare.py [--sizes 1M,64M] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

BENCH = [sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--dtype", "float32",
         "--iters", "auto", "--warmup", "2"]
# (label, rails spec built from the two rail subnets); the targets compare rows 1/0 and 3/2.
RUNS = [
    ("tcp", lambda s: s[0]),
    ("ofi(tcp)", lambda s: f"ofi:tcp;ofi_rxm@{s[0]}"),
    ("tcp+tcp", lambda s: f"{s[0]},{s[1]}"),
    ("tcp+ofi(tcp)", lambda s: f"{s[0]},ofi:tcp;ofi_rxm@{s[1]}"),
]


def run(tb, label, rails, json_path, sizes):
    args = tb.nezharun_args()
    args[args.index("--rails") + 1] = rails
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(len(tb.hosts)), *args, "--", *BENCH,
           "--sizes", sizes, "--json", json_path, "--impl-label", label]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=600)
    with open(json_path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1M,64M")
    p.add_argument("--prefix", default="nzofi")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="ofi-compare-"))
    p.add_argument("--variants", default="",
                   help="extra one-rail ofi runs, ';'-separated option sets joined by '|', e.g. "
                        "'window=16|chunk_bytes=4194304;window=4' (for tuning)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from nezha.testbed import Testbed

    runs = list(RUNS) + [(f"ofi(tcp);{v}", lambda s, v=v: f"ofi:tcp;ofi_rxm@{s[0]};{v}")
                         for v in args.variants.split("|") if v]
    records = []
    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"], prefix=args.prefix) as tb:
        for i, (label, spec) in enumerate(runs):
            records += run(tb, label, spec(tb.rail_subnets), os.path.join(args.out, f"run{i}.json"), args.sizes)
    by = {(r["impl"], r["bytes"]): r["busbw_gbps"] for r in records}
    labels = [label for label, _ in runs]
    print("\n| size | " + " | ".join(f"{l} busbw (Gbit/s)" for l in labels) +
          " | ofi(tcp) / tcp | tcp+ofi(tcp) / tcp+tcp |")
    print("|---:|" + "---:|" * (len(labels) + 2))
    for b in sorted({r["bytes"] for r in records}):
        bw = [by.get((l, b)) for l in labels]
        cells = [f"{x:.3f}" if x is not None else "-" for x in bw]
        one = f"{bw[1] / bw[0]:.2f}" if bw[0] and bw[1] else "-"
        two = f"{bw[3] / bw[2]:.2f}" if bw[2] and bw[3] else "-"
        print(f"| {b} | " + " | ".join(cells) + f" | {one} | {two} |")


if __name__ == "__main__":
    main()
