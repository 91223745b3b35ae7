#!/usr/bin/env python3
"""How long a striped operation's rails idle at its end, from NEZHA_TIMELINE traces.

    python benchmarks/balance_tail.py --op ".1.0'" trace.0.json [trace.1.json ...]

For every instance of the operation named by --op (the end of its timeline name; instances are
told apart by their negotiation events), prints per trace: the gap between the rails' last range
ends (the time the first rail to finish idles), the operation's span on the rails and its ranges.
"""
import argparse
import bisect
import json
import statistics


def instances(events, op):
    name = next(e["name"] for e in events if e.get("cat") == "rail" and e["name"].endswith(op))
    starts = sorted(e["ts"] for e in events
                    if e.get("ph") == "b" and e.get("cat") == "negotiate" and name.strip("'") in e["name"])
    ops = [[] for _ in starts]
    for e in events:
        if e.get("cat") == "rail" and e.get("ph") == "X" and e["name"] == name:
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i >= 0:
                ops[i].append((e["ts"], e["ts"] + e["dur"], e["tid"]))
    return [op for op in ops if len({tid for _, _, tid in op}) > 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", required=True, help="end of the operation's timeline name")
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    print("| trace | instances | idle end, median / mean / max (ms) | span, median (ms) | ranges, median |")
    print("|---|---:|---:|---:|---:|")
    for path in args.traces:
        with open(path) as f:
            ops = instances(json.load(f), args.op)
        if not ops:
            print(f"| {path} | 0 | | | |")
            continue
        gaps, spans = [], []
        for op in ops:
            ends = {}
            for _, t, tid in op:
                ends[tid] = max(ends.get(tid, 0.0), t)
            gaps.append((max(ends.values()) - min(ends.values())) / 1e3)
            spans.append((max(ends.values()) - min(s for s, _, _ in op)) / 1e3)
        print(f"| {path} | {len(ops)} | {statistics.median(gaps):.1f} / {statistics.mean(gaps):.1f} / {max(gaps):.1f} "
              f"| {statistics.median(spans):.1f} | {statistics.median([len(op) for op in ops]):.0f} |")


if __name__ == "__main__":
    main()
