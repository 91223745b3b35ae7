"""Horovod's Keras callbacks for Keras 3 on every backend. They run between steps, outside traced
code, so they move values through numpy with nezha's collectives."""
import warnings

import keras
import numpy as np

import nezha
from nezha.handle import Handle
from nezha.keras._backend import to_numpy


def broadcast_keras_variables(variables, root_rank, name="variables"):
    """Assigns root_rank's values to every Keras variable in `variables` (one submission each,
    all submitted before any is waited for)."""
    variables = list(variables)
    handles = [nezha.broadcast_async(np.ascontiguousarray(to_numpy(v.value)), root_rank,
                                     name="broadcast.%s.%d" % (name, i))
               for i, v in enumerate(variables)]
    for v, value in zip(variables, Handle.gather(handles).wait()):
        v.assign(np.reshape(value, v.shape))


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts root_rank's model variables when training begins, and the optimizer's (created
    by its first step) after the first batch, so every rank starts from the same state."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        broadcast_keras_variables(self.model.variables, self.root_rank, "model_variables")

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        broadcast_keras_variables(self.model.variables, self.root_rank, "model_variables.1")
        if self.model.optimizer is not None:
            optimizer = self.model.optimizer
            local = {id(v) for v in getattr(optimizer, "local_variables", ())}
            broadcast_keras_variables([v for v in optimizer.variables if id(v) not in local],
                                      self.root_rank, "optimizer_variables")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, replaces every metric in `logs` by its average over the ranks (place
    it before callbacks that read metrics, as in Horovod)."""

    def __init__(self, device=''):
        super().__init__()
        self._epochs = 0

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(to_numpy(v)) == 0)
        values = np.array([float(to_numpy(logs[k])) for k in names], np.float64)
        averaged = nezha.allreduce(values, name="MetricAverageCallback.%d" % self._epochs)
        self._epochs += 1
        for k, v in zip(names, averaged):
            logs[k] = float(v)


def _current_lr(optimizer):
    return float(np.asarray(keras.ops.convert_to_numpy(optimizer.learning_rate)))


def _steps_in_compiled_code(model):
    """True when Keras traces the train step (tf.function, jax.jit, torch.compile): Python
    attributes the optimizer reads in it, such as `momentum`, are then fixed at trace time."""
    if model.run_eagerly:
        return False
    return keras.backend.backend() != "torch" or bool(model.jit_compile)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's schedule: from `start_epoch` until `end_epoch` the learning rate is
    `initial_lr * multiplier(epoch)`, set at the first batch of each epoch (`staircase`) or at
    every batch with the fractional epoch `epoch + batch / steps_per_epoch`. A constant
    `multiplier` m means `m ** (epoch - start_epoch)` (exponential decay). Outside that range the
    rate is left where it is.

    `momentum_correction` (Horovod's, from Goyal et al.): for each batch whose rate it changes,
    the optimizer's `momentum` is multiplied by new_lr / old_lr and restored after the batch. Keras
    3 optimizers read `momentum` as a Python number when the train step is traced, so the
    correction is applied where the step runs eagerly (the torch backend without jit_compile, or
    `run_eagerly=True`); where the step is compiled it could not take effect, and the callback
    warns once and leaves momentum alone."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.restore_momentum = None
        self._corrects_momentum = False
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify the "
                         "steps_per_epoch parameter to the %s()." % type(self).__name__)

    def _momentum_to_correct(self, optimizer):
        momentum = getattr(optimizer, "momentum", None)
        if not self.momentum_correction or isinstance(momentum, bool) or \
                not isinstance(momentum, (int, float)) or momentum == 0:
            return False
        if _steps_in_compiled_code(self.model):
            warnings.warn(
                "%s(momentum_correction=True): Keras compiles the train step with the optimizer's "
                "momentum (%g) as a constant, so it cannot be corrected per batch; momentum is "
                "left unchanged. Pass momentum_correction=False to silence this, or compile the "
                "model with run_eagerly=True to have it corrected." % (type(self).__name__,
                                                                        momentum),
                stacklevel=2)
            return False
        return True

    def _adjust(self, epoch):
        optimizer = self.model.optimizer
        old_lr = _current_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self._corrects_momentum and old_lr != 0:
            self.restore_momentum = optimizer.momentum
            optimizer.momentum = self.restore_momentum * new_lr / old_lr

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()
        self._corrects_momentum = self._momentum_to_correct(self.model.optimizer)

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or \
                (self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _current_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup: over `warmup_epochs` the rate grows per batch from about
    initial_lr / size to initial_lr. With e = epoch + (batch + 1) / steps_per_epoch (Horovod adds
    one batch so that the last batch of the warmup runs at exactly initial_lr):
    lr = initial_lr / size * (e * (size - 1) / warmup_epochs + 1). After the warmup the rate stays
    at initial_lr."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            n = nezha.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and nezha.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, _current_lr(self.model.optimizer)))


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keeps the best model by `monitor`, written by rank 0 only (Horovod's arguments; `filepath`
    is Keras 3's and must end in .keras, or .weights.h5)."""

    def __init__(self, monitor='val_loss', verbose=0, mode='auto', save_freq='epoch',
                 filepath=None):
        if filepath is None:
            raise ValueError("BestModelCheckpoint needs filepath= (a .keras file)")
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=False, mode=mode,
                         save_freq=save_freq)

    def on_train_batch_end(self, batch, logs=None):
        if nezha.rank() == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if nezha.rank() == 0:
            super().on_epoch_end(epoch, logs)
