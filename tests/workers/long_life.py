"""A long life: thousands of mixed operations in one pair of processes, then nothing left behind.

Every collective, dtype and size class, sync and async; some handles dropped, some operations made
to fail by a mismatch or by a user exception with an operation in flight. Every observed result is
checked against numpy. After shutdown() no native thread, socket or buffer of the engine may remain.
The same sequence on every rank (seeded by the round).  usage: long_life.py ROUNDS
"""
import gc
import os
import sys
import threading
import time
import weakref

import numpy as np

# The sanitizer tier runs with PYTHONSAFEPATH (scripts/asan_python.sh): find the sibling module.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_reference import DTYPES, make_input, matches, reduction  # noqa: E402


def native_threads():
    return len(os.listdir("/proc/self/task"))


def open_sockets():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


BASE_THREADS, BASE_SOCKETS = native_threads(), open_sockets()  # numpy's own threads included
import nezha  # noqa: E402

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
print("READY", flush=True)
ROUNDS = int(sys.argv[1])
INLINE = int(os.environ.get("NEZHA_CONTROL_INLINE_BYTES", "16384")) // max(1, SIZE - 1)
# Elements: none, one, within rank 0's inline limit (for 8-byte types), on the rails, above the
# fusion threshold the test sets.
SIZES = [0, 1, INLINE // 8, 20000, 150000]
KINDS = ["allreduce", "allreduce", "inplace", "grouped", "allgather", "broadcast", "alltoall",
         "reducescatter", "barrier"]
OPS = {"Sum": nezha.Sum, "Average": nezha.Average, "Min": nezha.Min, "Max": nezha.Max,
       "Product": nezha.Product}
released, pending = [], []
stats = {"checked": 0, "dropped": 0, "failed": 0}


def plan(r):
    rng = np.random.default_rng(r)
    dt = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
    op_name = str(rng.choice(list(OPS)))
    if dt == np.bool_ and op_name == "Average":
        op_name = "Sum"
    n = int(rng.choice(SIZES, p=[0.05, 0.2, 0.35, 0.3, 0.1]))
    mode = str(rng.choice(["sync", "kept", "dropped"], p=[0.5, 0.3, 0.2]))
    return str(rng.choice(KINDS)), dt, op_name, n, mode


def start(r, kind, dt, op_name, n):
    """Submits round r's operation; returns (handle, expected result or None, input)."""
    name = f"{kind}.{r}"
    x = make_input(RANK, n, dt, op_name, r)
    ins = lambda: [make_input(q, n, dt, op_name, r) for q in range(SIZE)]  # noqa: E731
    if kind in ("allreduce", "inplace"):
        out = x if kind == "inplace" else None
        h = nezha.allreduce_async(x, op=OPS[op_name], name=name, out=out)
        return h, lambda: reduction(ins(), dt, op_name), x
    if kind == "grouped":
        y = make_input(RANK, n + 3, dt, op_name, r + 1)
        h = nezha.grouped_allreduce_async([x, y], op=OPS[op_name], name=name)
        ys = lambda: [make_input(q, n + 3, dt, op_name, r + 1) for q in range(SIZE)]  # noqa: E731
        return h, lambda: [reduction(ins(), dt, op_name), reduction(ys(), dt, op_name)], x
    if kind == "allgather":
        x = make_input(RANK, n + RANK, dt, op_name, r)  # dim 0 differs per rank
        h = nezha.allgather_async(x, name=name)
        return h, lambda: np.concatenate([make_input(q, n + q, dt, op_name, r)
                                          for q in range(SIZE)]), x
    if kind == "broadcast":
        h = nezha.broadcast_async(x, r % SIZE, name=name)
        return h, lambda: ins()[r % SIZE], x
    if kind == "alltoall":  # rank s sends (s + d + r) % 3 rows of 2 to rank d
        rows = lambda s, d: (s + d + r) % 3  # noqa: E731
        block = lambda s, d: make_input(s, 2 * rows(s, d), dt, op_name, 7 * r + d).reshape(-1, 2)
        x = np.concatenate([block(RANK, d) for d in range(SIZE)])
        h = nezha.alltoall_async(x, splits=[rows(RANK, d) for d in range(SIZE)], name=name)
        return h, lambda: np.concatenate([block(s, RANK) for s in range(SIZE)]), x
    if kind == "reducescatter":
        rows = SIZE + r % 3
        x = make_input(RANK, rows * 2, dt, "Sum", r).reshape(rows, 2)
        h = nezha.reducescatter_async(x, op=nezha.Sum, name=name)
        counts = [rows // SIZE + (q < rows % SIZE) for q in range(SIZE)]
        first = sum(counts[:RANK])

        def want():
            full = reduction([make_input(q, rows * 2, dt, "Sum", r).reshape(rows, 2)
                              for q in range(SIZE)], dt, "Sum")
            return full[first:first + counts[RANK]]
        return h, want, x
    nezha.barrier()
    return None, None, None


def check(r, kind, dt, got, want):
    if kind == "alltoall":
        got = got[0]
    gots, wants = (got, want) if kind == "grouped" else ([got], [want])
    for g, w in zip(gots, wants):
        assert matches(np.asarray(g).reshape(-1), np.asarray(w).reshape(-1), dt, SIZE), (
            f"rank {RANK}: {kind} round {r} ({dt}) differs from numpy")
    stats["checked"] += 1


def finish_pending():
    for r, kind, dt, h, want in pending:
        check(r, kind, dt, h.wait(60), want())
    pending.clear()


started = time.monotonic()
for r in range(ROUNDS):
    if r % 97 == 50:  # a mismatch: raises on every rank, the job goes on
        try:
            nezha.allreduce(np.ones(5 + RANK, np.float32), name=f"mismatch.{r}")
            raise AssertionError("a mismatch did not raise")
        except nezha.NezhaError:
            stats["failed"] += 1
        continue
    if r % 89 == 40:  # a user exception with an operation in flight: its handle goes
        try:
            nezha.allreduce_async(make_input(RANK, 20000, np.float32, "Sum", r), name=f"exc.{r}")
            raise KeyError("user code failed")
        except KeyError:
            stats["dropped"] += 1
        continue
    kind, dt, op_name, n, mode = plan(r)
    h, want, x = start(r, kind, dt, op_name, n)
    if x is not None:
        released.append(weakref.ref(x))
    if h is None:
        continue
    if mode == "sync":
        check(r, kind, dt, h.wait(60), want())
    elif mode == "kept":
        pending.append((r, kind, dt, h, want))
    else:
        stats["dropped"] += 1
    del h, x
    if len(pending) >= 8:
        finish_pending()
    if r % 50 == 0:
        gc.collect()
finish_pending()
nezha.barrier()
elapsed = time.monotonic() - started
nezha.shutdown()

deadline = time.monotonic() + 20
while time.monotonic() < deadline and (any(w() is not None for w in released)
                                       or native_threads() > BASE_THREADS):
    gc.collect()
    time.sleep(0.05)
alive = sum(w() is not None for w in released)
assert alive == 0, f"rank {RANK}: {alive} operations' buffers outlived shutdown()"
assert nezha._core.testing.deferred_release_count() == 0
assert native_threads() == BASE_THREADS, f"threads: {native_threads()} now, {BASE_THREADS} before"
assert open_sockets() == BASE_SOCKETS, f"sockets: {open_sockets()} now, {BASE_SOCKETS} before"
assert threading.active_count() == 1, threading.enumerate()
print(f"OK rank {RANK}: {ROUNDS} rounds, {stats['checked']} checked, {stats['dropped']} dropped, "
      f"{stats['failed']} failed on purpose, {elapsed:.1f} s; no thread, socket or buffer left",
      flush=True)
