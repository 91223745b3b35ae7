"""Broadcasts, allgathers (unequal rows per rank), reducescatters (rows not divisible by the ranks)
and alltoalls (unequal splits) against numpy, bit-identical on every rank, and proof they ran on the shared-memory collective rail:
its byte counters move by exactly what the rail's pipeline places and reads for each operation, and
no other rail's move at all. Sizes from 64 KiB (multirail::kCollectiveHostMemoryBytes: the rail table
gives those to shmcoll whatever the cost model says) to a few MB. Prints 'OK rank R: ...'."""
import hashlib

import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
ROW = 16  # elements per row


def counters():
    stats = nezha.rail_stats()
    coll = [s for s in stats if s["kind"] == "shmcoll"]
    assert len(coll) == 1, stats
    others = sum(s["bytes_sent"] + s["bytes_received"] for s in stats if s["kind"] != "shmcoll")
    return coll[0]["bytes_sent"], coll[0]["bytes_received"], others


def same_everywhere(arr, what):
    digest = np.frombuffer(hashlib.sha256(np.ascontiguousarray(arr).tobytes()).digest()[:16], np.uint8)
    everyone = nezha.allgather(digest[None, :], name=f"digest.{what}")
    assert all(np.array_equal(everyone[0], everyone[r]) for r in range(SIZE)), f"{what}: ranks differ"


def on_shmcoll(run, sent, received, what):
    """Runs run(); the shmcoll rail must have placed `sent` and read `received` bytes, the others none."""
    s0, r0, o0 = counters()
    out = run()
    s1, r1, o1 = counters()
    assert (s1 - s0, r1 - r0) == (sent, received), f"{what}: shmcoll moved {(s1 - s0, r1 - r0)}, want {(sent, received)}"
    assert o1 == o0, f"{what}: other rails moved {o1 - o0} bytes"
    return out


checks = 0
rng = np.random.default_rng(7)
for n, root in (((64 << 10) // 4 + 3, 1), ((1 << 20) // 4 + 1, 0), (3 * (1 << 20) + 7, SIZE - 1)):
    data = [np.random.default_rng(100 + r).standard_normal(n).astype(np.float32) for r in range(SIZE)]
    mine = data[RANK].copy()
    got = on_shmcoll(lambda: nezha.broadcast(mine, root_rank=root, name=f"bc.{n}"),
                     n * 4 if RANK == root else 0, 0 if RANK == root else n * 4, f"broadcast {n}")
    assert np.array_equal(got, data[root]), f"broadcast {n} from {root}"
    same_everywhere(got, f"bc.{n}")
    checks += 1

for base in ((64 << 10) // (4 * ROW) + 1, (1 << 20) // (4 * ROW), 2 << 15):
    rows = [base + 7 * r for r in range(SIZE)]
    blocks = [np.random.default_rng(200 + r).standard_normal((rows[r], ROW)).astype(np.float32) for r in range(SIZE)]
    total = sum(rows) * ROW * 4
    mine = rows[RANK] * ROW * 4
    got = on_shmcoll(lambda: nezha.allgather(blocks[RANK], name=f"ag.{base}"), mine, total - mine, f"allgather {base}")
    assert np.array_equal(got, np.concatenate(blocks)), f"allgather {base}"
    same_everywhere(got, f"ag.{base}")
    checks += 1

for rows, dtype, op, fold in ((SIZE * 1100 + 1, np.float64, nezha.Sum, np.add),
                              ((1 << 16) + 3, np.float32, nezha.Sum, np.add),
                              ((1 << 14) + 2, np.int32, nezha.Max, np.maximum)):
    inputs = [(np.random.default_rng(300 + r).standard_normal((rows, ROW)) * 100).astype(dtype) for r in range(SIZE)]
    want = inputs[0].copy()
    for x in inputs[1:]:
        want = fold(want, x)  # rank order, in the dtype itself: shmcoll's bits
    counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    start = sum(counts[:RANK])
    esize = np.dtype(dtype).itemsize
    got = on_shmcoll(lambda: nezha.reducescatter(inputs[RANK], op=op, name=f"rs.{rows}"),
                     (rows - counts[RANK]) * ROW * esize, counts[RANK] * ROW * esize * (SIZE - 1), f"reducescatter {rows}")
    assert got.shape == (counts[RANK], ROW), (got.shape, counts)
    assert np.array_equal(got, want[start:start + counts[RANK]]), f"reducescatter {rows} {np.dtype(dtype).name}"
    checks += 1

for base in ((64 << 10) // (4 * ROW) + 5, (1 << 20) // (4 * ROW) + 9):
    def block(i, j):  # what rank i sends rank j
        rows = base + 3 * i + 5 * j if (i + j) % 3 else 0  # some empty blocks
        return np.random.default_rng(400 + i * SIZE + j).standard_normal((rows, ROW)).astype(np.float32)
    mine = [block(RANK, j) for j in range(SIZE)]
    splits = [len(b) for b in mine]
    sent = sum(b.nbytes for j, b in enumerate(mine) if j != RANK)
    received = sum(block(i, RANK).nbytes for i in range(SIZE) if i != RANK)
    got, got_splits = on_shmcoll(lambda: nezha.alltoall(np.concatenate(mine), splits=splits, name=f"a2a.{base}"),
                                 sent, received, f"alltoall {base}")
    assert [int(x) for x in np.asarray(got_splits).reshape(-1)] == [len(block(i, RANK)) for i in range(SIZE)]
    assert np.array_equal(got, np.concatenate([block(i, RANK) for i in range(SIZE)])), f"alltoall {base}"
    checks += 1

print(f"OK rank {RANK}: {checks} operations on shmcoll", flush=True)
