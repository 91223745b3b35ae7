"""nezha.allreduce's direct path for plain numpy arrays (ops._allreduce_now) against the layered
one (allreduce_async + Handle.wait, what every other input takes) and numpy.

Every dtype the direct path takes, every reduction, with and without scaling, 0-d and 2-d shapes,
small (done by rank 0 within negotiation) and large (on the rails): the two paths give the same
bits, within tolerance of numpy's answer, the input is left as it was, and the result is a new
array of the input's shape and dtype; into out= (another array, or the input itself) likewise.
Inputs the direct path leaves to the layered one (bfloat16, a non-contiguous view, an out= of
another shape) still work, and a bad one is refused as before.
"""
import os
import sys

import ml_dtypes
import numpy as np

import nezha
import nezha.ops as ops

sys.path.insert(0, os.path.dirname(__file__))
from numpy_reference import DTYPES, make_input, reduction  # noqa: E402

nezha.init()
r, n = nezha.rank(), nezha.size()
OPS = {"Sum": nezha.Sum, "Average": nezha.Average, "Min": nezha.Min, "Max": nezha.Max,
       "Product": nezha.Product}


def fail(what):
    print(f"FAIL rank {r}: {what}", flush=True)
    os._exit(1)


def layered(x, **kw):
    return ops.started_by_waiter(ops.allreduce_async, x, **kw).wait()


checked = 0
for dtype in DTYPES:
    dt = np.dtype(dtype)
    if dt.kind == "V":  # bfloat16: the layered path's (a dtype override), checked below
        continue
    for op_name, op in OPS.items():
        if dt == np.bool_ and op_name == "Average":
            continue
        for elements in (2, 3 * 65536):
            inputs = [make_input(q, elements, dt, op_name, salt=7) for q in range(n)]
            x = inputs[r].copy()
            name = f"{dt.name}.{op_name}.{elements}"
            got = nezha.allreduce(x, op=op, name=name + ".direct")
            want = layered(x, op=op, name=name + ".layered")
            if not np.array_equal(x, inputs[r]):
                fail(f"{name}: the input changed")
            if got is x or got.shape != x.shape or got.dtype != x.dtype:
                fail(f"{name}: result {got.dtype}{got.shape}, input {x.dtype}{x.shape}")
            if got.tobytes() != want.tobytes():
                fail(f"{name}: direct {got[:4]} != layered {want[:4]}")
            ref = reduction(inputs, dt, op_name)
            tol = {np.dtype(np.float16): 2e-2, np.dtype(np.float32): 1e-5}.get(dt, 1e-12)
            if dt.kind == "f" and not np.allclose(got.astype(np.float64), ref, rtol=tol, atol=tol):
                fail(f"{name}: {got[:4]} vs numpy {ref[:4]}")
            if dt.kind != "f" and not np.array_equal(got, ref.astype(dt)):
                fail(f"{name}: {got[:4]} vs numpy {ref[:4]}")
            checked += 1

# Scaling, and shapes: the same bits both ways.
for shape in ((), (3, 5)):
    x = np.full(shape, r + 0.5, np.float32)
    kw = dict(op=nezha.Sum, prescale_factor=0.25, postscale_factor=3.0)
    got, want = nezha.allreduce(x, name=f"scaled{len(shape)}.d", **kw), layered(x, name=f"scaled{len(shape)}.l", **kw)
    expect = np.float32(3.0) * sum(np.float32(q + 0.5) * np.float32(0.25) for q in range(n))
    if got.shape != shape or got.tobytes() != want.tobytes() or not np.allclose(got, expect):
        fail(f"scaled {shape}: {got} / {want}, expected {expect}")
    checked += 1

# What the direct path leaves to the layered one.
bf = np.full(4, r + 1, ml_dtypes.bfloat16)
got = nezha.allreduce(bf, op=nezha.Sum, name="bf16")
if got.dtype != bf.dtype or not np.array_equal(got.astype(np.float32), np.full(4, n * (n + 1) / 2, np.float32)):
    fail(f"bfloat16: {got}")
strided = np.arange(8, dtype=np.float32)[::2]
try:
    nezha.allreduce(strided, name="strided")
    fail("a non-contiguous input was accepted")
except ValueError as e:
    if "C-contiguous" not in str(e):
        fail(f"non-contiguous: {e}")
# out=: another array, and the input itself (in place), both ways alike.
for elements in (2, 3 * 65536):
    base = make_input(r, elements, np.float32, "Sum", salt=3)
    out = np.empty_like(base)
    got = nezha.allreduce(base, op=nezha.Sum, name=f"out.{elements}", out=out)
    want = layered(base, op=nezha.Sum, name=f"out.l.{elements}", out=np.empty_like(base))
    if got is not out or out.tobytes() != want.tobytes():
        fail(f"out= ({elements}): {out[:4]} / {want[:4]}")
    inplace = base.copy()
    got = nezha.allreduce(inplace, op=nezha.Sum, name=f"inplace.{elements}", out=inplace)
    if got is not inplace or inplace.tobytes() != want.tobytes():
        fail(f"in place ({elements}): {inplace[:4]} / {want[:4]}")
    checked += 2
try:
    nezha.allreduce(np.ones(2, np.float32), name="badout", out=np.empty(3, np.float32))
    fail("an out= of another shape was accepted")
except ValueError as e:
    if "shape" not in str(e):
        fail(f"out= of another shape: {e}")
print(f"OK rank {r}: {checked} allreduces alike both ways", flush=True)
nezha.shutdown()
