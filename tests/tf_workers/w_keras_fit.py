"""nezha.keras checks on every rank, on the Keras backend named by argv[1] (see test_keras.py):
model.fit with DistributedOptimizer against one process training on the concatenated batches,
LossScaleOptimizer, fp16 compression, backward_passes_per_step, each callback, load_model."""
import os
import sys

os.environ["KERAS_BACKEND"] = sys.argv[1]
workdir = sys.argv[2]

from common import assert_close, assert_identical_on_all_ranks, fail, report  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

if sys.argv[1] == "tensorflow":
    import nezha.tensorflow.keras as hvd  # Horovod's import path
else:
    import nezha.keras as hvd
if sys.argv[1] == "torch":
    import torch
    torch.set_num_threads(1)

hvd.init()
n, me = hvd.size(), hvd.rank()
B, STEPS = 4, 4            # per-rank batch, steps per epoch
G = n * B                  # global batch
rng = np.random.default_rng(0)
X = rng.normal(size=(STEPS * G, 5)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int32") + (X[:, 2] > 1).astype("int32")
# Rank r's rows: its B-row slice of every global batch, in order.
mine = np.concatenate([np.arange(s * G + me * B, s * G + (me + 1) * B) for s in range(STEPS)])
Xr, Yr = X[mine], Y[mine]


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def compiled(model, optimizer):
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def reference(optimizer, epochs=2, batch=G):
    model = compiled(make_model(100), optimizer)
    model.fit(X, Y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
    return weights(model)


def distributed(optimizer, epochs=2, callbacks=()):
    # Each rank starts from different weights; the callback broadcasts rank 0's (= reference's).
    model = compiled(make_model(100 + me), optimizer)
    model.fit(Xr, Yr, batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks])
    return model


def check_fit(what, dist_opt, ref_opt, tol=1e-5, batch=G):
    model = distributed(dist_opt)
    got, exp = weights(model), reference(ref_opt, batch=batch)
    for i, (g, e) in enumerate(zip(got, exp)):
        assert_close(g, e, "%s weight %d" % (what, i), rtol=tol, atol=tol)
    assert_identical_on_all_ranks(got, what)
    return model


def sgd():
    return keras.optimizers.SGD(0.1, momentum=0.9)


check_fit("Adam", hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
          keras.optimizers.Adam(0.01))
report("fit equals one process")

lso = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd()))
if not isinstance(lso, keras.optimizers.LossScaleOptimizer):
    fail("DistributedOptimizer(LossScaleOptimizer) is not a LossScaleOptimizer")
check_fit("LossScaleOptimizer", lso, keras.optimizers.LossScaleOptimizer(sgd()))
report("loss scale optimizer")

check_fit("fp16 compression", hvd.DistributedOptimizer(sgd(), compression=hvd.Compression.fp16),
          sgd(), tol=2e-3)
report("fp16 compression")

check_fit("backward_passes_per_step", hvd.DistributedOptimizer(
    sgd(), backward_passes_per_step=2, average_aggregated_gradients=True), sgd(),
    batch=2 * G)
report("backward_passes_per_step")

# --- callbacks ---------------------------------------------------------------------------------


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.lrs, self.logs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


raw, averaged = Recorder(), Recorder()
warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2,
                                                  steps_per_epoch=STEPS)
distributed(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), epochs=3,
            callbacks=[warmup, raw, hvd.callbacks.MetricAverageCallback(), averaged])
# Horovod's warmup counts the batch being run (b + 1): its last batch, and every later one, run at
# initial_lr (tests/tf_workers/w_keras_lr.py checks the schedule in full).
expected_lrs = [0.1 / n * ((e + (b + 1) / STEPS) * (n - 1) / 2 + 1) if e < 2 else 0.1
                for e in range(3) for b in range(STEPS)]
assert_close(np.array(raw.lrs), np.array(expected_lrs), "warmup learning rate per batch",
             rtol=1e-6)
report("warmup learning rate")

every_raw = hvd.allgather_object([l["loss"] for l in raw.logs])
mean_raw = np.mean(np.array(every_raw, np.float64), axis=0)
assert_close(np.array([l["loss"] for l in averaged.logs]), mean_raw, "averaged loss", rtol=1e-6)
assert_identical_on_all_ranks([np.array([l["accuracy"] for l in averaged.logs])],
                              "averaged accuracy")
if n > 1 and len({tuple(r) for r in every_raw}) == 1:
    fail("raw losses are equal on every rank: the metric check would prove nothing")
report("metric average")

path = os.path.join(workdir, "best_%d.keras" % me)
model = distributed(hvd.DistributedOptimizer(sgd()), epochs=2,
                    callbacks=[hvd.callbacks.BestModelCheckpoint(monitor="loss", filepath=path)])
written = hvd.allgather_object(os.path.exists(path))
if written != [r == 0 for r in range(n)]:
    fail("checkpoint written by ranks %s; expected rank 0 only" % written)
report("best model checkpoint")

loaded = hvd.load_model(os.path.join(workdir, "best_0.keras"))
if not isinstance(loaded.optimizer, keras.optimizers.SGD) or \
        type(loaded.optimizer).__mro__[1].__name__ != "_DistributedOptimizer":
    fail("load_model did not wrap the optimizer: %r" % type(loaded.optimizer).__mro__)
plain = keras.models.load_model(os.path.join(workdir, "best_0.keras"))
assert_close(weights(loaded)[0], weights(plain)[0], "load_model weights")
loaded.fit(Xr, Yr, batch_size=B, epochs=1, shuffle=False, verbose=0)
assert_identical_on_all_ranks(weights(loaded), "loaded model after training")
report("load_model")

value = hvd.allreduce(keras.ops.ones((3,)) * (me + 1))
assert_close(np.asarray(keras.ops.convert_to_numpy(value)), np.full(3, (n + 1) / 2), "allreduce")
var = keras.Variable(np.full(2, float(me)))
hvd.broadcast_variables([var], root_rank=n - 1)
assert_close(np.asarray(var.numpy() if hasattr(var, "numpy") else var), np.full(2, n - 1.0),
             "broadcast_variables")
report("keras tensors")
