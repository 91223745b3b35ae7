"""One rank of benchmarks/balance_compare.py's rate-step run: `--ops` allreduces of `--bytes` float32,
back to back, each timed; rank 0 touches `--marker` when op `--mark-at` starts (the orchestrator then
changes a rail's rate while it runs) and writes every op's seconds and each rail's bytes to `--json`."""
import argparse
import json
import os
import time

import numpy as np

import nezha


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, default=64 << 20)
    p.add_argument("--ops", type=int, default=14)
    p.add_argument("--mark-at", type=int, default=6)
    p.add_argument("--marker", required=True)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    nezha.init()
    x = np.ones(args.bytes // 4, dtype=np.float32)
    out = np.empty_like(x)
    seconds, rail_bytes = [], []
    for i in range(args.ops):
        nezha.barrier()
        if i == args.mark_at and nezha.rank() == 0:
            with open(args.marker, "w") as f:
                f.write(str(time.time()))
        before = [s["bytes_sent"] for s in nezha.rail_stats()]
        t0 = time.perf_counter()
        nezha.allreduce(x, op=nezha.Sum, out=out, name="grad")
        seconds.append(time.perf_counter() - t0)
        rail_bytes.append([s["bytes_sent"] - b for s, b in zip(nezha.rail_stats(), before)])
        if not np.all(out == nezha.size()):
            raise SystemExit(f"op {i}: wrong sum on rank {nezha.rank()}")
    if nezha.rank() == 0:
        with open(args.json, "w") as f:
            json.dump({"seconds": seconds, "rail_bytes": rail_bytes, "bytes": args.bytes, "size": nezha.size(),
                       "balance_bytes": os.environ.get("NEZHA_BALANCE_BYTES", "default")}, f)
    nezha.shutdown()


if __name__ == "__main__":
    main()
