"""nezha.jax collectives against numpy references: pytrees of mixed dtypes, eager and jitted,
gradients, ordering under scan/cond, mismatched shapes; on every rank."""
import os
import sys
import time

import numpy as np

from common import assert_close, expect_error, fail, report

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import nezha.jax as nj  # noqa: E402
from nezha.bench.thread_stats import context_switches  # noqa: E402

jax.config.update("jax_enable_x64", True)
nj.init()
r, n = nj.rank(), nj.size()
MODE = sys.argv[1] if len(sys.argv) > 1 else "ffi"
if MODE == "ffi" and not nj.ffi_available():
    fail("this build has no FFI handlers; the test expects them (built against jaxlib's headers)")
hlo = jax.jit(lambda t: nj.allreduce(t, op=nj.Sum)).lower(jnp.ones(3)).as_text()
uses_ffi = "nezha_collective" in hlo
if uses_ffi != (MODE == "ffi"):
    fail("mode %s, but the lowered program %s the FFI custom call" % (MODE, "has" if uses_ffi else "lacks"))
report("path " + MODE)
if jax.default_backend() != "cpu":  # an accelerator: jitted results stay on it
    y = jax.jit(lambda t: nj.allreduce(t, op=nj.Sum))(jnp.ones(3))
    platforms = {d.platform for d in y.devices()}
    if platforms != {jax.default_backend()} or not np.allclose(np.asarray(y), n):
        fail("jitted allreduce on %s: %s on %s" % (jax.default_backend(), np.asarray(y), platforms))
    # Kernels queued just before the collective produce its input, kernels after it read its
    # result: the FFI handler must see the first (stream synchronized) and land before the second.
    big = jnp.asarray(np.random.default_rng(7).standard_normal((1024, 1024)), jnp.float32)
    work = jax.jit(lambda t: jnp.sin(t) @ jnp.cos(t).T)
    fused = jax.jit(lambda t: jnp.sum(nj.allreduce(work(t), op=nj.Sum), axis=1))(big + r)
    expected = np.sum([np.asarray(work(big + k), np.float64) for k in range(n)], 0).sum(1)
    assert_close(np.asarray(fused, np.float64), expected, "stream order around a jitted allreduce",
                 rtol=1e-4, atol=1e-2)
    report("results on the accelerator")


def rank_tree(k):
    """A pytree of mixed dtypes and shapes whose values depend on rank k."""
    rng = np.random.default_rng(100 + k)
    return {"w": rng.standard_normal((3, 5)).astype(np.float32),
            "b": (rng.standard_normal(7), rng.integers(-50, 50, (2, 2)).astype(np.int32)),
            "s": np.float32(k + 1.5),
            "h": rng.standard_normal(6).astype(np.float16),
            "bf": jnp.asarray(rng.standard_normal(4), jnp.bfloat16)}


trees = [rank_tree(k) for k in range(n)]
mine = jax.tree_util.tree_map(jnp.asarray, trees[r])
ref_sum = jax.tree_util.tree_map(lambda *xs: np.sum([np.asarray(x, np.float64) for x in xs], 0),
                                 *trees)


def check_tree(got, ref, what, average=False):
    for (path, g), e, m in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(ref),
                               jax.tree_util.tree_leaves(mine)):
        expected = (e / n if average and m.dtype.kind != "i" else e)
        if m.dtype.kind == "i" and average:
            expected = np.asarray(e) // n
        tol = 2e-2 if m.dtype in (jnp.float16, jnp.bfloat16) else 1e-5
        assert_close(np.asarray(g, np.float64) if m.dtype in (jnp.bfloat16,) else g,
                     np.asarray(expected).astype(np.float64 if m.dtype == jnp.bfloat16 else m.dtype),
                     f"{what} {jax.tree_util.keystr(path)}", rtol=tol, atol=tol)


# Pytrees eager and jitted.
check_tree(nj.allreduce(mine, op=nj.Sum), ref_sum, "eager allreduce Sum")
check_tree(jax.jit(lambda t: nj.allreduce(t, op=nj.Sum))(mine), ref_sum, "jit allreduce Sum")
floats = {k: v for k, v in mine.items() if k in ("w", "s")}
avg = jax.jit(lambda t: nj.grouped_allreduce(t, op=nj.Average))(floats)
assert_close(avg["w"], np.mean([t["w"] for t in trees], 0).astype(np.float32), "jit Average w")
mx = jax.jit(lambda t: nj.allreduce(t, op=nj.Max))(mine["w"])
assert_close(mx, np.max([t["w"] for t in trees], 0), "jit Max")
scaled = jax.jit(lambda t: nj.grouped_allreduce([t], op=nj.Sum, prescale_factor=0.5,
                                                postscale_factor=3.0))(mine["w"])[0]
assert_close(scaled, (1.5 * np.sum([t["w"] for t in trees], 0)).astype(np.float32), "scale factors",
             rtol=1e-5, atol=1e-5)
comp = jax.jit(lambda t: nj.grouped_allreduce(t, op=nj.Sum, compression=nj.Compression.fp16))(floats)
if comp["w"].dtype != jnp.float32:
    fail("fp16 compression did not restore float32")
assert_close(comp["w"], np.sum([t["w"] for t in trees], 0).astype(np.float32), "fp16 compression",
             rtol=1e-2, atol=1e-2)
report("pytree allreduce eager and jit")

# One large leaf: over NEZHA_UNFUSED_BYTES, so reduced alone by the ring, read from XLA's input and
# written into XLA's output (no copy between them first); exact, and the input left as it was. Its
# fresh output gets transparent huge pages where the kernel has them (VmFlags "hg").
def huge_pages_asked(address):
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= address < hi
                elif inside and head == "VmFlags:":
                    return " hg" in line
    except OSError:
        pass
    return None


base = np.arange(5 << 18, dtype=np.float32) % 1000
big = jnp.asarray(base + r)
one_leaf = jax.jit(lambda t: nj.allreduce(t, op=nj.Sum))
for k in range(2):
    summed = one_leaf(big)
    assert_close(summed, base * n + n * (n - 1) / 2, f"jit allreduce of one 5 MB leaf, call {k}")
assert_close(big, base + r, "the 5 MB leaf's input after its allreduce")
assert_close(jax.jit(lambda t: nj.allreduce(t, op=nj.Average))(big), base + (n - 1) / 2,
             "jit Average of one 5 MB leaf", rtol=1e-6, atol=1e-4)
# The CPU handler only: on an accelerator the output is device memory (the CUDA handler stages it).
if MODE == "ffi" and jax.default_backend() == "cpu" and os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
    at = summed.unsafe_buffer_pointer()
    interior = (at + (2 << 20) - 1) // (2 << 20) * (2 << 20)  # a whole 2 MiB page of the output
    if huge_pages_asked(interior) is False:
        fail("the jitted allreduce's 5 MB output has no huge-page advice (VmFlags without hg)")
report("one large leaf")

# allgather, broadcast, reducescatter, alltoall, eager and jitted.
x = jnp.arange(6.0).reshape(3, 2) + 10 * r
gathered = np.concatenate([np.arange(6.0).reshape(3, 2) + 10 * k for k in range(n)])
for fn, what in ((lambda v: nj.allgather(v), "eager"), (jax.jit(lambda v: nj.allgather(v)), "jit")):
    assert_close(fn(x), gathered, f"{what} allgather")
    assert_close(fn(jnp.float32(r)), np.arange(n, dtype=np.float32), f"{what} allgather scalar")
tree_b = {"a": jnp.full((4,), float(r)), "i": jnp.full((2, 2), r, jnp.int32)}
for fn, what in ((lambda t: nj.broadcast(t, n - 1), "eager"),
                 (jax.jit(lambda t: nj.broadcast(t, n - 1)), "jit")):
    out = fn(tree_b)
    assert_close(out["a"], np.full((4,), float(n - 1)), f"{what} broadcast")
    assert_close(out["i"], np.full((2, 2), n - 1, np.int32), f"{what} broadcast int")
rows = 2 * n + 1
data = np.stack([np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) * (k + 1) for k in range(n)])
total = data.sum(0)
start = sum(rows // n + (1 if k < rows % n else 0) for k in range(r))
count = rows // n + (1 if r < rows % n else 0)
for fn, what in ((lambda v: nj.reducescatter(v, op=nj.Sum), "eager"),
                 (jax.jit(lambda v: nj.reducescatter(v, op=nj.Sum)), "jit")):
    assert_close(fn(jnp.asarray(data[r])), total[start:start + count], f"{what} reducescatter")
a2a = jnp.arange(2 * n, dtype=jnp.int32) + 100 * r
expect_a2a = np.concatenate([np.arange(2 * n, dtype=np.int32)[2 * r:2 * r + 2] + 100 * k
                             for k in range(n)])
for fn, what in ((nj.alltoall, "eager"), (jax.jit(nj.alltoall), "jit")):
    assert_close(fn(a2a), expect_a2a, f"{what} alltoall")
report("allgather broadcast reducescatter alltoall")

# Gradients vs analytic (Horovod's conventions).
w = jnp.asarray(trees[r]["w"], jnp.float64)
coef = np.arange(15.0).reshape(3, 5)
for op, scale in ((nj.Sum, n), (nj.Average, 1.0)):
    for wrap, what in ((lambda f: f, "eager"), (jax.jit, "jit")):
        g = wrap(jax.grad(lambda v: jnp.sum(coef * nj.allreduce(v, op=op) * (r + 1))))(w)
        # d/dv sum(c * allreduce(v)) (r+1): the cotangent c (r+1) is allreduced with op itself.
        ct_sum = coef * sum(k + 1 for k in range(n))
        assert_close(g, ct_sum if op == nj.Sum else ct_sum / n, f"{what} grad allreduce {op}")
g = jax.jit(jax.grad(lambda v: jnp.sum(nj.allgather(v) ** 2 * (r + 1))))(w)
ag = np.concatenate([np.asarray(trees[k]["w"], np.float64) for k in range(n)])
ct = 2 * ag[None] * np.array([k + 1 for k in range(n)])[:, None, None]
assert_close(g, ct.mean(0)[3 * r:3 * r + 3], "jit grad allgather", rtol=1e-5, atol=1e-5)
g = jax.jit(jax.grad(lambda v: jnp.sum(nj.broadcast(v, 0) * (r + 1))))(w)
expected = np.full((3, 5), np.mean([k + 1 for k in range(n)])) if r == 0 else np.zeros((3, 5))
assert_close(g, expected, "jit grad broadcast")
report("gradients")

# Collectives inside scan and cond: ordered, every iteration reduced.
def scanned(v):
    def body(c, _):
        c = nj.allreduce(c, op=nj.Sum) / n + 1.0
        return c, c.sum()
    return jax.lax.scan(body, v, None, length=3)
c, sums = jax.jit(scanned)(jnp.full((2,), float(r)))
mean0 = np.mean(range(n))
assert_close(c, np.full((2,), mean0 + 3.0), "scan carry")
assert_close(sums, 2 * (mean0 + np.arange(1.0, 4.0)), "scan outputs")
flag = jnp.asarray(True)
out = jax.jit(lambda p, v: jax.lax.cond(p, lambda u: nj.allreduce(u, op=nj.Sum), lambda u: u * 0, v))(
    flag, jnp.ones(3) * (r + 1))
assert_close(out, np.full(3, float(sum(range(1, n + 1)))), "cond")
report("scan and cond")

# Many collectives in one program, in order, repeated calls of the same program.
def many(v):
    outs = []
    for i in range(5):
        v = nj.allreduce(v + i, op=nj.Sum)
        outs.append(nj.allgather(v[:1]))
    return v, outs
step = jax.jit(many)
v0 = jnp.full((3,), float(r))
for rep in range(3):
    v, outs = step(v0)
ref_v = float(sum(range(n)))  # i = 0: the sum of the ranks' values
for i in range(5):
    if i:
        ref_v = n * (ref_v + i)
    assert_close(outs[i], np.full(n, ref_v), f"many: allgather {i}")
assert_close(v, np.full(3, ref_v), "many: final value")
report("ordering")


# Independent collectives traced in a different order on each rank: the handler never blocks XLA
# on one (longer than NEZHA_JAX_WAIT_US) before submitting the other, and the engine matches them
# by name.
def crossed(a, b):
    first, second = ((a, "cross.a"), (b, "cross.b")) if r % 2 == 0 else ((b, "cross.b"), (a, "cross.a"))
    out = {nm: nj.allreduce(v, op=nj.Sum, name=nm) for v, nm in (first, second)}
    return out["cross.a"], out["cross.b"]
# The io_callback fallback and the CUDA handler block in stream order: they need the same order on
# every rank (as NCCL does); only the CPU handler returns at once.
if MODE == "ffi" and jax.default_backend() == "cpu":
    ca, cb = jax.jit(crossed)(jnp.full(3, 1.0 + r), jnp.full(2, 10.0 * (r + 1)))
    assert_close(ca, np.full(3, float(sum(1.0 + k for k in range(n)))), "crossed a")
    assert_close(cb, np.full(2, float(sum(10.0 * (k + 1) for k in range(n)))), "crossed b")
    report("crossed order")

    # A small call is first waited for on XLA's thread (NEZHA_JAX_WAIT_US, 1 ms): with every rank
    # there most complete within it; one whose peer comes late is left to the waiter thread.
    from nezha import _core
    small = jax.jit(lambda t: nj.allreduce(t, op=nj.Sum, name="small.wait"))
    small(jnp.zeros(2))  # compiled before anything is timed
    before = _core.jax_ffi_stats()
    for i in range(30):
        nj.barrier()
        assert_close(small(jnp.full(2, float(r + i))), np.full(2, float(sum(k + i for k in range(n)))),
                     "small allreduce %d" % i)
    after = _core.jax_ffi_stats()
    if after["completed_on_calling_thread"] <= before["completed_on_calling_thread"]:
        fail("30 small jitted allreduces after barriers: none completed on XLA's thread (%s -> %s)"
             % (before, after))
    # ... and XLA's thread runs the engine loop meanwhile (engine.h, point 5): a worker's engine
    # thread then sleeps through back-to-back small calls (without the lead it wakes twice per call:
    # for the request and for the answer).
    # A call whose peer comes later than NEZHA_JAX_WAIT_US (a loaded machine) is left to the waiter
    # thread and may wake the engine thread twice; the bound allows for those, counted.
    nj.barrier()
    before = _core.jax_ffi_stats()
    switches = context_switches("nz-engine")
    for i in range(30):
        jax.block_until_ready(small(jnp.full(2, float(i))))
    switches = context_switches("nz-engine") - switches
    left = _core.jax_ffi_stats()["completed_in_background"] - before["completed_in_background"]
    if r != 0 and switches >= 15 + 2 * left:
        fail("30 small jitted allreduces: the engine thread switched %d times, %d calls left to the "
             "waiter thread (XLA's thread did not lead the loop)" % (switches, left))
    nj.barrier()
    if r == n - 1:
        time.sleep(0.3)  # far past the wait: the others' calls must go to the waiter thread
    before = _core.jax_ffi_stats()
    assert_close(small(jnp.full(2, 1.0)), np.full(2, float(n)), "small allreduce, one rank late")
    after = _core.jax_ffi_stats()
    if r != n - 1 and after["completed_in_background"] != before["completed_in_background"] + 1:
        fail("a small call whose peer came 0.3 s late was not completed by the waiter thread (%s -> %s)"
             % (before, after))
    report("small calls on the calling thread")

# A mismatch across ranks raises on every rank (never a hang).
bad = jnp.ones((2 + r,), jnp.float32)
message = expect_error(lambda: jax.block_until_ready(jax.jit(lambda t: nj.allreduce(t, op=nj.Sum,
                                                                                     name="mismatch"))(bad)),
                       "mismatched allreduce", "mismatch")
print("mismatch error on rank %d: %s" % (r, message.splitlines()[0][:200]), flush=True)
report("mismatch raises")

# The job still works afterwards.
assert_close(jax.jit(lambda t: nj.allreduce(t, op=nj.Sum))(jnp.ones(4)), np.full(4, float(n)),
             "allreduce after a failure")
report("after mismatch")
nj.shutdown()
