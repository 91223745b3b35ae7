#!/usr/bin/env python3
"""Where a small allreduce's CPU goes, per thread: CPU time and context switches per operation.

    nezharun -np 4 python benchmarks/small_op_threads.py --mode jit --leaves 2 --iters 4000

Runs `--iters` small allreduces back to back (`jit`: a jitted nezha.jax.grouped_allreduce of
`--leaves` float32 arrays of `--count` elements; `numpy`: nezha.grouped_allreduce of the same in numpy) and reads every
thread's CPU time and voluntary + involuntary context switches from /proc before and after. The
engine's threads are named (nz-engine, nz-rail, ...); the framework's are summed under their own
names ("python" for the interpreter's and XLA's). Rank 0 prints one line per rank: us of CPU and
switches per operation by thread name, and the wall time per operation.

On 2 shared cores, a small collective's time is mostly this CPU and the wake-ups behind the
switches (benchmarks/JAX.md).
"""
import argparse
import json
import os
import time

import numpy as np

from nezha.bench.thread_stats import thread_counters


def per_op_by_name(before, after, ops):
    """{name: [us of CPU per op, switches per op]} over threads alive at the end."""
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    rows = {}
    for tid, (name, ticks, switches) in after.items():
        _, ticks0, switches0 = before.get(tid, (name, 0, 0))
        row = rows.setdefault(name, [0.0, 0.0])
        row[0] += (ticks - ticks0) * tick_us / ops
        row[1] += (switches - switches0) / ops
    return {k: [round(v[0]), round(v[1], 2)] for k, v in rows.items() if v[0] >= 1 or v[1] >= 0.05}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["jit", "numpy"], default="jit")
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--count", type=int, default=1, help="float32 elements per leaf")
    p.add_argument("--iters", type=int, default=4000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--per-call", type=int, default=1, metavar="K",
                   help="jit: K allreduces in one jitted call (a fori_loop): no dispatch between them")
    args = p.parse_args()

    import nezha
    if args.mode == "jit":
        import jax
        import jax.numpy as jnp
        import nezha.jax as nj
        nj.init()
        body = lambda i, tree: nj.grouped_allreduce(tree, op=nj.Average)  # noqa: E731
        step = jax.jit(lambda tree: jax.lax.fori_loop(0, args.per_call, body, tree))
        tree = [jnp.ones(args.count, jnp.float32) for _ in range(args.leaves)]
        once = lambda: jax.block_until_ready(step(tree))  # noqa: E731
    else:
        nezha.init()
        arrays = [np.ones(args.count, np.float32) for _ in range(args.leaves)]
        once = lambda: nezha.grouped_allreduce(arrays, op=nezha.Sum, name="small")  # noqa: E731
    calls = max(1, args.iters // args.per_call)
    for _ in range(max(1, args.warmup // args.per_call)):
        once()
    before, start = thread_counters(), time.perf_counter()
    for _ in range(calls):
        once()
    ops = calls * args.per_call
    wall_us = (time.perf_counter() - start) / ops * 1e6
    rows = per_op_by_name(before, thread_counters(), ops)
    rows["wall_us"] = round(wall_us)
    lines = nezha.allgather_object(json.dumps(rows))
    if nezha.rank() == 0:
        print(f"{args.mode}, {args.leaves} leaves x {args.count * 4} B, {ops} ops, "
              f"{args.per_call} per call: "
              "[us CPU, switches] per op by thread")
        for rank, line in enumerate(lines):
            print(f"rank {rank}: {line}")
    nezha.shutdown()


if __name__ == "__main__":
    main()
