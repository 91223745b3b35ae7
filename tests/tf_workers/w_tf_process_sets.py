"""nezha.tensorflow and nezha.keras (TensorFlow backend) with process sets, on 3 ranks: the pair
{0, 2} and the single rank {1}. Collectives eagerly and in tf.function, their gradients, the
DistributedGradientTape and Keras' DistributedOptimizer within a set and on a rank outside it,
against numpy references."""
from common import assert_close, fail, report

import numpy as np
import tensorflow as tf

import nezha.tensorflow as hvd

hvd.init()
me = hvd.rank()
assert hvd.size() == 3, "run on 3 ranks"
pair = hvd.add_process_set([0, 2])
solo = hvd.add_process_set([1])
this_set = pair if me in (0, 2) else solo
members = this_set.ranks


def values(rank, rows=4):
    return ((np.arange(rows * 2).reshape(rows, 2) + 3 * rank + 1) % 7).astype(np.float32)


def collectives():
    x = tf.constant(values(me))
    return {
        "sum": hvd.allreduce(x, op=hvd.Sum, process_set=this_set),
        "avg": hvd.allreduce(x, process_set=this_set),
        "grouped": hvd.grouped_allreduce([x, x[0]], op=hvd.Sum, process_set=this_set),
        "allgather": hvd.allgather(tf.constant(values(me, rows=me + 1)), process_set=this_set),
        "broadcast": hvd.broadcast(x, root_rank=members[-1], process_set=this_set),
        "alltoall": hvd.alltoall(tf.constant(values(me, rows=2 * len(members))), process_set=this_set),
        "reducescatter": hvd.reducescatter(x, op=hvd.Sum, process_set=this_set),
    }


def check(results, mode):
    total = sum(values(r) for r in members)
    assert_close(results["sum"], total, mode + " sum")
    assert_close(results["avg"], total / len(members), mode + " average")
    assert_close(results["grouped"][1], total[0], mode + " grouped")
    assert_close(results["allgather"], np.concatenate([values(r, rows=r + 1) for r in members]), mode + " allgather")
    assert_close(results["broadcast"], values(members[-1]), mode + " broadcast")
    k = members.index(me)
    assert_close(results["alltoall"], np.concatenate([values(r, rows=2 * len(members))[2 * k:2 * k + 2]
                                                      for r in members]), mode + " alltoall")
    rows = 4 // len(members)
    assert_close(results["reducescatter"], total[k * rows:(k + 1) * rows], mode + " reducescatter")


check(collectives(), "eager")
report("collectives eager")
check(tf.function(collectives)(), "tf.function")
report("collectives in tf.function")

# Gradients within the set: allreduce (Average) passes the averaged gradient back; allgather
# hands each rank its own rows of the averaged gradient.
x = tf.Variable(values(me))
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum, process_set=this_set) * 2.0)
assert_close(tape.gradient(y, x), np.full((4, 2), 2.0 * len(members)), "allreduce gradient")
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvd.allgather(x, process_set=this_set) * 3.0)
assert_close(tape.gradient(y, x), np.full((4, 2), 3.0), "allgather gradient")
report("gradients")

# DistributedGradientTape: the gradient averaged over the set's ranks.
w = tf.Variable([[1.0], [2.0]])
data = {r: values(r) for r in range(3)}


def tape_gradient(process_set, reducing_ranks, label):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.matmul(tf.constant(data[me]), w))
    tape = hvd.DistributedGradientTape(tape, process_set=process_set)
    want = np.mean([data[r].mean(axis=0).reshape(2, 1) for r in reducing_ranks], axis=0)
    assert_close(tape.gradient(loss, w), want, label, rtol=1e-5)


tape_gradient(this_set, members, "DistributedGradientTape in a set")
report("gradient tape")

# Keras' DistributedOptimizer with the set: one fit step equals one process on the set's batches.
import keras  # noqa: E402


def model():
    keras.utils.set_random_seed(7)
    m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    return m


ys = {r: data[r].sum(axis=1, keepdims=True) for r in range(3)}


def fit_against_reference(process_set, reducing_ranks, label):
    """Two epochs of this rank's batch with the set's DistributedOptimizer equal one process
    fitting the reducing ranks' batches together."""
    dist = model()
    dist.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=process_set),
                 loss="mse")
    dist.fit(data[me], ys[me], batch_size=4, epochs=2, shuffle=False, verbose=0)
    ref = model()
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    xs = np.concatenate([data[r] for r in reducing_ranks])
    yr = np.concatenate([ys[r] for r in reducing_ranks])
    ref.fit(xs, yr, batch_size=4 * len(reducing_ranks), epochs=2, shuffle=False, verbose=0)
    for a, b in zip(dist.get_weights(), ref.get_weights()):
        assert_close(a, b, label, rtol=1e-5, atol=1e-6)


fit_against_reference(this_set, members, "keras DistributedOptimizer in a set")
report("keras optimizer")

# Every rank builds the pair's tape and optimizer: rank 1, outside the pair, keeps its own
# gradients (Horovod's _allreduce_cond) while ranks 0 and 2 reduce over the pair.
reducing = pair.ranks if me in pair.ranks else [me]
tape_gradient(pair, reducing, "DistributedGradientTape of the pair")
fit_against_reference(pair, reducing, "keras DistributedOptimizer of the pair")
report("gradient reducers outside their set")

try:
    hvd.allreduce(tf.ones(2), process_set=solo if this_set is pair else pair)
    fail("a collective of a set without this rank did not raise")
except ValueError as error:
    if "is not in" not in str(error):
        fail("wrong error: %s" % error)
report("errors")
