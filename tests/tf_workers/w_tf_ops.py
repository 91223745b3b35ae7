"""nezha.tensorflow checks on every rank (see tests/test_tensorflow.py)."""
from common import assert_close, assert_identical_on_all_ranks, fail, report

import numpy as np
import tensorflow as tf

import nezha
import nezha.tensorflow as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
DTYPES = [tf.uint8, tf.int8, tf.int16, tf.uint16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
          tf.float32, tf.float64]


def values(rank, rows=3, dtype=np.float64):
    return ((np.arange(rows * 2).reshape(rows, 2) + 3 * rank + 1) % 7).astype(dtype)


def np_of(dtype):
    return dtype.as_numpy_dtype


def collectives(dtype):
    """Runs every collective on this rank's input; returns the results as a dict."""
    x = tf.constant(values(me, dtype=np_of(dtype)))
    ragged = tf.constant(values(me, rows=me + 1, dtype=np_of(dtype)))
    split_list = [1 + r % 2 + me for r in range(n)]
    splits = tf.constant(split_list, tf.int32)
    rows = sum(split_list)
    a2a_in = tf.constant(values(me, rows=rows, dtype=np_of(dtype)))
    out = {
        "sum": hvd.allreduce(x, op=hvd.Sum),
        "max": hvd.allreduce(x, op=hvd.Max),
        "grouped": hvd.grouped_allreduce([x, x[0]], op=hvd.Sum),
        "allgather": hvd.allgather(ragged),
        "grouped_allgather": hvd.grouped_allgather([ragged, x]),
        "broadcast": hvd.broadcast(x, root_rank=n - 1),
        "alltoall": hvd.alltoall(a2a_in, splits=splits),
        "reducescatter": hvd.reducescatter(tf.concat([x, x], 0), op=hvd.Sum),
    }
    if dtype.is_floating:
        out["average"] = hvd.allreduce(x)
    return out


def expected(dtype):
    t = np_of(dtype)
    xs = [values(r, dtype=t) for r in range(n)]
    acc = np.float64 if dtype.is_floating else np.int64
    summed = np.sum([x.astype(acc) for x in xs], axis=0).astype(t)
    splits = [[1 + q % 2 + r for q in range(n)] for r in range(n)]
    a2a_ins = [values(r, rows=sum(splits[r]), dtype=t) for r in range(n)]
    received = [a2a_ins[r][sum(splits[r][:me]):sum(splits[r][:me + 1])] for r in range(n)]
    scattered = np.concatenate([summed, summed], 0)
    per = len(scattered) // n
    exp = {
        "sum": summed,
        "max": np.max(xs, axis=0),
        "grouped": [summed, summed[0]],
        "allgather": np.concatenate([values(r, rows=r + 1, dtype=t) for r in range(n)]),
        "grouped_allgather": [np.concatenate([values(r, rows=r + 1, dtype=t) for r in range(n)]),
                              np.concatenate(xs)],
        "broadcast": xs[n - 1],
        "alltoall": (np.concatenate(received), np.array([splits[r][me] for r in range(n)])),
        "reducescatter": scattered[me * per:(me + 1) * per],
    }
    if dtype.is_floating:
        exp["average"] = (np.sum([x.astype(np.float64) for x in xs], axis=0) / n).astype(t)
    return exp


def compare(results, dtype, how):
    tol = 1e-2 if dtype in (tf.float16, tf.bfloat16) else 1e-6
    for key, exp in expected(dtype).items():
        got = results[key]
        got_list = got if isinstance(got, (list, tuple)) else [got]
        exp_list = exp if isinstance(exp, (list, tuple)) else [exp]
        for i, (g, e) in enumerate(zip(got_list, exp_list)):
            if g.dtype != (tf.int32 if key == "alltoall" and i == 1 else dtype):
                fail("%s %s %s: dtype %s" % (how, key, dtype.name, g.dtype.name))
            assert_close(np.asarray(g.numpy()).astype(np.float64), np.asarray(e, np.float64),
                         "%s %s %s[%d]" % (how, key, dtype.name, i), rtol=tol, atol=tol)


for dtype in DTYPES:
    compare(collectives(dtype), dtype, "eager")
flags = hvd.broadcast(tf.constant([me == 0, True, me == 1]), root_rank=0)
assert_close(flags.numpy(), np.array([True, True, False]), "bool broadcast")
report("collectives eager")

for dtype in DTYPES:
    compare(tf.function(lambda d=dtype: collectives(d))(), dtype, "tf.function")
report("collectives in tf.function")


# --- Horovod's gradients ---------------------------------------------------------------------
def weights(rank, shape):
    return tf.constant(np.arange(np.prod(shape)).reshape(shape) * 0.5 + rank + 1, tf.float64)


def grads_of_ops():
    x = tf.constant(values(me), dtype=tf.float64)
    ragged = tf.constant(values(me, rows=me + 1))
    out = {}
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, ragged])
        losses = {
            "allreduce sum": tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum) * weights(me, (3, 2))),
            "allreduce avg": tf.reduce_sum(hvd.allreduce(x, prescale_factor=2.0)
                                           * weights(me, (3, 2))),
            "allgather": tf.reduce_sum(hvd.allgather(ragged)
                                       * weights(me, (n * (n + 1) // 2, 2))),
            "broadcast": tf.reduce_sum(hvd.broadcast(x, 0) * weights(me, (3, 2))),
            "reducescatter": tf.reduce_sum(hvd.reducescatter(tf.concat([x, x], 0), op=hvd.Sum)
                                           * weights(me, (6 // n, 2))),
            "grouped": tf.add_n([tf.reduce_sum(g * weights(me, (3, 2))) for g in
                                 hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)]),
        }
    for key, loss in losses.items():
        out[key] = tape.gradient(loss, ragged if key == "allgather" else x)
    return out


def expected_grads():
    ws = [weights(r, (3, 2)).numpy() for r in range(n)]
    gathered = [weights(r, (n * (n + 1) // 2, 2)).numpy() for r in range(n)]
    start = me * (me + 1) // 2
    rs = [weights(r, (6 // n, 2)).numpy() for r in range(n)]
    full = np.concatenate(rs) * n
    return {
        "allreduce sum": np.sum(ws, axis=0),
        "allreduce avg": np.mean(ws, axis=0) * 2.0,
        "allgather": np.mean(gathered, axis=0)[start:start + me + 1],
        "broadcast": np.mean(ws, axis=0) if me == 0 else np.zeros((3, 2)),
        "reducescatter": full[:3] + full[3:],
        "grouped": np.sum(ws, axis=0) * 3,
    }


for how, fn in (("eager", grads_of_ops), ("tf.function", tf.function(grads_of_ops))):
    got = fn()
    for key, exp in expected_grads().items():
        assert_close(got[key].numpy(), exp, "%s gradient of %s" % (how, key))
# Forward mode too: an eager call records its gradient for a ForwardAccumulator as for a tape (an
# eager call with nothing recording skips the wrapper), so the JVP of a summed allreduce is the sum
# of every rank's tangent: 3 x n here.
x = tf.constant([1.0, 2.0])
with tf.autodiff.ForwardAccumulator(x, tf.constant([1.0, 1.0])) as acc:
    y = hvd.allreduce(x * 3.0, op=hvd.Sum)
assert_close(acc.jvp(y).numpy(), np.full(2, 3.0 * n), "eager allreduce's JVP")
report("gradients")


# --- DistributedGradientTape -------------------------------------------------------------------
w = tf.Variable(np.linspace(-1, 1, 6).reshape(3, 2))
b = tf.Variable(np.array([0.5, -0.5]))


def data(rank):
    rng = np.random.default_rng(rank)
    return rng.normal(size=(4, 3)), rng.normal(size=(4, 2))


def local_loss(rank):
    xs, ys = data(rank)
    return tf.reduce_mean(tf.square(tf.matmul(xs, w) + b - ys))


def tape_grads(**options):
    with tf.GradientTape() as tape:
        loss = local_loss(me)
    tape = hvd.DistributedGradientTape(tape, **options)
    return tape.gradient(loss, [w, b])


per_rank = []
for r in range(n):
    with tf.GradientTape() as t:
        loss = local_loss(r)
    per_rank.append([g.numpy() for g in t.gradient(loss, [w, b])])
mean_grads = [np.mean([p[i] for p in per_rank], axis=0) for i in range(2)]
sum_grads = [np.sum([p[i] for p in per_rank], axis=0) for i in range(2)]
for how, fn in (("eager", tape_grads), ("tf.function", tf.function(tape_grads))):
    for options, exp in (({}, mean_grads), ({"op": hvd.Sum}, sum_grads),
                         ({"gradient_predivide_factor": 2.0}, mean_grads)):
        got = fn(**options)
        for g, e, name in zip(got, exp, ("w", "b")):
            assert_close(g.numpy(), e, "%s tape %s %s" % (how, options, name), rtol=1e-12)
v1 = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
pairs = v1.compute_gradients(lambda: local_loss(me), var_list=[w, b])
for (g, _), e, name in zip(pairs, mean_grads, ("w", "b")):
    assert_close(g.numpy(), e, "tf.compat.v1 DistributedOptimizer %s" % name, rtol=1e-12)
report("gradient tape")

# --- compression -------------------------------------------------------------------------------
x = tf.constant(values(me, dtype=np.float32) / 3)
got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
exp = np.sum([(values(r, dtype=np.float32) / 3).astype(np.float16) for r in range(n)],
             axis=0, dtype=np.float16).astype(np.float32)
if got.dtype != tf.float32:
    fail("fp16 compression returned %s" % got.dtype.name)
assert_close(got.numpy(), exp, "fp16 compressed allreduce", rtol=0, atol=0)
with tf.GradientTape() as tape:
    loss = local_loss(me)
g16 = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16).gradient(loss, [w])
assert_close(g16[0].numpy(), mean_grads[0], "fp16 tape gradient", rtol=1e-2, atol=1e-3)
report("fp16 compression")

# --- SyncBatchNormalization --------------------------------------------------------------------
import keras  # noqa: E402
everything = np.concatenate([values(r, rows=4, dtype=np.float32) * (r + 1) for r in range(n)])
sync_bn = hvd.SyncBatchNormalization(momentum=0.5)
ref_bn = keras.layers.BatchNormalization(momentum=0.5)
mine = sync_bn(everything[4 * me:4 * me + 4], training=True)
reference = ref_bn(everything, training=True)[4 * me:4 * me + 4]
assert_close(mine.numpy(), reference.numpy(), "sync batch norm output", rtol=1e-4, atol=1e-4)
assert_close(sync_bn.moving_variance.numpy(), ref_bn.moving_variance.numpy(),
             "sync batch norm moving variance", rtol=1e-4, atol=1e-4)
report("sync batch norm")

# --- broadcast_variables, broadcast_, objects ----------------------------------------------------
vs = [tf.Variable(values(me)), tf.Variable(np.int32(me))]
hvd.broadcast_variables(vs, root_rank=1)
assert_close(vs[0].numpy(), values(1), "broadcast_variables")
assert_close(vs[1].numpy(), np.int32(1), "broadcast_variables scalar")
v = tf.Variable(values(me))
tf.function(lambda: hvd.broadcast_([v], root_rank=0))()
assert_close(v.numpy(), values(0), "broadcast_ in tf.function")
if hvd.broadcast_object({"r": me}, root_rank=1) != {"r": 1}:
    fail("broadcast_object")
if hvd.allgather_object(me * 10) != [r * 10 for r in range(n)]:
    fail("allgather_object")
assert_identical_on_all_ranks([vs[0].numpy()], "broadcast_variables")
report("broadcast_variables and objects")

# --- API surface -------------------------------------------------------------------------------
for name in ("init", "shutdown", "size", "rank", "local_rank", "local_size", "cross_rank",
             "cross_size", "is_homogeneous", "Sum", "Average", "Min", "Max", "Product", "Adasum",
             "allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast",
             "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "join",
             "barrier", "broadcast_variables", "broadcast_object", "allgather_object",
             "Compression", "DistributedGradientTape", "DistributedOptimizer",
             "SyncBatchNormalization", "mpi_built", "gloo_built", "nccl_built", "cuda_built"):
    if not hasattr(hvd, name):
        fail("nezha.tensorflow lacks %s" % name)
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
if not isinstance(opt, keras.optimizers.SGD):
    fail("DistributedOptimizer(SGD) is not an SGD")
try:
    hvd.allreduce(tf.constant(["a"]))
    fail("a string tensor was accepted")
except TypeError as exc:
    if "allreduce" not in str(exc):
        fail("unclear dtype error: %s" % exc)
hvd.barrier()
last = hvd.join()
if last.dtype != tf.int32 or not 0 <= int(last) < n:
    fail("join returned %r" % last)
assert_identical_on_all_ranks([last.numpy()], "join")
report("api surface")

# --- a shape mismatch raises on every rank, eagerly and in a graph -----------------------------
for how in ("eager", "tf.function"):
    def mismatched():
        return hvd.allreduce(tf.ones([3 + me]), name="mismatch." + how)
    try:
        (tf.function(mismatched) if how == "tf.function" else mismatched)()
        fail("%s shape mismatch did not raise" % how)
    except tf.errors.FailedPreconditionError as exc:  # Horovod's type, eagerly and in graphs
        if how == "eager" and not isinstance(exc, nezha.NezhaError):
            fail("an eager mismatch error is not a NezhaError: %r" % exc)
        if "mismatch" not in str(exc) or "shape" not in str(exc).lower():
            fail("%s mismatch error does not name the tensor and shapes: %s" % (how, exc))
report("shape mismatch raises")
