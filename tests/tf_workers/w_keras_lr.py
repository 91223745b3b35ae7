"""nezha.keras' learning-rate callbacks on every rank, on the Keras backend named by argv[1] (see
test_keras.py): the rate of every batch against Horovod's formulas (transcribed below from
horovod/_keras/callbacks.py), and momentum correction, applied where the train step runs eagerly
(checked by the weights against numpy SGD) and refused with a warning where Keras compiles it."""
import os
import sys
import warnings

os.environ["KERAS_BACKEND"] = sys.argv[1]

from common import assert_close, fail, report  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import nezha.keras as hvd  # noqa: E402

BACKEND = sys.argv[1]
if BACKEND == "torch":
    import torch
    torch.set_num_threads(1)

hvd.init()
n, me = hvd.size(), hvd.rank()
B, STEPS, D = 2, 6, 3      # per-rank batch, steps per epoch, features
rng = np.random.default_rng(7)
X_ALL = rng.normal(size=(n, STEPS * B, D)).astype("float32")   # [rank] -> that rank's rows
Y_ALL = rng.normal(size=(n, STEPS * B, 1)).astype("float32")
W0 = np.array([[0.5], [-0.25], [1.0]], "float32")


def horovod_warmup_lr(initial_lr, warmup_epochs, size, steps, epoch, batch):
    """The rate Horovod sets at (epoch, batch) of a warmup, or None where it sets none."""
    if epoch >= warmup_epochs:
        return None
    e = epoch + float(batch) / steps        # LearningRateScheduleCallbackImpl.on_batch_begin
    e += 1. / steps                         # LearningRateWarmupCallbackImpl's multiplier
    return initial_lr * (1. / size * (e * (size - 1) / warmup_epochs + 1))


def horovod_schedule(initial_lr, lr0, epochs, steps, rate):
    """Rates per batch from a schedule `rate(epoch, batch)` (None: unchanged) starting at lr0."""
    out, lr = [], lr0
    for e in range(epochs):
        for b in range(steps):
            new = rate(e, b)
            lr = lr if new is None else new
            out.append(lr)
    return out


class Recorder(keras.callbacks.Callback):
    """Placed after the schedule: what the optimizer holds when each batch runs."""

    def __init__(self):
        super().__init__()
        self.lrs, self.momenta, self.logged = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.lrs.append(float(np.asarray(keras.ops.convert_to_numpy(opt.learning_rate))))
        self.momenta.append(getattr(opt, "momentum", None))

    def on_epoch_end(self, epoch, logs=None):
        self.logged.append((logs or {}).get("lr"))


def linear_model(optimizer, run_eagerly=False):
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([W0])
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(),
                  run_eagerly=run_eagerly)
    return model


def fit(model, epochs, callbacks):
    recorder = Recorder()
    model.fit(X_ALL[me], Y_ALL[me], batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[*callbacks, recorder])
    return recorder


def numpy_sgd(lrs, momenta):
    """Keras' SGD on the global batches (every rank's rows of a step; DistributedOptimizer
    averages the ranks' MSE gradients), in float64."""
    w, m = W0.astype(np.float64), np.zeros_like(W0, np.float64)
    for step, (lr, mom) in enumerate(zip(lrs, momenta)):
        s = step % STEPS
        x = X_ALL[:, s * B:(s + 1) * B].reshape(-1, D).astype(np.float64)
        y = Y_ALL[:, s * B:(s + 1) * B].reshape(-1, 1).astype(np.float64)
        grad = 2.0 / len(x) * x.T @ (x @ w - y)
        m = m * mom - grad * lr
        w = w + m
    return w


# --- warmup: Horovod's rate at every batch ------------------------------------------------------
EPOCHS, WARMUP = 3, 2
model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
rec = fit(model, EPOCHS, [hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1,
                                                                   warmup_epochs=WARMUP)])
expected = horovod_schedule(0.1, 0.1, EPOCHS, STEPS, lambda e, b: horovod_warmup_lr(
    0.1, WARMUP, n, STEPS, e, b))
assert_close(rec.lrs, expected, "warmup rate per batch (steps per epoch from Keras)", rtol=1e-6,
             atol=0)
if rec.lrs[WARMUP * STEPS - 1] != np.float32(0.1) or set(rec.lrs[WARMUP * STEPS:]) != {
        float(np.float32(0.1))}:
    fail("the last warmup batch and those after it ran at %s, not initial_lr"
         % rec.lrs[WARMUP * STEPS - 1:])
assert_close(rec.logged, [expected[(e + 1) * STEPS - 1] for e in range(EPOCHS)],
             "logs['lr'] at each epoch's end", rtol=1e-6, atol=0)
assert_close(np.asarray(model.get_weights()[0]), numpy_sgd(expected, [0.0] * len(expected)),
             "weights trained with the warmup rates", rtol=1e-4, atol=1e-6)
report("warmup rate per batch")

# --- LearningRateScheduleCallback: constant multiplier (exponential), function, staircase -------
model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)))
rec = fit(model, 4, [hvd.callbacks.LearningRateScheduleCallback(
    initial_lr=0.2, multiplier=0.5, start_epoch=1, end_epoch=3, staircase=True)])
expected = horovod_schedule(0.2, 0.05, 4, STEPS, lambda e, b: (
    0.2 * 0.5 ** (e - 1) if 1 <= e < 3 and b == 0 else None))
assert_close(rec.lrs, expected, "staircase schedule, constant multiplier", rtol=1e-6, atol=0)

model = linear_model(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)))
rec = fit(model, 3, [hvd.callbacks.LearningRateScheduleCallback(
    initial_lr=0.2, multiplier=lambda epoch: 1.0 / (1.0 + epoch), end_epoch=2, staircase=False,
    steps_per_epoch=STEPS)])
expected = horovod_schedule(0.2, 0.05, 3, STEPS, lambda e, b: (
    0.2 / (1.0 + e + float(b) / STEPS) if e < 2 else None))
assert_close(rec.lrs, expected, "per-batch schedule, multiplier function", rtol=1e-6, atol=0)
report("schedule callback")

# --- momentum correction -----------------------------------------------------------------------
# Horovod: momentum * new_lr / old_lr for each batch whose rate the callback sets, restored after.
lrs = horovod_schedule(0.1, 0.1, EPOCHS, STEPS, lambda e, b: horovod_warmup_lr(
    0.1, WARMUP, n, STEPS, e, b))
stored = [float(np.float32(v)) for v in [0.1] + lrs]     # the rate variable is float32
corrected = [0.9 * lrs[i] / stored[i] if i < WARMUP * STEPS else 0.9 for i in range(len(lrs))]


def momentum_run(run_eagerly):
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model = linear_model(optimizer, run_eagerly=run_eagerly)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = fit(model, EPOCHS, [hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=0.1, warmup_epochs=WARMUP, momentum_correction=True)])
    said = [w for w in caught if "momentum_correction" in str(w.message)]
    if optimizer.momentum != 0.9:
        fail("momentum after training is %r, not the optimizer's 0.9" % optimizer.momentum)
    return model, rec, said


# Keras on torch steps eagerly by default; on TensorFlow and JAX only with run_eagerly=True.
model, rec, said = momentum_run(run_eagerly=BACKEND != "torch")
if said:
    fail("warned about momentum correction where it applies: %s" % said[0].message)
assert_close(rec.momenta, corrected, "corrected momentum per batch", rtol=1e-6, atol=0)
assert_close(np.asarray(model.get_weights()[0]), numpy_sgd(lrs, corrected),
             "weights trained with corrected momentum", rtol=1e-4, atol=1e-6)
report("momentum correction where the step runs eagerly")

if BACKEND == "torch":
    # torch.compile on this CPU is slow; the callback's decision is what is checked.
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model = linear_model(optimizer)
    model.jit_compile = True
    callback = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=WARMUP,
                                                        steps_per_epoch=STEPS)
    callback.set_model(model)
    callback.set_params({"epochs": EPOCHS, "steps": STEPS, "verbose": 0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.on_train_begin()
        callback.on_epoch_begin(0)
        callback.on_train_batch_begin(0)
    said = [w for w in caught if "momentum_correction" in str(w.message)]
    if len(said) != 1 or optimizer.momentum != 0.9:
        fail("jit_compile=True: %d warnings, momentum %r" % (len(said), optimizer.momentum))
else:
    model, rec, said = momentum_run(run_eagerly=False)
    if len(said) != 1:
        fail("compiled step: %d momentum_correction warnings, expected 1" % len(said))
    assert_close(rec.momenta, [0.9] * len(lrs), "momentum left alone in a compiled step")
    assert_close(np.asarray(model.get_weights()[0]), numpy_sgd(lrs, [0.9] * len(lrs)),
                 "weights trained in a compiled step", rtol=1e-4, atol=1e-6)
report("momentum correction refused where the step is compiled")
