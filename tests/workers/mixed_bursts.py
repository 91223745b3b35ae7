"""Bursts of concurrent operations of mixed kinds and sizes, submitted and waited for in a different
order on every rank, each result checked against numpy. Sizes straddle the limits of the collectives
rank 0 does within negotiation (NEZHA_CONTROL_INLINE_BYTES), so both paths, fusion, response-cache hits
and invalidations are mixed in one stream. With `big`, every round also has a 4 MiB allreduce, striped
over all rails (so a rail cut always meets traffic).  usage: mixed_bursts.py ROUNDS [big]
"""
import os
import sys
import time

import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
ROUNDS = int(sys.argv[1])
BIG = sys.argv[2:] == ["big"]
print("READY", flush=True)
per_tensor = int(os.environ.get("NEZHA_CONTROL_INLINE_BYTES", "16384")) // max(1, SIZE - 1)
COUNTS = sorted({c for c in (1, 3, per_tensor // 4, per_tensor // 4 + 1, 5000, 70000) if c > 0})
KINDS = ("sum", "average", "max", "grouped", "broadcast", "allgather")
DTYPES = (np.float32, np.int32, np.float64)


def make_input(rnd, i, rank, n, dtype):
    # Small integers: sums are exact in any order, so results must equal numpy's exactly.
    rng = np.random.default_rng([rnd, i, rank])
    return rng.integers(-50, 50, n).astype(dtype)


def plan(rnd):
    """The round's operations; the same on every rank, and in rounds 2k and 2k + 1 (the second a
    response-cache hit for each name, the next pair mostly new metadata under the same names)."""
    rng = np.random.default_rng(rnd // 2)
    return [(str(rng.choice(KINDS)), int(rng.choice(COUNTS)), DTYPES[int(rng.integers(len(DTYPES)))],
             int(rng.integers(SIZE))) for _ in range(10)]


def start(rnd, i, kind, n, dtype, root):
    name = f"op{i}"
    x = make_input(rnd, i, RANK, n, dtype)
    everyone = [make_input(rnd, i, r, n, dtype) for r in range(SIZE)]
    if kind in ("sum", "average", "max"):
        op = {"sum": nezha.Sum, "average": nezha.Average, "max": nezha.Max}[kind]
        want = {"sum": lambda: np.sum(everyone, axis=0, dtype=dtype),
                # Integers average toward zero; floats within rounding of the exact mean.
                "average": lambda: np.trunc(np.sum(everyone, axis=0, dtype=np.float64) / SIZE).astype(dtype),
                "max": lambda: np.max(everyone, axis=0)}[kind]()
        if kind == "average" and np.dtype(dtype).kind == "f":
            want = np.sum(everyone, axis=0, dtype=np.float64) / SIZE
        return nezha.allreduce_async(x, op=op, name=name), want
    if kind == "grouped":
        parts = [x[:1], x, x[: max(1, n // 2)]]
        want = [np.sum([p[:len(q)] for p in everyone], axis=0, dtype=dtype) for q in parts]
        return nezha.grouped_allreduce_async(parts, op=nezha.Sum, name=name), want
    if kind == "broadcast":
        return nezha.broadcast_async(x, root, name=name), everyone[root]
    rows = [make_input(rnd, i, r, n * (r + 1), dtype).reshape(r + 1, n) for r in range(SIZE)]
    return nezha.allgather_async(rows[RANK], name=name), np.concatenate(rows)


def check(got, want, what):
    if isinstance(want, list):
        for g, w in zip(got, want):
            check(g, w, what)
        return
    assert got.shape == np.shape(want) and got.dtype.kind == np.asarray(want).dtype.kind, (what, got.shape)
    if got.dtype.kind == "f":
        assert np.allclose(got, want, rtol=1e-6, atol=0), (what, got[:4], want[:4])
    else:
        assert np.array_equal(got, want), (what, got[:4], want[:4])


ops = 0
longest_round, last = 0.0, time.monotonic()
for rnd in range(ROUNDS):
    order = np.random.default_rng([rnd, 1000 + RANK]).permutation(10)
    ops_plan = plan(rnd)
    if BIG:
        ops_plan.append(("sum", 1 << 20, np.float32, 0))  # 4 MiB: striped over every rail
        order = np.append(order, len(ops_plan) - 1)
    started = {i: start(rnd, i, *ops_plan[i]) for i in order}
    for i in np.random.default_rng([rnd, 2000 + RANK]).permutation(len(ops_plan)):
        handle, want = started[i]
        check(handle.wait(timeout_s=30), want, (rnd, int(i), ops_plan[i][:3]))
        ops += 1
    now = time.monotonic()
    longest_round, last = max(longest_round, now - last), now
nezha.barrier()
print(f"OK rank {RANK}: {ops} operations, counts {COUNTS}, longest round {longest_round:.2f} s", flush=True)
nezha.shutdown()
