"""Asynchronous operations whose handles are dropped at once, with garbage collection and allocation
churn in between: the engine must keep each operation's buffers alive until it is done with them.

Every collective, on sizes either side of the inline limit (done by rank 0 within negotiation) and of
NEZHA_FUSION_THRESHOLD, through the numpy API, through it with buffer-protocol (memoryview of a
bytearray) and DLPack (torch tensor) inputs in turn, or through nezha.torch. Every 7th operation keeps its handle
and checks its result against numpy; churn arrays filled with a pattern must still hold it one step
later (the engine writing into freed memory would corrupt them, or crash); at the end every dropped
input must have been released (no leak).
usage: dropped_handles.py numpy|buffers|torch COUNT [MARK_EVERY]
"""
import gc
import os
import sys
import time
import weakref

import numpy as np

API, COUNT = sys.argv[1], int(sys.argv[2])
MARK_EVERY = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # print a progress mark (for rail cuts)

if API in ("torch", "buffers"):
    import torch
if API == "torch":
    import nezha.torch as hvd
    hvd.init()
    RANK, SIZE = hvd.rank(), hvd.size()
else:
    import nezha
    nezha.init()
    RANK, SIZE = nezha.rank(), nezha.size()
print("READY", flush=True)

INLINE_ELEMS = int(os.environ.get("NEZHA_CONTROL_INLINE_BYTES", "16384")) // max(1, SIZE - 1) // 4
FUSION_ELEMS = int(os.environ.get("NEZHA_FUSION_THRESHOLD", str(64 << 20))) // 4
# Rows of 4 float32 each: inline, on the rails and fused, above the fusion threshold.
ROWS = sorted({max(SIZE, INLINE_ELEMS // 8 // SIZE * SIZE), 4096 * SIZE,
               (FUSION_ELEMS // 4 + 1000) // SIZE * SIZE})
KINDS = ("allreduce", "allreduce_inplace", "grouped", "allgather", "broadcast", "alltoall",
         "reducescatter")


def make_input(i, rank, rows):
    # Small integers: sums are exact in float32 in any order.
    return ((np.arange(rows * 4, dtype=np.int64).reshape(rows, 4) * 7 + i * 13 + rank * 5) % 41
            - 20).astype(np.float32)


def expected(kind, i, rows):
    ins = [make_input(i, r, rows) for r in range(SIZE)]
    if kind in ("allreduce", "allreduce_inplace", "grouped"):
        return sum(ins)
    if kind == "allgather":
        return np.concatenate(ins)
    if kind == "broadcast":
        return ins[i % SIZE]
    if kind == "alltoall":
        step = rows // SIZE
        return np.concatenate([x[RANK * step:(RANK + 1) * step] for x in ins])
    step = rows // SIZE  # reducescatter: equal blocks
    return sum(ins)[RANK * step:(RANK + 1) * step]


def submit(kind, i, x):
    """Starts `kind` on x (numpy) and returns (handle, object whose release shows the engine let go)."""
    name = f"{kind}.{i}"
    if API == "torch":
        t = torch.from_numpy(x)
        ops = {
            "allreduce": lambda: hvd.allreduce_async(t, name=name, op=hvd.Sum),
            "allreduce_inplace": lambda: hvd.allreduce_async_(t, name=name, op=hvd.Sum),
            "grouped": lambda: hvd.grouped_allreduce_async([t], name=name, op=hvd.Sum),
            "allgather": lambda: hvd.allgather_async(t, name=name),
            "broadcast": lambda: hvd.broadcast_async(t, i % SIZE, name=name),
            "alltoall": lambda: hvd.alltoall_async(t, name=name),
            "reducescatter": lambda: hvd.reducescatter_async(t, name=name, op=hvd.Sum),
        }
        return ops[kind](), t
    if API == "buffers":
        if i % 3 == 0:  # buffer protocol: the engine pins the bytearray's export
            x = memoryview(bytearray(x.tobytes())).cast("B").cast("f", x.shape)
        elif i % 3 == 1:  # DLPack
            x = torch.from_numpy(x)
    ops = {
        "allreduce": lambda: nezha.allreduce_async(x, op=nezha.Sum, name=name),
        "allreduce_inplace": lambda: nezha.allreduce_async(x, op=nezha.Sum, name=name, out=x),
        "grouped": lambda: nezha.grouped_allreduce_async([x], op=nezha.Sum, name=name),
        "allgather": lambda: nezha.allgather_async(x, name=name),
        "broadcast": lambda: nezha.broadcast_async(x, i % SIZE, name=name),
        "alltoall": lambda: nezha.alltoall_async(x, name=name),
        "reducescatter": lambda: nezha.reducescatter_async(x, op=nezha.Sum, name=name),
    }
    return ops[kind](), x


def result_array(kind, result):
    if kind == "grouped":
        result = result[0]
    if kind == "alltoall":
        result = result[0]
    return result.numpy() if API == "torch" else np.asarray(result)


def wait(handle):
    return hvd.synchronize(handle) if API == "torch" else handle.wait()


released, checked, churn = [], 0, []
start = time.monotonic()
for i in range(COUNT):
    kind = KINDS[i % len(KINDS)]
    rows = ROWS[(i // len(KINDS)) % len(ROWS)]
    handle, owner = submit(kind, i, make_input(i, RANK, rows))
    released.append(weakref.ref(owner))
    del owner
    if i % 7 == 6:
        got = result_array(kind, wait(handle))
        want = expected(kind, i, rows)
        assert got.shape == want.shape and np.array_equal(got, want), (
            f"rank {RANK}: {kind} #{i} ({rows} rows) differs from numpy")
        checked += 1
    del handle  # dropped: the result is never observed
    for j, arr in enumerate(churn):
        assert (arr == j + 1).all(), f"rank {RANK}: churn array {j} was overwritten after op {i}"
    churn = [np.full(rows * 4, j + 1, np.float32) for j in range(3)]
    if i % 16 == 0:
        gc.collect()
    if MARK_EVERY and i % MARK_EVERY == 0:
        print(f"MARK {i}", flush=True)

if API == "torch":
    hvd.barrier()
else:
    nezha.barrier()
# Every dropped operation has finished once every rank passed the barrier after it; its buffers are
# released by the time the interpreter has run its pending calls (or the next submission).
deadline = time.monotonic() + 20
while any(r() is not None for r in released) and time.monotonic() < deadline:
    gc.collect()
    time.sleep(0.05)
alive = sum(r() is not None for r in released)
assert alive == 0, f"rank {RANK}: {alive} of {COUNT} operations' buffers were never released"
print(f"OK rank {RANK}: {COUNT} operations, {checked} checked, "
      f"{time.monotonic() - start:.1f} s", flush=True)
