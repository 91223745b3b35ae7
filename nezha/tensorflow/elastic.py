"""Horovod's elastic API (`hvd.elastic`) for TensorFlow: nezha.elastic's state, plus TensorFlow
variables. Ranks are never added or replaced (see nezha.elastic)."""
import tensorflow as tf

from nezha.elastic import ElasticSampler, ObjectState, run
from nezha.tensorflow.functions import broadcast_variables


class TensorFlowState(ObjectState):
    """`ObjectState` plus TensorFlow variables (eager): rank 0's values on `sync()`, copies kept
    by `sync()`, `save()` and `commit()` and assigned back by `restore()`."""

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None or not tf.executing_eagerly():
            raise NotImplementedError("TensorFlowState keeps variables in eager mode only (TF1 "
                                      "sessions are not supported)")
        self._variables = list(variables or [])
        self._saved_values = []
        super().__init__(**kwargs)

    def save(self):
        self._saved_values = [v.numpy().copy() for v in self._variables]
        super().save()

    def restore(self):
        for v, value in zip(self._variables, self._saved_values):
            v.assign(value)
        super().restore()

    def sync(self):
        if self._variables:
            broadcast_variables(self._variables, root_rank=0)
        self._saved_values = [v.numpy().copy() for v in self._variables]  # as Horovod's sync
        super().sync()


__all__ = ["ElasticSampler", "ObjectState", "TensorFlowState", "run"]
