"""Synchronous numpy collectives lead the engine loop on the calling thread (NEZHA_LEAD_US).

usage: sync_lead.py LEAD   (1: the default lead time; 0: run with NEZHA_LEAD_US=0)

Every synchronous collective, small (done by rank 0 within negotiation) and large (on the rails),
checked against numpy; the same from three threads at once with an asynchronous allreduce in
flight; a call whose peer comes 0.3 s late (the lead ends, the wait goes on). Then 30 back-to-back
small allreduces: with the lead a worker's engine thread sleeps through them (it wakes twice per
call without: for the request and for the answer), and without it, it does not.
"""
import os
import sys
import threading
import time

import numpy as np

import nezha
from nezha.bench.thread_stats import context_switches

LEAD = sys.argv[1] == "1"
nezha.init()
r, n = nezha.rank(), nezha.size()


def fail(what):
    print(f"FAIL rank {r}: {what}", flush=True)
    os._exit(1)


def check(got, want, what):
    if not np.array_equal(np.asarray(got), np.asarray(want)):
        fail(f"{what}: got {np.asarray(got).ravel()[:6]}, expected {np.asarray(want).ravel()[:6]}")


def each_rank(f):
    return [f(q) for q in range(n)]


def every_collective(tag, rows):
    def x(q):
        return np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + 10 * q
    check(nezha.allreduce(x(r), op=nezha.Sum, name=f"{tag}.ar"), sum(each_rank(x)), f"{tag} allreduce")
    got = nezha.grouped_allreduce([x(r), 2 * x(r)], op=nezha.Sum, name=f"{tag}.gar")
    check(got[1], 2 * sum(each_rank(x)), f"{tag} grouped allreduce")
    check(nezha.allgather(x(r), name=f"{tag}.ag"), np.concatenate(each_rank(x)), f"{tag} allgather")
    check(nezha.broadcast(x(r), n - 1, name=f"{tag}.bc"), x(n - 1), f"{tag} broadcast")
    step = rows // n
    out, splits = nezha.alltoall(x(r)[:step * n], name=f"{tag}.a2a")
    check(out, np.concatenate([x(q)[r * step:(r + 1) * step] for q in range(n)]), f"{tag} alltoall")
    check(splits, [step] * n, f"{tag} alltoall splits")
    check(nezha.reducescatter(x(r)[:step * n], op=nezha.Sum, name=f"{tag}.rs"),
          sum(each_rank(x))[r * step:(r + 1) * step], f"{tag} reducescatter")
    got = nezha.grouped_allgather([x(r), x(r)[:1]], name=f"{tag}.gag")
    check(got[1], np.concatenate([x(q)[:1] for q in range(n)]), f"{tag} grouped allgather")
    nezha.barrier()


every_collective("small", 2 * n)        # within negotiation
every_collective("large", 65536 * n)    # 512 KiB per rank: on the rails

# Three threads calling synchronous collectives at once (each its own names; the threads'
# calls interleave differently on each rank), an asynchronous allreduce in flight meanwhile.
big = np.full(1 << 20, r + 1.0, np.float32)
pending = nezha.allreduce_async(big, op=nezha.Sum, name="async.big")
errors = []


def caller(k):
    try:
        for i in range(20):
            check(nezha.allreduce(np.full(3, float(r + i + k), np.float32), op=nezha.Sum,
                                  name=f"thread{k}.{i}"),
                  np.full(3, float(sum(q + i + k for q in range(n)))), f"thread {k} call {i}")
    except Exception as e:  # noqa: BLE001 - reported below, on this rank
        errors.append(f"thread {k}: {e!r}")


threads = [threading.Thread(target=caller, args=(k,)) for k in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=120)
if errors or any(t.is_alive() for t in threads):
    fail(f"concurrent synchronous calls: {errors or 'a thread hung'}")
check(pending.wait(), np.full(1 << 20, n * (n + 1) / 2.0), "async allreduce beside them")

# A late peer: the lead ends after NEZHA_LEAD_US and the caller waits on as before.
if r == n - 1:
    time.sleep(0.3)
check(nezha.allreduce(np.ones(2, np.float32), op=nezha.Sum, name="late"), np.full(2, float(n)),
      "allreduce with a late peer")


nezha.barrier()
switches = context_switches("nz-engine")
for i in range(30):
    nezha.allreduce(np.full(2, float(i), np.float32), op=nezha.Sum, name=f"back.{i}")
switches = context_switches("nz-engine") - switches
if r != 0 and LEAD and switches >= 15:
    fail(f"30 small synchronous allreduces: the engine thread switched {switches} times (no lead)")
if r != 0 and not LEAD and switches < 30:
    fail(f"NEZHA_LEAD_US=0, yet the engine thread switched only {switches} times in 30 calls")
print(f"OK rank {r}: engine thread switches over 30 calls: {switches}", flush=True)
nezha.shutdown()
