"""Issue 21's comparison on the testbed: 4 hosts, two rails shaped at RATE, an aggregator host on
rail 1 (its link at 4 x RATE) running nezha-aggd. Allreduce of float32, in one run, side by side:
TCP (rail 0) + aggregation (rail 1), TCP + TCP, MPTCP over both rails, and each rail alone; with
the split the planner chose (bytes per rail from nezha-bench's JSON). Prints a markdown table for
benchmarks/AGG.md. Needs root.

    .venv/bin/python benchmarks/agg_compare.py [--rate 1gbit] [--sizes 1M,64M] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from nezha.runner.aggregator import daemon_binary
from nezha.testbed import Testbed

AGG_PORT = 7219
SECRET = "agg-bench-key"
BENCH = [sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--dtype", "float32",
         "--iters", "auto", "--warmup", "3"]


def run(tb, label, rails, sizes, out):
    args = tb.nezharun_args(start_aggregator=False)  # the daemon is started here
    args[args.index("--rails") + 1] = rails
    path = os.path.join(out, label + ".json")
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", str(len(tb.hosts)), *args, "--",
           *BENCH, "--sizes", sizes, "--json", path, "--impl-label", label]
    print("$ " + " ".join(cmd), flush=True)
    env = {**os.environ, "NEZHA_AGG_SECRET": SECRET}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def cpu_seconds(pid):
    """utime + stime of a process (the daemon: `ip netns exec` execs into it, same pid)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def split_text(rec):
    rails = rec.get("rails") or []
    parts = [f"{r.get('name', '?')} {100 * r.get('share', 0):.0f}%" for r in rails if r.get("share", 0) > 0]
    return ", ".join(parts) or "-"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--sizes", default="1M,64M")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="agg-compare-"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with Testbed(hosts=4, rails=2, rates=[args.rate, args.rate], aggregator=1) as tb:
        daemon = tb.popen(tb.aggregator_host, [daemon_binary(), "--listen", f"0.0.0.0:{AGG_PORT}"],
                          env={**os.environ, "NEZHA_AGG_SECRET": SECRET}, stdout=subprocess.PIPE)
        try:
            assert b"listening on" in daemon.stdout.readline()
            r0, r1 = tb.rail_subnets
            agg = f"agg:{tb.aggregator_addr}:{AGG_PORT}"
            runs = [("tcp+agg", f"{r0},{agg}"), ("tcp+tcp", f"{r0},{r1}"), ("mptcp", f"mptcp:{r0}"),
                    ("tcp-rail0", r0), ("agg-alone", agg)]
            records = []
            daemon_cpu = {}
            for label, rails in runs:
                before = cpu_seconds(daemon.pid)
                start = time.monotonic()
                records += run(tb, label, rails, args.sizes, args.out)
                daemon_cpu[label] = (cpu_seconds(daemon.pid) - before, time.monotonic() - start)
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
    by = {(r["impl"], r["bytes"]): r for r in records}
    sizes = sorted({r["bytes"] for r in records})
    labels = [label for label, _ in runs]
    print(f"\n4 hosts, rails shaped {args.rate}, aggregator link 4 x {args.rate}; busbw Gbit/s (time)\n")
    print("| size | " + " | ".join(labels) + " | tcp+agg split |")
    print("|---:|" + "---:|" * len(labels) + "---|")
    for b in sizes:
        cells = []
        for label in labels:
            r = by.get((label, b))
            cells.append(f"{r['busbw_gbps']:.2f} ({r['time_us'] / 1000:.1f} ms)" if r else "-")
        split = split_text(by[("tcp+agg", b)]) if ("tcp+agg", b) in by else "-"
        print(f"| {b} | " + " | ".join(cells) + f" | {split} |")
    print("\nnezha-aggd CPU per job (whole nezharun run, start-up and calibration included): " +
          ", ".join(f"{k} {c:.1f} s of {w:.0f} s" for k, (c, w) in daemon_cpu.items()))
    print(f"\nraw JSON in {args.out}")


if __name__ == "__main__":
    main()
