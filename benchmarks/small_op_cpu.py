"""Where a small allreduce's time goes, per rank and thread: run under nezharun; each rank calls
nezha.allreduce on N (env, default 3000) 8-byte arrays after a warm-up and prints the time per call
and, per thread that used any, its CPU per call (user part in brackets) and voluntary/involuntary
context switches per call, from /proc/self/task/*/{stat,status} (nezha.bench.thread_stats).

    nezharun -np 4 .venv/bin/python benchmarks/small_op_cpu.py
"""
import os
import time

import numpy as np

import nezha as nz
from nezha.bench.thread_stats import thread_times


def main():
    nz.init()
    calls = int(os.environ.get("N", "3000"))
    x = np.ones(2, np.float32)
    for _ in range(200):
        nz.allreduce(x, name="small-op-cpu")
    before, start = thread_times(), time.perf_counter()
    for _ in range(calls):
        nz.allreduce(x, name="small-op-cpu")
    elapsed, after = time.perf_counter() - start, thread_times()
    us_per_tick = 1e6 / os.sysconf("SC_CLK_TCK")
    rows = []
    for tid, (comm, user, system, vol, invol) in after.items():
        if tid not in before:
            continue
        _, user0, system0, vol0, invol0 = before[tid]
        cpu = (user + system - user0 - system0) * us_per_tick / calls
        if cpu > 0.5 or (vol - vol0) / calls > 0.05:
            rows.append(f"{comm}: {cpu:.0f} us (user {(user - user0) * us_per_tick / calls:.0f}), "
                        f"{(vol - vol0) / calls:.2f} vcs, {(invol - invol0) / calls:.2f} ics")
    print(f"rank {nz.rank()}: {elapsed / calls * 1e6:.0f} us per call; " + "; ".join(rows), flush=True)
    nz.shutdown()


if __name__ == "__main__":
    main()
