#!/usr/bin/env python3
"""Where a large allreduce's time goes besides the rails: one array against the same bytes in
leaves, numpy against jit, a fresh output against a reused one (issue 39 point 4).

    nezharun -np 4 ... python benchmarks/large_allreduce_costs.py [--mb 64] [--leaves 8]
        [--rounds 4] [--per-round 3] [--impls np,np-out,np-inplace,np-tree,jit,jit-tree]

`np`: nezha.allreduce of one array (a fresh output each call, as numpy allocates it); `np-out`: into
one preallocated output; `np-inplace`: out=the input; `np-tree`: nezha.grouped_allreduce of
`--leaves` arrays; `jit` / `jit-tree`: jitted nezha.jax.grouped_allreduce of one array / the
leaves. The implementations take turns, `--per-round` calls each per round. Per implementation,
rank 0 prints the median time (max over ranks) and busbw, and its own minor page faults, CPU time
and, per thread name, CPU ms and context switches per call (/proc: which thread paid for what).
"""
import argparse
import resource
import time

import numpy as np

import nezha
from nezha.bench.thread_stats import thread_counters


def per_thread():
    out = {}
    for name, ticks, switches in thread_counters().values():
        t = out.setdefault(name, [0, 0])
        t[0] += ticks
        t[1] += switches
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--leaves", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--per-round", type=int, default=3)
    p.add_argument("--impls", default="np,np-out,np-inplace,np-tree,jit,jit-tree")
    args = p.parse_args()

    nezha.init()
    import jax
    import jax.numpy as jnp
    import nezha.jax as nj
    rank, size = nezha.rank(), nezha.size()
    count = args.mb * (1 << 20) // 4
    x = np.full(count, rank + 1, np.float32)
    out = np.empty_like(x)
    inplace = x.copy()
    leaves = [np.full(count // args.leaves, rank + 1, np.float32) for _ in range(args.leaves)]
    dev, dev_leaves = jnp.asarray(x), [jnp.asarray(v) for v in leaves]
    step = jax.jit(lambda t: nj.grouped_allreduce(t, op=nj.Sum))
    impls = {
        "np": lambda: nezha.allreduce(x, op=nezha.Sum),
        "np-out": lambda: nezha.allreduce(x, op=nezha.Sum, out=out),
        "np-inplace": lambda: nezha.allreduce(inplace, op=nezha.Sum, out=inplace),
        "np-tree": lambda: nezha.grouped_allreduce(leaves, op=nezha.Sum),
        "jit": lambda: jax.block_until_ready(step([dev])),
        "jit-tree": lambda: jax.block_until_ready(step(dev_leaves)),
    }
    chosen = args.impls.split(",")
    for k in chosen:  # warm-up: compiles, allocates, teaches the cost models
        impls[k]()
        impls[k]()
    times = {k: [] for k in chosen}
    faults = {k: 0 for k in chosen}
    cpu = {k: 0.0 for k in chosen}
    threads = {k: {} for k in chosen}
    for _ in range(args.rounds):
        for k in chosen:
            for _ in range(args.per_round):
                t0_threads, r0 = per_thread(), resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.perf_counter()
                impls[k]()
                elapsed = time.perf_counter() - t0
                r1, t1_threads = resource.getrusage(resource.RUSAGE_SELF), per_thread()
                times[k].append(elapsed)
                faults[k] += r1.ru_minflt - r0.ru_minflt
                cpu[k] += (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
                for name, (ticks, switches) in t1_threads.items():
                    before = t0_threads.get(name, [0, 0])
                    acc = threads[k].setdefault(name, [0, 0])
                    acc[0] += ticks - before[0]
                    acc[1] += switches - before[1]
    hz = 100  # clock ticks per second (/proc stat)
    for k in chosen:
        calls = len(times[k])
        worst = float(np.max(nezha.allgather(np.array([np.median(times[k])]), name=f"costs.{k}")))
        busbw = count * 4 * 8 * 2 * (size - 1) / size / worst / 1e9
        if rank == 0:
            busy = {n: (round(v[0] * 1000 / hz / calls), v[1] // calls)
                    for n, v in threads[k].items() if v[0] or v[1] >= calls}
            print(f"{k:>10}: {worst * 1e3:7.1f} ms  busbw {busbw:.3f} Gbit/s  minor faults/call "
                  f"{faults[k] / calls:6.0f}  cpu/call {cpu[k] / calls * 1e3:5.1f} ms  per thread "
                  f"(cpu ms, switches)/call {busy}", flush=True)
    nezha.shutdown()


if __name__ == "__main__":
    main()
