"""Grouped allgather, grouped reducescatter and a burst of broadcasts (broadcast_parameters) of many
small tensors on the testbed (issue 18, point 1: grouped variants fused as allreduce is): 4 hosts,
two 1 Gbit/s rails, float32. In one run: nezha fused (the default), nezha with fusion off
(NEZHA_FUSION_THRESHOLD=0: one operation per tensor), nezha fused on rail 0 alone, and Gloo (one
call per tensor, all in flight at once) on rail 0. Prints a markdown table for benchmarks/RESULTS.md.
Needs root.

    .venv/bin/python benchmarks/grouped_compare.py [--shapes 64x32K,16x256K] [--iters 10] [--rounds 3]
        [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SUFFIX = {"K": 1 << 10, "M": 1 << 20}


def parse_shape(text):
    count, size = text.lower().split("x")
    unit = SUFFIX.get(size[-1].upper(), 1)
    return int(count), int(size.rstrip("kKmM")) * unit


def run(tb, rails, label, shape, iters, out, extra_env=None, gloo=None):
    args = tb.nezharun_args()
    args[args.index("--rails") + 1] = rails
    path = os.path.join(out, f"{label}-{shape[0]}x{shape[1]}.json")  # rewritten by each round
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(len(tb.hosts)), *args, "--", sys.executable,
           os.path.join(HERE, "grouped_worker.py"), "--tensors", str(shape[0]), "--bytes", str(shape[1]),
           "--iters", str(iters), "--label", label, "--json", path]
    if gloo:
        cmd += ["--gloo", gloo]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_FUSION")}
    env.update(extra_env or {})
    print("$ " + "".join(f"{k}={v} " for k, v in (extra_env or {}).items()) + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=900, env=env)
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="64x32K,16x256K", help="TENSORSxBYTES per rank, comma-separated")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefix", default="nzg")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    from nezha.testbed import Testbed
    out = args.out or tempfile.mkdtemp(prefix="nezha-grouped-")
    os.makedirs(out, exist_ok=True)
    labels = ["nezha-fused", "nezha-unfused", "nezha-fused-rail0", "gloo"]
    rows = []
    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"], prefix=args.prefix) as tb:
        subnets = tb.rail_subnets
        for shape in map(parse_shape, args.shapes.split(",")):
            secs = {l: [] for l in labels}  # label -> one {op: seconds} per round
            for rnd in range(args.rounds):  # fused and unfused alternate: the machine's noise hits both
                fused = run(tb, ",".join(subnets), "nezha-fused", shape, args.iters, out,
                            gloo="rail0" if rnd == 0 else None)["seconds"]
                secs["nezha-fused"].append(fused["nezha-fused"])
                if rnd == 0:
                    secs["gloo"].append(fused["gloo"])
                    secs["nezha-fused-rail0"].append(
                        run(tb, subnets[0], "nezha-fused-rail0", shape, args.iters, out)["seconds"]["nezha-fused-rail0"])
                secs["nezha-unfused"].append(run(tb, ",".join(subnets), "nezha-unfused", shape, args.iters, out,
                                                 {"NEZHA_FUSION_THRESHOLD": "0"})["seconds"]["nezha-unfused"])
            rows.append((shape, secs))
    print(f"\n### Grouped collectives of small tensors, 4 hosts, two 1 Gbit/s rails: ms per call (median of "
          f"{args.iters}; nezha-fused and nezha-unfused: {args.rounds} alternating runs)\n")
    print("| op | tensors x bytes per rank | " + " | ".join(labels) + " | unfused / fused (means) | gloo / fused |")
    print("|---|---|" + "---:|" * (len(labels) + 2))
    mean = lambda xs: sum(xs) / len(xs)
    for op in ("allgather", "reducescatter", "broadcast"):
        for (count, size), secs in rows:
            ms = {l: [r[op] * 1e3 for r in secs[l]] for l in labels}
            cells = [" / ".join(f"{m:.1f}" for m in ms[l]) for l in labels]
            print(f"| {op} | {count} x {size >> 10} KB | " + " | ".join(cells) +
                  f" | {mean(ms['nezha-unfused']) / mean(ms['nezha-fused']):.2f} |"
                  f" {mean(ms['gloo']) / mean(ms['nezha-fused']):.2f} |")


if __name__ == "__main__":
    main()
