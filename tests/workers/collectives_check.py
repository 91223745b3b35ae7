"""Runs every collective across the job's ranks and checks each result against numpy.

Every rank can compute every other rank's input (seeded by rank), so each checks its own result
against an independent numpy reference, then all ranks compare digests to prove the results are
bit-identical everywhere. Exits non-zero (AssertionError) on the first wrong result.
"""
import hashlib

import numpy as np

import nezha
from numpy_reference import DTYPES, make_input, matches, reduction

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
SIZES = [0, 1, 7, (1 << 20) // 4 + 1]  # elements: empty, one, odd, >= 1 MiB + 1 of float32
OPS = {"Sum": nezha.Sum, "Average": nezha.Average, "Min": nezha.Min, "Max": nezha.Max,
       "Product": nezha.Product}
checks = 0


def assert_close(got, want, dt, what):
    global checks
    checks += 1
    g, w = np.asarray(got), np.asarray(want)
    assert matches(g, w, dt, SIZE), f"{what}: got {g.reshape(-1)[:8]}, want {w.reshape(-1)[:8]}"


def digest(arr):
    return np.frombuffer(hashlib.sha256(np.ascontiguousarray(arr).tobytes()).digest()[:16], np.uint8)


def assert_identical_everywhere(arr, what):
    global checks
    checks += 1
    d = nezha.allgather(digest(arr)[None, :], name=f"digest.{what}")
    assert all(np.array_equal(d[0], d[r]) for r in range(SIZE)), f"{what}: ranks differ"


# allreduce: every dtype x op x size
for dtype in DTYPES:
    dt = np.dtype(dtype)
    for op_name, op in OPS.items():
        if dt == np.bool_ and op_name == "Average":
            continue
        for n in SIZES:
            if n > 1000 and (dt.itemsize < 4 or op_name in ("Min", "Product")):
                continue  # large case once per 4/8-byte dtype and op family keeps the run short
            inputs = [make_input(r, n, dt, op_name) for r in range(SIZE)]
            name = f"ar.{dt.name}.{op_name}.{n}"
            got = nezha.allreduce(inputs[RANK], op=op, name=name)
            assert got.dtype == dt and got.shape == (n,), (name, got.dtype, got.shape)
            assert_close(got, reduction(inputs, dt, op_name), dt, name)
            if dt.kind == "f" and n > 1:
                assert_identical_everywhere(got, name)

# prescale / postscale, in place
x = make_input(RANK, 1000, np.float64, "Sum")
want = sum(make_input(r, 1000, np.float64, "Sum") * 0.5 for r in range(SIZE)) * 3.0
out = nezha.allreduce(x, op=nezha.Sum, name="scaled", prescale_factor=0.5, postscale_factor=3.0,
                      out=x)
assert out is x
assert_close(x, want, np.dtype(np.float64), "scaled in place")

# many small tensors in flight at once: fused by the engine
handles = []
for i in range(60):
    n = 1 + (i * 37) % 500
    handles.append((i, n, nezha.allreduce_async(make_input(RANK, n, np.float32, "Sum", i),
                                                op=nezha.Sum, name=f"fused.{i}")))
for i, n, h in handles:
    ref = reduction([make_input(r, n, np.float32, "Sum", i) for r in range(SIZE)],
                    np.dtype(np.float32), "Sum")
    assert_close(h.wait(), ref, np.dtype(np.float32), f"fused.{i}")

# grouped allreduce
xs = [make_input(RANK, n, np.float32, "Sum", 99) for n in (3, 0, 1000)]
outs = nezha.grouped_allreduce(xs, op=nezha.Average, name="group")
for n, got in zip((3, 0, 1000), outs):
    ref = reduction([make_input(r, n, np.float32, "Sum", 99) for r in range(SIZE)],
                    np.dtype(np.float32), "Average")
    assert_close(got, ref, np.dtype(np.float32), f"group.{n}")

# allgather: dim 0 differs per rank (rank 0 contributes no rows)
for dtype in (np.float32, np.int64, np.uint8, np.int16):
    for row_shape in ((), (3,), (2, 5)):
        rows = [r % 3 for r in range(SIZE)]
        parts = [np.full((rows[r],) + row_shape, r + 1, dtype=dtype) for r in range(SIZE)]
        got = nezha.allgather(parts[RANK], name=f"ag.{np.dtype(dtype).name}.{len(row_shape)}")
        want = np.concatenate(parts, axis=0)
        assert got.shape == want.shape and np.array_equal(got, want), ("allgather", got, want)
        checks += 1
big = make_input(RANK, (1 << 20) + 1, np.uint8, "Sum")
got = nezha.allgather(big, name="ag.big")
assert np.array_equal(got, np.concatenate([make_input(r, (1 << 20) + 1, np.uint8, "Sum")
                                           for r in range(SIZE)]))

# broadcast from every root
for root in range(SIZE):
    for n in (0, 1, 7, (1 << 18) + 1):
        x = make_input(RANK, n, np.float32, "Sum", root)
        got = nezha.broadcast(x, root_rank=root, name=f"bc.{root}.{n}")
        assert np.array_equal(got, make_input(root, n, np.float32, "Sum", root)), ("bcast", root, n)
        checks += 1

# alltoall with uneven splits: rank r sends (r + d) % 3 rows to rank d
def a2a_block(src, dst, rows):
    return np.full((rows, 2), 100 * src + dst, dtype=np.int32)

splits = [(RANK + d) % 3 for d in range(SIZE)]
x = np.concatenate([a2a_block(RANK, d, splits[d]) for d in range(SIZE)])
got, received = nezha.alltoall(x, splits=splits, name="a2a")
want_splits = [(s + RANK) % 3 for s in range(SIZE)]
want = np.concatenate([a2a_block(s, RANK, want_splits[s]) for s in range(SIZE)])
assert list(received) == want_splits and np.array_equal(got, want), ("alltoall", got, want)
checks += 1

# reducescatter: rows not divisible by the number of ranks
for rows in (SIZE * 3 + 1, 1, (1 << 16) + 3):
    inputs = [make_input(r, rows * 4, np.float32, "Sum", rows).reshape(rows, 4) for r in range(SIZE)]
    got = nezha.reducescatter(inputs[RANK], op=nezha.Sum, name=f"rs.{rows}")
    full = reduction(inputs, np.dtype(np.float32), "Sum")
    counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    start = sum(counts[:RANK])
    assert got.shape == (counts[RANK], 4), (got.shape, counts)
    assert_close(got, full[start:start + counts[RANK]], np.dtype(np.float32), f"rs.{rows}")

# grouped allgather and reducescatter: negotiated as one unit, fused into one operation each
# (sizes up to 64 KB per tensor: above what rank 0 does inline, below what runs alone)
for dtype in (np.float32, np.int32, np.float16, np.uint8):
    dt = np.dtype(dtype)
    rows = [[(r * 7 + t * 3) % 5 * (1 + 1000 * (t % 2)) for t in range(4)] for r in range(SIZE)]
    shapes = [(), (3,), (2, 2), (1,)]
    parts = [[make_input(r, rows[r][t] * int(np.prod(shapes[t])), dtype, "Sum", t)
              .reshape((rows[r][t],) + shapes[t]) for t in range(4)] for r in range(SIZE)]
    got = nezha.grouped_allgather(parts[RANK], name=f"gag.{dt.name}")
    for t in range(4):
        want = np.concatenate([parts[r][t] for r in range(SIZE)], axis=0)
        assert got[t].dtype == want.dtype and got[t].shape == want.shape, (t, got[t].shape, want.shape)
        assert np.array_equal(got[t], want), ("grouped allgather", dt.name, t)
        checks += 1
    if dt.kind == "u":
        continue
    lens = [SIZE * 2000 + 1, 1, SIZE - 1 if SIZE > 1 else 1, 4099]
    inputs = [[make_input(r, n * 2, dtype, "Sum", 50 + t).reshape(n, 2) for t, n in enumerate(lens)]
              for r in range(SIZE)]
    got = nezha.grouped_reducescatter(inputs[RANK], op=nezha.Sum, name=f"grs.{dt.name}")
    for t, n in enumerate(lens):
        full = reduction([inputs[r][t] for r in range(SIZE)], dt, "Sum")
        counts = [n // SIZE + (1 if r < n % SIZE else 0) for r in range(SIZE)]
        start = sum(counts[:RANK])
        assert got[t].shape == (counts[RANK], 2), (t, got[t].shape, counts)
        assert_close(got[t], full[start:start + counts[RANK]], dt, f"grs.{dt.name}.{t}")
        checks += 1

# join: rank r does r extra allreduces; the others take part with zeros
for i in range(RANK):
    got = nezha.allreduce(np.ones(4, np.float32), op=nezha.Sum, name=f"uneven.{i}")
    assert np.array_equal(got, np.full(4, SIZE - 1 - i, np.float32)), ("join", i, got)
last = nezha.join()
assert last == SIZE - 1, last
nezha.barrier()
print(f"OK rank {RANK}: {checks} checks", flush=True)
nezha.shutdown()
