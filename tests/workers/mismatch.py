"""Rank 1 submits different metadata under the same name; every rank must get a NezhaError naming
the tensor, the field and the ranks within 5 s, and the engine must stay usable."""
import time

import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()


def expect_error(fn, *fragments):
    start = time.monotonic()
    try:
        fn()
    except nezha.NezhaError as exc:
        elapsed = time.monotonic() - start
        msg = str(exc)
        assert elapsed < 5.0, f"error took {elapsed:.1f} s"
        for f in fragments:
            assert f in msg, f"{f!r} not in {msg!r}"
        print(f"rank {RANK} raised in {elapsed:.3f}s: {msg}", flush=True)
        return
    raise AssertionError(f"no NezhaError for {fragments}")


shape = (6,) if RANK == 1 else (5,)
expect_error(lambda: nezha.allreduce(np.ones(shape, np.float32), name="grad.w"),
             "grad.w", "shape", "[5] on rank", "[6] on rank 1")
ok = nezha.allreduce(np.ones(5, np.float32) * RANK, op=nezha.Sum, name="grad.w")
assert np.array_equal(ok, np.full(5, sum(range(SIZE)), np.float32)), ok

dtype = np.float64 if RANK == 1 else np.float32
expect_error(lambda: nezha.allreduce(np.ones(3, dtype), name="dt"), "dt", "dtype", "float64",
             "rank 1")
op = nezha.Max if RANK == 1 else nezha.Sum
expect_error(lambda: nezha.allreduce(np.ones(3, np.float32), op=op, name="op"), "'op'",
             "reduce op", "Max on rank 1")
root = 1 if RANK == 1 else 0
expect_error(lambda: nezha.broadcast(np.ones(3, np.float32), root_rank=root, name="bc"), "bc",
             "root rank")
expect_error(lambda: nezha.allgather(np.ones((2, 3 + (RANK == 1)), np.float32), name="ag"), "ag",
             "shape beyond the first dimension")
if RANK == 1:
    expect_error(lambda: nezha.broadcast(np.ones(3, np.float32), root_rank=0, name="kind"),
                 "kind", "operation")
else:
    expect_error(lambda: nezha.allreduce(np.ones(3, np.float32), name="kind"), "kind", "operation")

# Horovod's CPU/GPU check: one rank's tensor on a GPU, the other ranks' on the CPU.
device = nezha.Device.gpu if RANK == 1 else nezha.Device.cpu
expect_error(lambda: nezha.allreduce_async(np.ones(3, np.float32), name="dev",
                                           device=device).wait(5),
             "'dev'", "device (CPU/GPU)", "GPU on rank 1", "CPU on rank")
expect_error(lambda: nezha.alltoall_async(np.ones(SIZE, np.float32), name="dev_a2a",
                                          device=device).wait(5), "dev_a2a", "device")

# A grouped allreduce of 2 tensors on rank 0 and 3 elsewhere: the member only the larger groups
# have fails too (else those ranks wait for it forever), within the same 5 s.
expect_error(lambda: nezha.grouped_allreduce([np.ones(2, np.float32)] * (2 if RANK == 0 else 3),
                                             name="grp"), "grp", "group")

# Still usable, with the response cache warm (the same name twice).
for step in range(3):
    out = nezha.allreduce(np.full(4, RANK + step, np.float32), op=nezha.Sum, name="after")
    assert np.array_equal(out, np.full(4, sum(range(SIZE)) + SIZE * step, np.float32)), out
print(f"OK rank {RANK}", flush=True)
nezha.shutdown()
