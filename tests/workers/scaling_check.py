"""prescale_factor / postscale_factor give Horovod's bits exactly (numpy API, 2 or 3 ranks).

Horovod scales a tensor in its own dtype with the factor cast to it (float32, float64), in float32
for float16, and in float64 truncated toward zero for integers; prescale before the sum, postscale
(with Average's 1/size folded in) after it. `horovod_scale` below is that rule written with numpy,
independently of the engine; every result must equal it bit for bit. As in Horovod's own tests,
every rank reduces the same values where a floating-point sum of scaled values would otherwise
depend on the order of the additions.
"""
import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
np.random.seed(1234)
FACTOR = np.random.uniform()  # the factor Horovod's test_horovod_allreduce_prescale uses
DTYPES = [np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
checks = 0


def horovod_scale(x, factor):
    dt = x.dtype
    if dt == np.float16:
        return (x.astype(np.float32) * np.float32(factor)).astype(np.float16)
    if dt.kind == "f":
        return x * dt.type(factor)
    return np.trunc(x.astype(np.float64) * factor).astype(dt)


def horovod_sum(parts):
    total = parts[0].copy()
    for p in parts[1:]:  # float16 adds in float32 and rounds once per addition, as Horovod's CPU sum
        total = (total.astype(np.float32) + p).astype(np.float16) if total.dtype == np.float16 \
            else total + p
    return total


def expected(parts, op, pre, post):
    total = horovod_sum([horovod_scale(p, pre) if pre != 1.0 else p for p in parts])
    post = post / SIZE if op == nezha.Average else post
    return horovod_scale(total, post) if post != 1.0 else total


def values(dtype, rank, shape):
    rng = np.random.default_rng(77 + rank)
    return rng.integers(-100, 100, shape).astype(dtype)


def check(got, want, what):
    global checks
    checks += 1
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), \
        f"{what}: got {got.reshape(-1)[:6]}, want {want.reshape(-1)[:6]}"


shape = (SIZE * 4, 17)
for dtype in DTYPES:
    name = np.dtype(dtype).name
    same = [values(dtype, 0, shape)] * SIZE  # identical on every rank: sums of scaled values are exact
    differ = [values(dtype, r, shape) for r in range(SIZE)]  # integers: their sums are exact
    cases = [("prescale", same, nezha.Sum, FACTOR, 1.0),
             ("postscale", differ, nezha.Sum, 1.0, FACTOR),
             ("both", same, nezha.Sum, FACTOR, 1.0 / FACTOR),
             ("average", differ, nezha.Average, 1.0, 1.0),
             ("average pre", same, nezha.Average, FACTOR, 1.0)]
    for what, parts, op, pre, post in cases:
        want = expected(parts, op, pre, post)
        got = nezha.allreduce(parts[RANK], op=op, prescale_factor=pre, postscale_factor=post,
                              name=f"ar.{name}.{what}")
        check(got, want, f"allreduce {name} {what}")
        got = nezha.reducescatter(parts[RANK], op=op, prescale_factor=pre, postscale_factor=post,
                                  name=f"rs.{name}.{what}")
        check(got, want[RANK * 4:(RANK + 1) * 4], f"reducescatter {name} {what}")
    # Larger than the rank-0 inline limit: the rails' ring and log-step scale the same way.
    big = [values(dtype, 0, (SIZE * 1024, 8))] * SIZE
    got = nezha.allreduce(big[RANK], op=nezha.Sum, prescale_factor=FACTOR, postscale_factor=FACTOR,
                          name=f"ar.{name}.big")
    check(got, expected(big, nezha.Sum, FACTOR, FACTOR), f"allreduce {name} on the rails")
print(f"OK rank {RANK}: {checks} checks", flush=True)
nezha.shutdown()
