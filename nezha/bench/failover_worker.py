"""One rank of a failover drill (run by nezharun; see failover_drill.py).

Allreduces a float32 tensor over and over until the drill creates the stop file, checks every
result against numpy, and prints one JSON line per rank: when each operation completed and when
the watched rail changed state (time.monotonic(), the same clock as the drill's on one machine).

usage: failover_worker.py STOP_FILE RAIL ELEMENTS
"""
import json
import os
import sys
import time

import numpy as np

import nezha


def main() -> int:
    stop_file, rail, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    nezha.init()
    rank, size = nezha.rank(), nezha.size()
    rng = np.random.default_rng(rank)
    # Small integers: sums are exact in any order, so a redone share must match bit for bit.
    x = rng.integers(-8, 8, n).astype(np.float32)
    want = nezha.allgather(x[None, :], name="inputs").astype(np.float64).sum(axis=0).astype(np.float32)
    out = np.empty_like(x)
    completions, transitions = [], []
    state = nezha.rail_stats()[rail]["state"]
    print(f"READY {time.monotonic():.6f}", flush=True)
    while True:
        # Ranks decide together (a rank that stopped alone would leave the others hanging).
        stop = nezha.allreduce(np.array([os.path.exists(stop_file)], np.int32), op=nezha.Max, name="stop")
        if stop[0]:
            break
        nezha.allreduce(x, op=nezha.Sum, name="grad", out=out)
        completions.append(time.monotonic())
        if not np.array_equal(out, want):
            bad = np.flatnonzero(out != want)
            raise AssertionError(f"rank {rank}: {bad.size} wrong elements after {len(completions)} ops, first {bad[0]}")
        now_state = nezha.rail_stats()[rail]["state"]
        if now_state != state:
            transitions.append((time.monotonic(), now_state))
            state = now_state
    rails = [{"name": s["name"], "kind": s["kind"], "bytes_sent": s["bytes_sent"]} for s in nezha.rail_stats()]
    print("DRILL " + json.dumps({"rank": rank, "completions": completions, "transitions": transitions,
                                 "rails": rails}), flush=True)
    nezha.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
