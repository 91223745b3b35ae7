"""Allreduces over the shared-memory collective rail against numpy: float32/float64/int32/float16
sums, max and product of sizes around the rail's chunks (odd, not divisible by the ranks), in place
of a few MB, bit-identical on every rank; then rail_stats() must list the shmcoll rail and, with
expect_all_on_shmcoll, show it carried every byte, with expect_large_on_shmcoll every byte of the
allreduces of 64 KiB and more (the rail table gives those to it whatever the cost model says).
Prints 'OK rank R: ...'.
usage: shm_coll_check.py [expect_all_on_shmcoll|expect_large_on_shmcoll]"""
import hashlib
import sys

import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
ALL_ON_SHMCOLL = len(sys.argv) > 1 and sys.argv[1] == "expect_all_on_shmcoll"
LARGE_ON_SHMCOLL = len(sys.argv) > 1 and sys.argv[1] == "expect_large_on_shmcoll"
LARGE = 64 << 10  # multirail::kCollectiveHostMemoryBytes
SIZES = [(64 << 10) // 4 + 3, (1 << 20) // 4 + 1, 3 * (1 << 20) + 7]
CASES = [(np.float32, nezha.Sum), (np.float64, nezha.Sum), (np.int32, nezha.Max),
         (np.float16, nezha.Sum), (np.float64, nezha.Product), (np.float32, nezha.Average)]


def make(rank, n, dtype, op):
    rng = np.random.default_rng(1000 * rank + n)
    if op is nezha.Product:
        return rng.choice([0.5, 1.0, 2.0], size=n).astype(dtype)  # exact: no rounding-order effects
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, size=n).astype(dtype)
    if dtype is np.float16:
        return rng.integers(-8, 8, size=n).astype(dtype)  # exact sums in float16
    return rng.standard_normal(n).astype(dtype)


shm_bytes = large_bytes = 0
for dtype, op in CASES:
    for n in SIZES:
        inputs = [make(r, n, dtype, op) for r in range(SIZE)]
        acc = inputs[0].astype(np.float64)
        for x in inputs[1:]:
            acc = {nezha.Sum: np.add, nezha.Average: np.add, nezha.Max: np.maximum,
                   nezha.Product: np.multiply}[op](acc, x.astype(np.float64))
        if op is nezha.Average:
            acc = acc / SIZE
        got = nezha.allreduce(inputs[RANK].copy(), op=op, name=f"coll.{np.dtype(dtype).name}.{n}")
        # shmcoll sums in rank order, as `acc` does: float64 sums match to the bit. The ring beside it
        # (the cost model may choose it) adds in another order: the last bits may differ.
        tol = {np.float32: 1e-5, np.float64: 0 if ALL_ON_SHMCOLL else 1e-12}.get(dtype, 0)
        assert np.allclose(got.astype(np.float64), acc, rtol=tol, atol=tol), \
            f"{np.dtype(dtype).name} n={n}: got {got[:4]}, want {acc[:4]}"
        digest = np.frombuffer(hashlib.sha256(got.tobytes()).digest()[:16], np.uint8)
        everyone = nezha.allgather(digest[None, :], name=f"digest.{np.dtype(dtype).name}.{n}")
        assert all(np.array_equal(everyone[0], everyone[r]) for r in range(SIZE)), "ranks differ"
        shm_bytes += got.nbytes
        large_bytes += got.nbytes if got.nbytes >= LARGE else 0

stats = nezha.rail_stats()
coll = [s for s in stats if s["kind"] == "shmcoll"]
assert len(coll) == 1, stats
carried = coll[0]["bytes_sent"]
if ALL_ON_SHMCOLL:
    assert carried == shm_bytes, (carried, shm_bytes, stats)
if LARGE_ON_SHMCOLL:
    assert large_bytes > 0 and carried >= large_bytes, (carried, large_bytes, stats)
# Else the cost model may give every allreduce to the shm ring beside it: the results are the check.
print(f"OK rank {RANK}: {carried} of {shm_bytes} allreduce bytes over {coll[0]['name']}", flush=True)
