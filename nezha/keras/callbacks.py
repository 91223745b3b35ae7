"""Horovod's Keras callbacks for Keras 3 on every backend. They run between steps, outside traced
code, so they move values through numpy with nezha's collectives."""
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


def _set_lr(optimizer, lr):
    optimizer.learning_rate = lr


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to `initial_lr * multiplier` between start_epoch and end_epoch;
    `multiplier` is a number or a function of the (fractional, unless staircase) epoch.
    `momentum_correction` is accepted: Keras 3 compiles momentum as a constant, so it is not
    rescaled."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)

    def _in_range(self, epoch):
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust(self, epoch):
        _set_lr(self.model.optimizer, self.initial_lr * self.multiplier(epoch))

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None and not self.staircase:
            self.steps_per_epoch = self.params.get("steps")
            if self.steps_per_epoch is None:
                raise ValueError("steps_per_epoch is needed when staircase=False and Keras "
                                 "does not know the steps per epoch")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch
        if self.staircase and self._in_range(epoch):
            self._adjust(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.staircase or not self._in_range(self.current_epoch):
            return
        self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup: over `warmup_epochs` the rate grows from initial_lr / size to
    initial_lr, per batch: lr = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            n = nezha.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and nezha.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, self.initial_lr))


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
