#!/usr/bin/env python3
"""Replays the share timings of a job's timeline into the engine's own rail table and reports how
its plan moves: which split a 24 MiB allreduce would get after each sample, and the rails' bandwidth
estimates. It shows what the planner learns from a real run (a training job on starved cores, a
throttled rail) without rerunning it.

    nezharun ... --timeline /tmp/tl.json -- python train.py ...      # writes /tmp/tl.<rank>.json
    .venv/bin/python benchmarks/replay_planner.py /tmp/tl.0.json [--plans]

Rank 0's timeline is the one to replay: rank 0's models decide the splits. Rails are the timeline's
threads named "rail ..." in order. A share's time is what the engine's cost model learned from it
(args.rail_us: its wall time less the waits for late peers, multirail/share_timing.h) where the
timeline has it; --wall replays the wall times instead (event durations: what older engines learned),
so one run shows both.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from nezha._core import planner

PLAN_BYTES = 24 << 20


def rail_threads(events) -> dict:
    names = {e["tid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name" and e["args"]["name"].startswith("rail ")}
    return {tid: i for i, tid in enumerate(sorted(names))}, [names[t] for t in sorted(names)]


def replay(events, show_plans: bool = False, wall: bool = False) -> dict:
    index, names = rail_threads(events)
    if not names:
        raise SystemExit("no rail threads in this timeline (was it written with NEZHA_TIMELINE?)")
    shares = sorted((e for e in events if e.get("cat") == "rail" and e.get("ph") == "X" and e["tid"] in index
                     and "bytes" in e.get("args", {}) and e["name"] != "calibration warm-up"),
                    key=lambda e: e["ts"] + e["dur"])  # in the order they completed: when they were observed
    table = planner.RailTable([dict(name=n) for n in names])
    split, single, betas, last = [], 0, [[] for _ in names], None
    for e in shares:
        micros = e["dur"] if wall else e["args"].get("rail_us", e["dur"])
        table.observe(index[e["tid"]], e["args"]["bytes"], micros * 1e-6)
        if e["name"].startswith("calibration"):
            continue
        plan = table.plan(PLAN_BYTES // 4, 4)
        fractions = [0.0] * len(names)
        for s in plan.shares:
            fractions[s.rail] += s.count * 4 / PLAN_BYTES
        split.append(fractions)
        single += sum(f > 0 for f in fractions) < 2
        for i, est in enumerate(table.estimates()):
            betas[i].append(est.beta_gbps)
        if show_plans and fractions != last:
            print(f"{e['ts'] / 1e6:9.3f} s  {e['name'][:40]:40s} rail {index[e['tid']]} {e['args']['bytes']:>10d} B "
                  f"{e['dur'] / 1e3:8.1f} ms -> split {[round(f, 2) for f in fractions]}")
            last = fractions
    return {"rails": names, "samples": len(split), "single_rail_plans": single,
            "share": [{"min": min(col), "median": statistics.median(col), "max": max(col)} for col in zip(*split)],
            "beta_gbps": [{"min": min(b), "median": statistics.median(b), "max": max(b)} for b in betas]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline")
    parser.add_argument("--plans", action="store_true", help="print every change of the split")
    parser.add_argument("--wall", action="store_true", help="learn from the shares' wall times, not args.rail_us")
    args = parser.parse_args()
    with open(args.timeline, encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    print(json.dumps(replay(events, args.plans, args.wall), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
