"""A training-like loop whose ranks are starved of CPU unevenly, to record a timeline of what the planner
learns under starvation on one host (no namespace testbed):

    NEZHA_AUTO_SHM=0 NEZHA_AUTO_SHM_COLL=0 nezharun -np 4 --rails 127.0.0.1/32,127.0.0.2/32 \\
        --timeline /tmp/starved.json -- .venv/bin/python benchmarks/starved_train.py --steps 40
    .venv/bin/python benchmarks/replay_planner.py /tmp/starved.0.json

Each step is a "backward pass" in buckets: a rank computes (numpy matrix products, a different amount
per rank and per step, so its peers wait for it), then submits the bucket's gradient allreduce and
goes on computing the next bucket while it runs, as DDP does. Buckets are 1-24 MiB of float32; the
results are checked against the sum every rank can compute itself.
"""
import argparse
import time

import numpy as np

import nezha

BUCKET_MIB = (24, 8, 4, 1, 16, 2)


def compute(units: int, work: np.ndarray) -> None:
    for _ in range(units):
        work @ work


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    nezha.init()
    rank, size = nezha.rank(), nezha.size()
    rng = np.random.default_rng(args.seed)  # same stream on every rank: each rank's load is known to all
    work = np.ones((160, 160), dtype=np.float32)
    grads = [np.full((mib << 20) // 4, float(rank + 1), dtype=np.float32) for mib in BUCKET_MIB]
    expected = float(size * (size + 1) // 2)
    t0 = time.perf_counter()
    for step in range(args.steps):
        # Per bucket and rank, 0-40 units of compute: a different rank is the straggler each time.
        load = rng.integers(0, 40, size=(len(BUCKET_MIB), size))
        handles = []
        for b, g in enumerate(grads):
            compute(int(load[b, rank]), work)
            handles.append(nezha.allreduce_async(g, op=nezha.Sum, name=f"grad.{b}"))
        for b, h in enumerate(handles):
            out = nezha.synchronize(h)
            if not (out[0] == expected and out[-1] == expected):
                raise SystemExit(f"rank {rank} step {step} bucket {b}: got {out[0]}, want {expected}")
    if rank == 0:
        shares = [s["share"] for s in nezha.rail_stats()]
        print(f"{args.steps} steps in {time.perf_counter() - t0:.1f} s; rail shares {shares}", flush=True)
    nezha.shutdown()


if __name__ == "__main__":
    main()
