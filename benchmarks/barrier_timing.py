#!/usr/bin/env python3
"""Times single allreduces with a barrier before each, printing every iteration (rank 0).

nezha-bench times operations back to back, as a training loop issues them; this script isolates
one operation from the skew the previous one left, for A/B comparisons of the engine itself:

    nezharun -np 4 .venv/bin/python benchmarks/barrier_timing.py --impl nezha --size 64M
    nezharun -np 4 .venv/bin/python benchmarks/barrier_timing.py --impl gloo --size 64M  # GLOO_SOCKET_IFNAME=lo
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from nezha.bench.sizes import parse_size  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=("nezha", "gloo"), default="nezha")
    p.add_argument("--size", default="64M", help="bytes of float32 per allreduce (default 64M)")
    p.add_argument("--iters", type=int, default=8)
    args = p.parse_args()
    x = np.ones(parse_size(args.size) // 4, dtype=np.float32)
    if args.impl == "nezha":
        import nezha
        nezha.init()
        rank = nezha.rank()
        step = lambda: nezha.allreduce(x, op=nezha.Sum, name="x", out=x)  # noqa: E731
        barrier = nezha.barrier
        finish = nezha.shutdown
    else:
        import torch
        import torch.distributed as dist
        addr = os.environ.get("NEZHA_RENDEZVOUS_ADDR", "127.0.0.1")
        port = int(os.environ.get("NEZHA_RENDEZVOUS_PORT", "29500")) + 1
        dist.init_process_group("gloo", rank=int(os.environ["NEZHA_RANK"]),
                                world_size=int(os.environ["NEZHA_SIZE"]), init_method=f"tcp://{addr}:{port}")
        rank = dist.get_rank()
        t = torch.from_numpy(x)
        step = lambda: dist.all_reduce(t)  # noqa: E731
        barrier = dist.barrier

        def finish():
            # Every rank leaves together: a rank exiting while a peer is still in its last
            # allreduce resets that peer's gloo connection, which then fails instead of printing.
            dist.barrier()
            dist.destroy_process_group()
    step()
    times_ms = []
    for _ in range(args.iters):
        barrier()
        start = time.perf_counter()
        step()
        times_ms.append(1e3 * (time.perf_counter() - start))
    if rank == 0:
        print(f"{args.impl} {args.size}: " + " ".join(f"{t:.0f}" for t in times_ms) +
              f" ms; median {statistics.median(times_ms):.0f} ms", flush=True)
    finish()


if __name__ == "__main__":
    main()
