#!/usr/bin/env python3
"""What the torch.distributed backend's Python layer costs: ``dist.all_reduce`` of a CPU tensor
through the backend "nezha" against ``nezha.allreduce`` of the same bytes (a numpy view of the
same tensor), in one job, the two taking turns in rounds so the machine's drift weighs on both.

    nezharun -np 4 [--rails ...] python benchmarks/dist_allreduce_bench.py --bytes 64M --rounds 5 \\
        --iters 4 --json out.json

Rank 0 prints and writes, per implementation, the median time and the bus bandwidth
(busbw = 2(n-1)/n x bytes / time, nccl-tests' convention).
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

import nezha
import nezha.torch  # noqa: F401  (registers the backend)
from nezha.bench.sizes import parse_size


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", default="64M", help="allreduce size (float32)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=4, help="allreduces per implementation per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="rank 0 writes the records here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("nezha")
    rank, n = dist.get_rank(), dist.get_world_size()
    count = parse_size(args.bytes) // 4
    tensor = torch.ones(count)
    view = tensor.numpy()

    def through_backend():
        dist.all_reduce(tensor)

    def through_nezha():
        nezha.allreduce(view, op=nezha.Sum, out=view, name="bench.direct")

    impls = {"dist.all_reduce (backend nezha)": through_backend,
             "nezha.allreduce": through_nezha}
    for fn in impls.values():
        for _ in range(args.warmup):
            fn()
    times = {name: [] for name in impls}
    for _ in range(args.rounds):
        for name, fn in impls.items():
            dist.barrier()
            for _ in range(args.iters):
                started = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - started)
    records = []
    for name, samples in times.items():
        median = statistics.median(samples)
        busbw = 2 * (n - 1) / n * count * 4 * 8 / median / 1e9
        records.append({"impl": name, "bytes": count * 4, "ranks": n, "time_us": median * 1e6,
                        "busbw_gbps": busbw, "samples": len(samples)})
    if rank == 0:
        for r in records:
            print("%-34s %6.1f ms  busbw %.3f Gbit/s" % (r["impl"], r["time_us"] / 1e3,
                                                        r["busbw_gbps"]), flush=True)
        ratio = records[0]["busbw_gbps"] / records[1]["busbw_gbps"]
        print("backend / nezha.allreduce: %.3f" % ratio, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"records": records, "ratio": ratio,
                           "rail_stats": nezha.rail_stats()}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
