"""Process sets on the numpy API, across real processes (4 ranks): every collective among a set's
members against numpy references computed here from every rank's seeded inputs, overlapping sets in
flight at once beside global collectives, unnamed collectives per set, Horovod's errors (a rank
outside a set, an unregistered set, ranks that register different sets, a mismatch inside a set
raising on every member), removal, and sets given to init. Prints `OK rank R: <check>` per check."""
import numpy as np

import nezha
from nezha import horovod_api

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
assert SIZE == 4, "run on 4 ranks"


def ok(what):
    print(f"OK rank {RANK}: {what}", flush=True)


def value(rank, tag, n, dtype=np.float32):
    return ((np.arange(n) * 7 + rank * 13 + tag * 5) % 23 - 11).astype(dtype)


def expect_error(fn, kind, text):
    try:
        fn()
    except kind as error:
        assert text in str(error), f"{kind.__name__} without {text!r}: {error}"
        return
    raise AssertionError(f"no {kind.__name__} ({text})")


even = nezha.add_process_set([0, 2])
odd = nezha.add_process_set(nezha.ProcessSet([3, 1]))
trio = nezha.add_process_set([0, 1, 3])
assert (even.process_set_id, odd.process_set_id, trio.process_set_id) == (1, 2, 3)
assert odd.ranks == [1, 3] and odd.size() == 2 and odd.rank() == ([1, 3].index(RANK) if RANK in (1, 3) else -1)
mine = even if RANK % 2 == 0 else odd
ok("registered")

# Every collective in my parity set, against numpy.
members = mine.ranks
for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
    for n in (1, 17, 300001):
        x = value(RANK, n, n, dtype)
        got = nezha.allreduce(x, op=nezha.Sum, process_set=mine)
        want = sum(value(r, n, n, dtype) for r in members).astype(dtype)
        assert np.array_equal(got, want), (dtype, n, got[:4], want[:4])
        avg = nezha.allreduce(value(RANK, n, n, np.float64), process_set=mine)  # Average
        assert np.allclose(avg, sum(value(r, n, n, np.float64) for r in members) / len(members))
ok("allreduce")
gathered = nezha.allgather(np.full((RANK + 1, 2), RANK, np.int32), process_set=mine)
assert np.array_equal(gathered, np.concatenate([np.full((r + 1, 2), r, np.int32) for r in members]))
root = members[-1]
b = nezha.broadcast(value(RANK, 3, 1000), root, process_set=mine)
assert np.array_equal(b, value(root, 3, 1000))
rows = np.arange(len(members) * 3, dtype=np.float64).reshape(-1, 1) + 100 * RANK
out, splits = nezha.alltoall(rows, process_set=mine)
me = members.index(RANK)
assert np.array_equal(out, np.concatenate([np.arange(len(members) * 3).reshape(-1, 1)[me * 3:(me + 1) * 3] + 100 * r
                                           for r in members]))
assert list(splits) == [3] * len(members)
rs = nezha.reducescatter(value(RANK, 4, 10).reshape(5, 2), op=nezha.Sum, process_set=mine)
total = sum(value(r, 4, 10) for r in members).reshape(5, 2)
assert np.array_equal(rs, total[:3] if me == 0 else total[3:])
grouped = nezha.grouped_allreduce([value(RANK, 5, 9), value(RANK, 6, 4, np.float64)], op=nezha.Sum,
                                  process_set=mine)
assert np.array_equal(grouped[0], sum(value(r, 5, 9) for r in members))
assert np.array_equal(grouped[1], sum(value(r, 6, 4, np.float64) for r in members))
assert nezha.allgather_object(("r", RANK), process_set=mine) == [("r", r) for r in members]
assert nezha.broadcast_object({"from": RANK}, root_rank=members[0], process_set=mine) == {"from": members[0]}
horovod_api.barrier(mine)
ok("every collective in a set")

# Overlapping sets and the global set in flight at once, unnamed (per-set counters keep names in
# step), each in a different order on each rank.
for step in range(3):
    handles = []
    sets = [s for s in (mine, trio, nezha.global_process_set) if s.included()]
    if RANK % 2:
        sets.reverse()
    for s in sets:
        n = 1 << 18 if step == 1 else 100 + step
        handles.append((s, n, nezha.allreduce_async(value(RANK, step, n), op=nezha.Sum, process_set=s)))
    for s, n, h in handles:
        got = h.wait()
        assert np.array_equal(got, sum(value(r, step, n) for r in s.ranks)), (s, step)
ok("overlapping sets in flight")

# Errors, raised on every rank concerned; the job goes on after each.
outsider = trio if RANK == 2 else even if RANK % 2 else odd
expect_error(lambda: nezha.allreduce(np.ones(3), process_set=outsider), ValueError, f"rank {RANK} is not in")
expect_error(lambda: nezha.allreduce(np.ones(3), process_set=nezha.ProcessSet([0, 1])), ValueError,
             "is not registered")
expect_error(lambda: nezha.add_process_set([0, 2]), ValueError, "exists already")
expect_error(lambda: nezha.add_process_set([RANK]), ValueError, "registered different process sets")
expect_error(lambda: nezha.allreduce(np.ones(3 + RANK), name="mismatch", process_set=mine), nezha.NezhaError,
             "mismatched shape")
assert np.array_equal(nezha.allreduce(np.ones(2), op=nezha.Sum, process_set=mine), np.full(2, 2.0))
assert np.array_equal(nezha.allreduce(np.ones(2), op=nezha.Sum), np.full(2, 4.0))
ok("errors")

# Removal is collective; a removed set cannot be used; new sets get new ids.
assert nezha.remove_process_set(trio) and not nezha.remove_process_set(trio)
assert not nezha.remove_process_set(nezha.global_process_set)
expect_error(lambda: nezha.allreduce(np.ones(1), process_set=trio), ValueError, "is not registered")
pair = nezha.add_process_set([2, 3])
assert pair.process_set_id == 5  # 4 went to the add the ranks disagreed on
if pair.included():
    assert np.array_equal(nezha.allreduce(np.ones(2), op=nezha.Sum, process_set=pair), np.full(2, 2.0))
ok("removal")

# Sets given to init (Horovod's init(process_sets=...)) after a restart.
nezha.shutdown()
first, rest = nezha.ProcessSet([0]), nezha.ProcessSet([1, 2, 3])
horovod_api.init(process_sets=[first, rest])
assert (first.process_set_id, rest.process_set_id) == (1, 2)
expect_error(lambda: nezha.allreduce(np.ones(1), process_set=even), ValueError, "is not registered")
s = first if RANK == 0 else rest
assert np.array_equal(nezha.allreduce(np.ones(2), op=nezha.Sum, process_set=s), np.full(2, float(s.size())))
ok("init(process_sets=...)")
nezha.shutdown()
