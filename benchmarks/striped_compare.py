"""Broadcast, allgather, reducescatter and alltoall over two rails against each rail alone, MPTCP and
Gloo, on the testbed, in one run (issue 18): 4 hosts, float32, 1 MB and 64 MB; two 1 Gbit/s rails,
then 1 Gbit/s + 250 Mbit/s. Prints a markdown table per case for benchmarks/STRIPED.md. Needs root.

    .venv/bin/python benchmarks/striped_compare.py [--ops broadcast,allgather,reducescatter,alltoall]
        [--sizes 1M,64M] [--out DIR] [--planned] [--only-striped]

`--planned` adds `nezha-2rails-planned`: both rails with NEZHA_BALANCE_BYTES=0 (each rail keeps the
share the cost model gave it; `nezha-2rails` re-splits while the operation runs). `--only-striped`
runs just the two-rail jobs (no single rails, MPTCP or Gloo).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

BENCH = [sys.executable, "-m", "nezha.bench", "--dtype", "float32", "--iters", "auto", "--warmup", "2"]
CASES = [("two 1 Gbit/s rails", ["1gbit", "1gbit"]), ("1 Gbit/s + 250 Mbit/s", ["1gbit", "250mbit"])]


def runs(subnets, planned=False, only_striped=False):
    """(label, rails spec, Gloo interfaces or None, extra environment): Gloo is timed inside the
    first job."""
    both = f"{subnets[0]},{subnets[1]}"
    out = [("nezha-2rails", both, None if only_striped else "rail0", {})]
    if planned:
        out.append(("nezha-2rails-planned", both, None, {"NEZHA_BALANCE_BYTES": "0"}))
    if not only_striped:
        out += [("nezha-rail0", subnets[0], None, {}),
                ("nezha-rail1", subnets[1], None, {}),
                ("nezha-mptcp", f"mptcp:{subnets[0]}", None, {})]
    return out


def run(tb, op, label, rails, gloo, json_path, sizes, extra_env):
    args = tb.nezharun_args()
    args[args.index("--rails") + 1] = rails
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(len(tb.hosts)), *args, "--", *BENCH,
           "--op", op, "--sizes", sizes, "--json", json_path, "--impl-label", label]
    if gloo:
        cmd += ["--baseline", "gloo", "--gloo-ifname", gloo, "--baseline-label", "gloo-" + gloo]
    env = {k: v for k, v in os.environ.items() if k != "NEZHA_BALANCE_BYTES"}
    env.update(extra_env)
    print("$ " + "".join(f"{k}={v} " for k, v in extra_env.items()) + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=900, env=env)
    with open(json_path) as f:
        return json.load(f)


def table(title, records, labels):
    by = {(r["op"], r["impl"], r["bytes"]): r["algbw_gbps"] for r in records}
    print(f"\n### {title}: algbw (Gbit/s)\n")
    print("| op | size | " + " | ".join(labels) + " | 2 rails / best single (or / planned) |")
    print("|---|---:|" + "---:|" * (len(labels) + 1))
    for op in sorted({r["op"] for r in records}):
        for b in sorted({r["bytes"] for r in records if r["op"] == op}):
            bw = [by.get((op, l, b)) for l in labels]
            singles = [x for l, x in zip(labels, bw) if l in ("nezha-rail0", "nezha-rail1") and x]
            if not singles:  # --only-striped: balanced against planned
                singles = [x for l, x in zip(labels, bw) if l == "nezha-2rails-planned" and x]
            ratio = f"{bw[0] / max(singles):.2f}" if bw[0] and singles else "-"
            print(f"| {op} | {b} | " + " | ".join(f"{x:.3f}" if x else "-" for x in bw) + f" | {ratio} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default="broadcast,allgather,reducescatter,alltoall")
    p.add_argument("--sizes", default="1M,64M")
    p.add_argument("--prefix", default="nzstripe")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="striped-compare-"))
    p.add_argument("--planned", action="store_true", help="add both rails with NEZHA_BALANCE_BYTES=0")
    p.add_argument("--only-striped", action="store_true", help="only the two-rail jobs")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from nezha.testbed import Testbed

    for title, rates in CASES:
        records = []
        with Testbed(hosts=4, rails=2, rates=rates, prefix=args.prefix) as tb:
            plan = runs(tb.rail_subnets, args.planned, args.only_striped)
            for op in args.ops.split(","):
                for i, (label, rails, gloo, extra_env) in enumerate(plan):
                    path = os.path.join(args.out, f"{rates[1]}-{op}-{i}.json")
                    records += run(tb, op, label, rails, gloo, path, args.sizes, extra_env)
        labels = [label for label, _, _, _ in plan] + ([] if args.only_striped else ["gloo-rail0"])
        table(title, records, labels)
        with open(os.path.join(args.out, f"{rates[1]}.json"), "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
