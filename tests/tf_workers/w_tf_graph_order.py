"""A graph with many more collectives than TensorFlow's inter-op threads, whose inputs become
ready in a different order on every rank, run by a tf.compat.v1 session (which adds no control
dependencies between them): every collective completes, with numpy's results. With kernels that
block their thread until the collective is done, each rank's threads sit on collectives the other
ranks reach last, and the job hangs (see tests/test_tensorflow.py)."""
from common import assert_close, fail, report

import numpy as np
import tensorflow as tf

import nezha.tensorflow as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()
THREADS = 2
COLLECTIVES = 30  # > THREADS x ranks: no interleaving of blocked threads could have run them all
KINDS = ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "grouped")


def value(rank, k, rows):
    return (np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) * (k + 1) + 7 * rank + k) % 97


def a2a_splits(rank):
    return [1 + (rank + q) % 2 for q in range(n)]


def build(k, x_of):
    """Collective k of the graph; `x_of(rows, dtype)` is this rank's input for it."""
    kind = KINDS[k % len(KINDS)]
    if kind == "allreduce":
        return hvd.allreduce(x_of(3, tf.float32), op=hvd.Sum)
    if kind == "allgather":
        return hvd.allgather(x_of(me + 1, tf.int32))
    if kind == "broadcast":
        return hvd.broadcast(x_of(2, tf.float64), root_rank=k % n)
    if kind == "reducescatter":
        return hvd.reducescatter(x_of(2 * n, tf.float32), op=hvd.Sum)
    if kind == "alltoall":
        return hvd.alltoall(x_of(sum(a2a_splits(me)), tf.int64), splits=a2a_splits(me))[0]
    return hvd.grouped_allreduce([x_of(2, tf.float32), x_of(1, tf.int64)], op=hvd.Sum)


def expected(k):
    kind = KINDS[k % len(KINDS)]
    if kind == "allreduce":
        return sum(value(r, k, 3) for r in range(n)).astype(np.float32)
    if kind == "allgather":
        return np.concatenate([value(r, k, r + 1) for r in range(n)]).astype(np.int32)
    if kind == "broadcast":
        return value(k % n, k, 2).astype(np.float64)
    if kind == "reducescatter":
        return sum(value(r, k, 2 * n) for r in range(n))[2 * me:2 * me + 2].astype(np.float32)
    if kind == "alltoall":
        rows = []
        for r in range(n):
            sent = value(r, k, sum(a2a_splits(r)))
            start = sum(a2a_splits(r)[:me])
            rows.append(sent[start:start + a2a_splits(r)[me]])
        return np.concatenate(rows)
    return [sum(value(r, k, 2) for r in range(n)).astype(np.float32),
            sum(value(r, k, 1) for r in range(n))]


def session(graph):
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=THREADS,
                                      intra_op_parallelism_threads=1)
    return tf.compat.v1.Session(graph=graph, config=config)


# This rank's order: rank 0 ascending, rank 1 descending, others a permutation of their own.
order = list(range(COLLECTIVES))
if me == 1:
    order.reverse()
elif me > 1:
    order = list(np.random.RandomState(me).permutation(COLLECTIVES))

def gated_collectives():
    """Every collective of the graph; collective k's input passes a gate that opens after the
    previous collective's in this rank's order, so TensorFlow reaches them in that order."""
    gates, previous = {}, []
    for k in order:
        with tf.control_dependencies(previous):
            gates[k] = tf.identity(tf.constant(k, tf.int64))
        previous = [gates[k]]

    def input_of(k):
        def x_of(rows, dtype):
            with tf.control_dependencies([gates[k]]):
                return tf.cast(tf.identity(tf.constant(value(me, k, rows))), dtype)
        return x_of

    return [build(k, input_of(k)) for k in range(COLLECTIVES)]


def check(got, what):
    for k in range(COLLECTIVES):
        want = expected(k)
        parts = zip(got[k] if isinstance(want, list) else [got[k]],
                    want if isinstance(want, list) else [want])
        for i, (g, w) in enumerate(parts):
            assert_close(g, w, "%s, collective %d (%s) part %d" % (what, k, KINDS[k % len(KINDS)], i))


graph = tf.Graph()
with graph.as_default():
    results = gated_collectives()
with session(graph) as sess:
    for run in range(2):  # a second run of the same graph reuses its names, as training steps do
        check(sess.run(results), "session run %d" % run)
report("collectives in any order complete")

# The same as a function without automatic control dependencies, on the eager context's inter-op
# pool (TF_NUM_INTEROP_THREADS=2, tf_workers/common.py).
wrapped = tf.compat.v1.wrap_function(gated_collectives, [])
check([[t.numpy() for t in r] if isinstance(r, list) else r.numpy() for r in wrapped()],
      "wrap_function")
report("function without control dependencies completes")


# tf.function orders its collectives (automatic control dependencies): still one after another.
@tf.function
def many_allreduces(x):
    return [hvd.allreduce(x * (k + 1), op=hvd.Sum) for k in range(24)]


for k, got in enumerate(many_allreduces(tf.constant(value(me, 0, 2).astype(np.float32)))):
    assert_close(got, sum(value(r, 0, 2) for r in range(n)).astype(np.float32) * (k + 1),
                 "tf.function allreduce %d" % k)
report("tf.function with 24 allreduces")

# Collectives whose inputs become ready together, so TensorFlow picks the order itself.
graph = tf.Graph()
with graph.as_default():
    xs = [tf.constant(value(me, k, 4).astype(np.float32)) for k in range(COLLECTIVES)]
    sums = [hvd.allreduce(x, op=hvd.Sum) for x in xs]
with session(graph) as sess:
    for k, got in enumerate(sess.run(sums)):
        assert_close(got, sum(value(r, k, 4) for r in range(n)).astype(np.float32),
                     "independent allreduce %d" % k)
report("independent collectives complete")

# A collective whose shapes or dtypes differ across ranks fails on every rank with a TensorFlow
# error that names the tensor and what differs, and the job goes on.
graph = tf.Graph()
with graph.as_default():
    bad_shape = hvd.allreduce(tf.ones([3 + me]), name="graph.mismatch")
    bad_dtype = hvd.allreduce(tf.ones([3], tf.float32 if me == 0 else tf.int32), name="graph.types")
    good = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="graph.after")
with session(graph) as sess:
    for bad, words in ((bad_shape, ("graph.mismatch", "shape")), (bad_dtype, ("graph.types", "type"))):
        try:
            sess.run(bad)
            fail("a %s mismatch in a graph did not raise" % words[1])
        except tf.errors.FailedPreconditionError as exc:
            if any(w not in str(exc).lower() for w in words):
                fail("the mismatch error does not name %s: %s" % (words, exc))
    assert_close(sess.run(good), np.full([2], n, np.float32), "a collective after the errors")
report("mismatch in a graph raises")

# Horovod's broadcast gradient in a session: averaged on the root, zero elsewhere. The other ranks'
# allreduce of the gradient must run although their result is multiplied away.
graph = tf.Graph()
with graph.as_default():
    x = tf.constant(value(me, 0, 2).astype(np.float32))
    grads = [tf.gradients(hvd.broadcast(x, root_rank=root), x)[0] for root in range(n)]
with session(graph) as sess:
    for root, got in enumerate(sess.run(grads)):
        assert_close(got, np.full([2, 2], 1.0 if me == root else 0.0, np.float32),
                     "broadcast gradient, root %d" % root)
report("broadcast gradient in a session")
