"""Inputs every rank can compute for every other rank, and numpy's answer for each reduction."""
import ml_dtypes
import numpy as np

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, ml_dtypes.bfloat16,
          np.float32, np.float64, np.bool_]


def make_input(rank, n, dtype, op_name, salt=0):
    """Rank `rank`'s input: small values, so sums and products are exact or nearly so."""
    rng = np.random.default_rng(1000 * rank + 17 * n + salt)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if op_name == "Product":
        vals = rng.choice([1, 2], n) if dt.kind in "ui" else rng.uniform(0.9, 1.1, n)
        return np.asarray(vals).astype(dt)
    if dt.kind == "u":
        return rng.integers(0, 4, n).astype(dt)
    if dt.kind == "i":
        return rng.integers(-3, 4, n).astype(dt)
    return rng.standard_normal(n).astype(dt)


def reduction(inputs, dt, op_name):
    """The reduction of `inputs` (one per rank) in float64 (floats) or exact integers."""
    size = len(inputs)
    wide = np.float64 if dt.kind == "f" or dt == np.dtype(ml_dtypes.bfloat16) else None
    stack = np.stack([x.astype(wide) if wide else x for x in inputs])
    if dt == np.bool_:
        fn = {"Sum": np.any, "Max": np.any, "Min": np.all, "Product": np.all}[op_name]
        return fn(stack, axis=0)
    if op_name in ("Sum", "Average"):
        total = stack.sum(axis=0, dtype=wide or np.int64)
        if op_name == "Average":
            total = total.astype(np.float64) / size
            if not wide:
                total = np.trunc(total)  # integer averages round toward zero
        return total
    return {"Min": np.min, "Max": np.max, "Product": np.prod}[op_name](stack, axis=0)


def matches(got, want, dt, size):
    """Exact for integers and bool; within the dtype's rounding for floats."""
    if dt.kind in "uib":
        return np.array_equal(got, want.astype(dt) if dt.kind != "b" else want)
    tol = {2: 2e-2, 4: 1e-5, 8: 1e-12}[dt.itemsize]
    return np.allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=tol,
                       atol=tol * size)
