"""Horovod's TensorFlow API pieces beyond the collectives, on every rank (tests/test_tensorflow.py):
the *_op ops read when a graph runs, broadcast_global_variables, IndexedSlices in allreduce and
grouped_allreduce, PartialDistributedGradientTape, the TensorFlow error types of refused
arguments and elastic.TensorFlowState, each against values computed here."""
from common import assert_close, fail, report

import keras
import numpy as np
import tensorflow as tf

import nezha
import nezha.tensorflow as hvd

hvd.init()
n, me = hvd.size(), hvd.rank()


def expect_raises(kinds, fn, what):
    try:
        fn()
    except kinds:
        return
    except Exception as exc:  # the wrong kind: say which
        fail("%s raised %r, expected %s" % (what, exc, kinds))
    fail("%s did not raise %s" % (what, kinds))


# --- the job's layout as ops -----------------------------------------------------------------
graph = tf.Graph()
with graph.as_default():
    layout = [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op()]
    shapes = [t.shape.rank for t in layout]
with tf.compat.v1.Session(graph=graph) as sess:
    got = sess.run(layout)
want = [me, n, nezha.local_rank(), nezha.local_size()]
if list(got) != want or shapes != [0] * 4:
    fail("rank/size/local_rank/local_size ops gave %s (ranks %s), expected %s" % (got, shapes, want))
if [int(t.numpy()) for t in (hvd.rank_op(), hvd.size_op())] != [me, n]:
    fail("eager rank_op/size_op differ from rank()/size()")
report("layout ops")

# --- broadcast_global_variables (TF1 graphs) ---------------------------------------------------
graph = tf.Graph()
with graph.as_default():
    v = tf.compat.v1.Variable(np.full([3], me + 1.0, np.float32))
    w = tf.compat.v1.Variable(np.arange(4, dtype=np.int64) * (me + 2))
    bcast = hvd.broadcast_global_variables(root_rank=n - 1)
with tf.compat.v1.Session(graph=graph) as sess:
    sess.run(tf.compat.v1.variables_initializer([v, w]))
    sess.run(bcast)
    got_v, got_w = sess.run([v, w])
assert_close(got_v, np.full([3], float(n), np.float32), "broadcast global float variable")
assert_close(got_w, np.arange(4, dtype=np.int64) * (n + 1), "broadcast global int variable")
expect_raises(RuntimeError, lambda: hvd.broadcast_global_variables(0),
              "eager broadcast_global_variables")
report("broadcast_global_variables")

# --- IndexedSlices: allgathered; Average divides (true division), factors refused ----------------
values = tf.constant(np.full([2, 3], me + 1, np.uint8))
slices = tf.IndexedSlices(values, tf.constant([me, me + 1], tf.int64), tf.constant([n + 1, 3]))
avg = hvd.allreduce(slices, op=hvd.Average)
gathered_values = np.concatenate([np.full([2, 3], r + 1, np.float64) for r in range(n)]) / n
assert_close(avg.values.numpy(), gathered_values, "IndexedSlices average values")
assert_close(avg.indices.numpy(), np.array([i for r in range(n) for i in (r, r + 1)]),
             "IndexedSlices average indices")
dense = tf.constant(np.full([2], me + 1.0, np.float32))
mixed = hvd.grouped_allreduce([dense, slices, dense * 2], op=hvd.Sum)
assert_close(mixed[0].numpy(), np.full([2], n * (n + 1) / 2.0), "grouped dense next to slices")
assert_close(mixed[2].numpy(), np.full([2], n * (n + 1.0)), "grouped dense after slices")
assert_close(mixed[1].values.numpy(),
             np.concatenate([np.full([2, 3], r + 1, np.uint8) for r in range(n)]),
             "grouped IndexedSlices values")
for call in (lambda: hvd.allreduce(slices, op=hvd.Sum, prescale_factor=0.5),
             lambda: hvd.grouped_allreduce([slices], op=hvd.Sum, postscale_factor=2.0)):
    expect_raises(NotImplementedError, call, "IndexedSlices with a scale factor")
report("IndexedSlices")

# --- PartialDistributedGradientTape: local layers keep this rank's gradients ------------------
keras.utils.set_random_seed(7)  # the same initial weights on every rank
model = keras.Sequential([keras.Input([3]), keras.layers.Dense(2), keras.layers.Dense(1)])
x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3) + me)


def loss_fn():
    return tf.reduce_sum(model(x) ** 2)


with tf.GradientTape() as plain:
    loss = loss_fn()
own = plain.gradient(loss, model.trainable_weights)
local = {id(var) for var in model.layers[0].trainable_weights}
for scale in (True, False):  # Horovod divides local gradients by the size unless told not to
    with tf.GradientTape(persistent=True) as tape:
        loss = loss_fn()
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[0],
                                              scale_local_gradients=scale)
    got = tape.gradient(loss, model.trainable_weights)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, model.trainable_weights)
    if [id(v) for v, _ in local_pairs] != [id(v) for v in model.layers[0].trainable_weights]:
        fail("get_local_and_global_gradients split the sources wrongly")
    split = dict((id(v), g) for v, g in local_pairs + global_pairs)
    for var, g, mine in zip(model.trainable_weights, got, own):
        want = (mine.numpy() / (n if scale else 1) if id(var) in local
                else nezha.allreduce(mine.numpy(), name="ref.%s.%s" % (scale, var.path)))
        for what, value in (("gradient", g), ("split", split[id(var)])):
            assert_close(value.numpy(), want, "partial tape %s of %s (scale %s)"
                         % (what, var.path, scale), rtol=1e-5, atol=1e-5)
expect_raises(ValueError, lambda: hvd.PartialDistributedGradientTape(tf.GradientTape(),
                                                                      local_layers=[object()]),
              "a local layer that is no Keras layer")
report("PartialDistributedGradientTape")

# --- refused arguments are TensorFlow's InvalidArgumentError eagerly too (and still ValueError) ---
for call in (lambda: hvd.alltoall(tf.ones([n + 1])),
             lambda: hvd.alltoall(tf.ones([n - 1]), splits=tf.ones([n], tf.int32))):
    expect_raises(tf.errors.InvalidArgumentError, call, "eager alltoall with bad splits")
    expect_raises(ValueError, call, "eager alltoall with bad splits")
report("argument errors")

# --- elastic.TensorFlowState: rank 0's variables and values on sync(), back to a commit ---------
variables = [tf.Variable(np.full([2, 2], me + 1.0)), tf.Variable(np.full([2], me + 1.0))]
state = hvd.elastic.TensorFlowState(variables, batch=20 + me, epoch=10 + me)
state.sync()
for var in variables:
    assert_close(var.numpy(), np.ones(var.shape), "variable after sync")
if (state.batch, state.epoch) != (20, 10):
    fail("values after sync: %s" % ((state.batch, state.epoch),))
for commit in (False, True):  # restore() returns to what sync() gave, then to the commit
    for var in variables:
        var.assign(np.full(var.shape, 7.0))
    state.batch = 21
    if commit:
        state.commit()
        for var in variables:
            var.assign(np.full(var.shape, 8.0))
        state.batch = 22
    state.restore()
    for var in variables:
        assert_close(var.numpy(), np.full(var.shape, 7.0 if commit else 1.0),
                     "variable after restore (commit %s)" % commit)
    if state.batch != (21 if commit else 20):
        fail("batch after restore (commit %s): %s" % (commit, state.batch))
report("elastic state")
