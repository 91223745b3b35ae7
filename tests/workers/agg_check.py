"""Allreduce striped over a TCP rail and an aggregation rail (nezha-aggd): exact, bit-identical.

usage: agg_check.py correctness
       agg_check.py restart   (rank 0 prints KILL after warm-up and waits for REVIVED in the file
                               named by AGG_CHECK_SIGNAL; every result is checked throughout)
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
mode = sys.argv[1]


def inputs(n, salt, rank, dtype):
    rng = np.random.default_rng(7919 * salt + rank)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, n).astype(dtype)
    # Integers held as floats: the sum is exact in any order, so it must equal numpy's exactly.
    return rng.integers(-1000, 1000, n).astype(dtype)


def check(n, salt, dtype=np.float32):
    x = inputs(n, salt, RANK, dtype)
    got = nezha.allreduce(x, op=nezha.Sum, name=f"agg.{n}.{salt}.{np.dtype(dtype).name}")
    want = sum(inputs(n, salt, r, dtype).astype(np.int64) for r in range(SIZE)).astype(dtype)
    assert np.array_equal(got, want), (n, salt, dtype)
    digest = np.frombuffer(hashlib.sha256(got.tobytes()).digest()[:16], np.uint8)
    everyone = nezha.allgather(digest[None, :], name=f"digest.{n}.{salt}")
    assert all(np.array_equal(everyone[0], d) for d in everyone), f"ranks differ for {n}"


def agg_stat():
    return next(s for s in nezha.rail_stats() if s["kind"] == "agg")


if mode == "correctness":
    for salt, n in enumerate([1, 1000, 65537, (4 << 20) + 3, 1 << 20, (8 << 20) + 1, 4 << 20, 4 << 20]):
        check(n, salt)
        check(n, salt + 100, np.int32)
    stats = nezha.rail_stats()
    print("STATS " + json.dumps(stats), flush=True)
    assert all(s["bytes_sent"] > 0 for s in stats), stats
    print(f"OK rank {RANK}", flush=True)
elif mode == "restart":
    signal_file = os.environ["AGG_CHECK_SIGNAL"]
    normal = []  # the same check before the kill: what SLOWEST is compared with
    for salt in range(4):
        t0 = time.monotonic()
        check(4 << 20, salt)
        normal.append(time.monotonic() - t0)
    assert agg_stat()["bytes_sent"] > 0
    if RANK == 0:
        print("KILL", flush=True)
    salt = 10
    deadline = time.monotonic() + 60
    # The daemon dies while these run; they must stay exact, then the rail must come back up.
    saw_down = False
    slowest = 0.0  # the longest allreduce around the kill: the stall the failover cost
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        check(4 << 20, salt)
        if not saw_down or agg_stat()["state"] != "up":
            slowest = max(slowest, time.monotonic() - t0)
        salt += 1
        state = agg_stat()["state"]
        saw_down |= state != "up"
        if saw_down and state == "up":
            break
        if saw_down and RANK == 0 and not os.path.exists(signal_file + ".asked"):
            open(signal_file + ".asked", "w").close()
            print("RESTART", flush=True)
    assert saw_down and agg_stat()["state"] == "up", nezha.rail_stats()
    print(f"NORMAL {sorted(normal)[len(normal) // 2]:.3f}", flush=True)
    print(f"SLOWEST {slowest:.3f}", flush=True)
    before = agg_stat()["bytes_sent"]
    for k in range(4):
        check(4 << 20, 1000 + k)
    assert agg_stat()["bytes_sent"] > before, "the re-admitted rail carries nothing"
    print(f"OK rank {RANK}", flush=True)
