"""Balancing while an operation runs (issue 18, pt 2) on the testbed: 4 hosts, float32 allreduce,
NEZHA_BALANCE_BYTES at its default (1 MiB: balanced) against 0 (each rail keeps its planned share),
alternating in one run. Needs root. Prints markdown for benchmarks/BALANCE.md.

  static: two 1 Gbit/s rails, then 1 Gbit/s + 250 Mbit/s; nezha-bench, 1 MB, 16 MB and 64 MB.
  step:   two 1 Gbit/s rails; 64 MB allreduces back to back (benchmarks/balance_worker.py) and rail 1
          drops to 250 Mbit/s on every host while op 6 runs: how long each op around it takes, and
          which share of the bytes rail 1 carried.

    .venv/bin/python benchmarks/balance_compare.py [--rounds 2] [--parts static,step] [--out DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = [sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--dtype", "float32", "--iters", "auto",
         "--warmup", "2"]
VARIANTS = [("balanced", None), ("planned split", "0")]


def nezharun(tb, balance, tail):
    env = dict(os.environ)
    env.pop("NEZHA_BALANCE_BYTES", None)
    if balance is not None:
        env["NEZHA_BALANCE_BYTES"] = balance
    cmd = [sys.executable, "-m", "nezha.runner", "-np", str(len(tb.hosts)), *tb.nezharun_args(), "--", *tail]
    print("$ " + ("NEZHA_BALANCE_BYTES=" + balance + " " if balance is not None else "") + " ".join(cmd), flush=True)
    return cmd, env


def static_part(args):
    from nezha.testbed import Testbed
    for rates in (["1gbit", "1gbit"], ["1gbit", "250mbit"]):
        rows = {}
        with Testbed(hosts=4, rails=2, rates=rates, prefix=args.prefix) as tb:
            for rnd in range(args.rounds):
                for label, balance in VARIANTS:
                    path = os.path.join(args.out, f"static-{rates[1]}-{label.replace(' ', '_')}-{rnd}.json")
                    cmd, env = nezharun(tb, balance, [*BENCH, "--sizes", args.sizes, "--json", path,
                                                      "--impl-label", label])
                    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=900)
                    with open(path) as f:
                        for r in json.load(f):
                            rows.setdefault((r["bytes"], label), []).append(r["busbw_gbps"])
        print(f"\n### {rates[0]} + {rates[1]}: allreduce busbw (Gbit/s), {args.rounds} runs each, alternating\n")
        print("| size | balanced | planned split | balanced / planned |")
        print("|---:|---|---|---:|")
        for size in sorted({b for b, _ in rows}):
            on, off = rows[(size, "balanced")], rows[(size, "planned split")]
            print(f"| {size} | {' / '.join(f'{x:.3f}' for x in on)} | {' / '.join(f'{x:.3f}' for x in off)} | "
                  f"{(sum(on) / len(on)) / (sum(off) / len(off)):.3f} |")


def step_part(args):
    from nezha.testbed import Testbed
    results = {}
    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"], prefix=args.prefix) as tb:
        for rnd in range(args.rounds):
            for label, balance in VARIANTS:
                tb.set_rate(1, "1gbit")
                marker = os.path.join(args.out, f"step-marker-{rnd}-{balance}")
                path = os.path.join(args.out, f"step-{label.replace(' ', '_')}-{rnd}.json")
                if os.path.exists(marker):
                    os.unlink(marker)
                cmd, env = nezharun(tb, balance, [sys.executable, os.path.join(HERE, "balance_worker.py"),
                                                  "--marker", marker, "--json", path, "--mark-at", str(args.step_at)])
                proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
                changed = {}

                def slow_down():
                    deadline = time.time() + 300
                    while not os.path.exists(marker) and time.time() < deadline and proc.poll() is None:
                        time.sleep(0.002)
                    if os.path.exists(marker):
                        tb.set_rate(1, "250mbit")
                        changed["after_s"] = time.time() - float(open(marker).read() or time.time())

                t = threading.Thread(target=slow_down)
                t.start()
                if proc.wait(timeout=900) != 0:
                    raise SystemExit(f"rate-step run {label} failed")
                t.join()
                with open(path) as f:
                    rec = json.load(f)
                rec["changed_after_s"] = changed.get("after_s")
                results.setdefault(label, []).append(rec)
    first, last = max(0, args.step_at - 2), args.step_at + 5
    print(f"\n### Rail 1 drops from 1 Gbit/s to 250 Mbit/s while op {args.step_at} runs (64 MB allreduces)\n")
    print("ms per op, and in brackets the share of the bytes rail 1 carried; the rate change came "
          "the given ms after op 6 started.\n")
    print("| run | change at | " + " | ".join(f"op {i}" for i in range(first, last + 1)) + " |")
    print("|---|---:|" + "---:|" * (last - first + 1))
    for label, recs in results.items():
        for rnd, rec in enumerate(recs):
            cells = []
            for i in range(first, min(last + 1, len(rec["seconds"]))):
                b = rec["rail_bytes"][i]
                cells.append(f"{rec['seconds'][i] * 1000:.0f} ({b[1] / max(1, sum(b)):.2f})")
            at = rec["changed_after_s"]
            print(f"| {label} {rnd + 1} | {at * 1000:.0f} ms | " + " | ".join(cells) + " |" if at is not None
                  else f"| {label} {rnd + 1} | - | " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "step.json"), "w") as f:
        json.dump(results, f, indent=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="static,step")
    p.add_argument("--sizes", default="1M,16M,64M")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step-at", type=int, default=6)
    p.add_argument("--prefix", default="nzbal")
    p.add_argument("--out", default=tempfile.mkdtemp(prefix="balance-compare-"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for part in args.parts.split(","):
        {"static": static_part, "step": step_part}[part](args)


if __name__ == "__main__":
    main()
