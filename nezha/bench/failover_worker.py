"""One rank of a failover drill (run by nezharun; see failover_drill.py).

Runs one collective (allreduce by default) on a float32 tensor over and over until the drill
creates the stop file, checks every result against numpy, and prints one JSON line per rank: when
each operation completed and when the watched rail changed state (time.monotonic(), the same clock
as the drill's on one machine).

usage: failover_worker.py STOP_FILE RAIL ELEMENTS [OP]
"""
import json
import os
import sys
import time

import numpy as np

import nezha


def operation(op: str, x: np.ndarray, everyone: np.ndarray, rank: int, size: int):
    """(run, want): `run()` does one `op` of x under one name and returns its result; `want` is
    that result computed by numpy from every rank's input."""
    n = x.size
    piece = slice(rank * n // size, (rank + 1) * n // size)  # n is a multiple of size
    total = everyone.astype(np.float64).sum(axis=0).astype(np.float32)
    if op == "allreduce":
        out = np.empty_like(x)
        return (lambda: nezha.allreduce(x, op=nezha.Sum, name="grad", out=out)), total
    if op == "allgather":
        return (lambda: nezha.allgather(x, name="gathered")), everyone.reshape(-1)
    if op == "broadcast":
        out = np.empty_like(x)
        return (lambda: nezha.broadcast(x, 0, name="params", out=out)), everyone[0]
    if op == "reducescatter":
        return (lambda: nezha.reducescatter(x, op=nezha.Sum, name="shards")), total[piece]
    if op == "alltoall":
        return (lambda: nezha.alltoall(x, name="exchange")[0]), everyone[:, piece].reshape(-1)
    raise ValueError(f"unknown op {op!r}")


def main() -> int:
    stop_file, rail, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    op = sys.argv[4] if len(sys.argv) > 4 else "allreduce"
    nezha.init()
    rank, size = nezha.rank(), nezha.size()
    if n % size:
        raise ValueError(f"ELEMENTS ({n}) must be a multiple of the {size} ranks")
    rng = np.random.default_rng(rank)
    # Small integers: sums are exact in any order, so a redone share must match bit for bit.
    x = rng.integers(-8, 8, n).astype(np.float32)
    run, want = operation(op, x, nezha.allgather(x[None, :], name="inputs"), rank, size)
    completions, transitions = [], []
    state = nezha.rail_stats()[rail]["state"]
    print(f"READY {time.monotonic():.6f}", flush=True)
    while True:
        # Ranks decide together (a rank that stopped alone would leave the others hanging).
        stop = nezha.allreduce(np.array([os.path.exists(stop_file)], np.int32), op=nezha.Max, name="stop")
        if stop[0]:
            break
        got = run()
        completions.append(time.monotonic())
        if not np.array_equal(got, want):
            bad = np.flatnonzero(got != want)
            raise AssertionError(f"rank {rank}: {op}: {bad.size} wrong elements after {len(completions)} ops, "
                                 f"first {bad[0]}")
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
